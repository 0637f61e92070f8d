"""report.html: one self-contained page per run.  The run's data is one JSON element
(``data.to_json``: no ``<`` in it), the app one inline script and its style one inline
style, both allowed by their sha256 in a Content-Security-Policy that allows nothing
else: no other script, no network, no form, no base."""

from __future__ import annotations

import base64
import hashlib
from functools import cache
from importlib import resources
from typing import Any

from . import data as page_data

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{policy}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>fanout run</title>
<style>{style}</style>
</head>
<body>
<h1 id="title">fanout run</h1>
<nav><a href="#">units</a><a href="#timeline-box">timeline</a>
<a href="#distributions">distributions</a></nav>
<section id="overview">
<div id="summary"></div>
<h2>Units</h2>
<div class="controls">
<label>state <select id="filter-state"></select></label>
<label>rung <select id="filter-rung"></select></label>
<label>host <select id="filter-host"></select></label>
<label>round <select id="filter-round"></select></label>
<label>search <input id="search" type="search" placeholder="unit id or reason"></label>
</div>
<table id="units">
<thead><tr><th data-sort="unit">unit</th><th data-sort="state">state</th>
<th data-sort="rung">rung</th><th data-sort="host">host</th><th data-sort="round">round</th>
<th data-sort="attempts">attempts</th><th data-sort="seconds">duration</th>
<th data-sort="cost">cost</th><th data-sort="reason">reason</th></tr></thead>
<tbody></tbody>
</table>
<p id="more" class="note"></p>
<h2>Timeline</h2>
<div id="timeline-box"></div>
<h2>Distributions</h2>
<div id="distributions"></div>
</section>
<section id="unit" hidden></section>
<script type="application/json" id="fanout-data">{data}</script>
<script>{script}</script>
</body>
</html>
"""


@cache
def asset(name: str) -> str:
    """``app.js`` or ``app.css``, shipped beside this module."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def digest(text: str) -> str:
    """A CSP source for an inline element whose text is exactly ``text``."""
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode()


def policy(*, connect: str = "'none'") -> str:
    """The page's Content-Security-Policy; ``--serve`` sends it with ``connect-src
    'self'`` so the page can fetch ``/data.json``."""
    return (
        f"default-src 'none'; script-src '{digest(asset('app.js'))}';"
        f" style-src '{digest(asset('app.css'))}'; img-src data:; connect-src {connect};"
        " base-uri 'none'; form-action 'none'"
    )


def render(data: dict[str, Any], *, connect: str = "'none'") -> str:
    """The whole page for ``data`` (``data.build``)."""
    return _TEMPLATE.format(
        policy=policy(connect=connect),
        style=asset("app.css"),
        data=page_data.to_json(data),
        script=asset("app.js"),
    )
