"""What ``[publish]`` must satisfy beyond the schema: the variables each of its
templates sees (``roots``), a branch written without a template that git accepts as a
branch name, and a base that is not the branch itself.  A branch that is a template is
checked when it is rendered, by git (``git check-ref-format``), at the run's end."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...errors import Problem
from ...values.tomlpos import KeyPath
from ..templates import Shape, is_template
from .context import Context, table_of

# What the run's templates read of the run (``publish.Publisher`` fills it).
RUN_SHAPE: dict[str, Shape] = {"id": None, "units": None, "files": None, "counts": None}
_UNIT_SHAPE: dict[str, Shape] = {"id": None, "files": None}
_COMMAND: dict[str, Shape] = {
    "run": RUN_SHAPE,
    "branch": None,
    "base": None,
    "remote": None,
    "title": None,
    "body_file": None,
}
# Beyond job and trigger, which every [publish] template sees.
_ROOTS: dict[str, dict[str, Shape]] = {
    "branch": {},
    "message": {"run": RUN_SHAPE},
    "unitMessage": {"run": RUN_SHAPE, "unit": _UNIT_SHAPE},
    "title": {"run": RUN_SHAPE, "branch": None, "base": None},
    "pr": _COMMAND,
    "update": _COMMAND,
}

# git check-ref-format's rules for a branch, as far as a literal name can break them:
# no control characters, space, ~ ^ : ? * [ \, no "..", "@{", "//", no component that
# starts with "." or ends with ".lock", no leading "-" or "/", no trailing "/" or ".".
_BAD_REF = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//|^[-/]|/\.|^\.|\.lock(/|$)|[/.]$")


def roots(path: KeyPath) -> dict[str, Shape]:
    """The variables (beyond job and trigger) of the [publish] template at ``path``."""
    return _ROOTS.get(str(path[1]), {}) if len(path) > 1 else {}


def check_publish(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    if not isinstance(doc.get("publish"), dict):
        return []
    publish = table_of(doc, "publish")
    problems = []
    branch = publish.get("branch")
    if isinstance(branch, str) and not is_template(branch) and _BAD_REF.search(branch):
        problems.append(
            ctx.at_value(
                ("publish", "branch"),
                f"{branch!r} is not a branch name git accepts (no spaces, '..', '~', '^',"
                " ':', '?', '*', '[' or '\\', no leading '-', no trailing '/' or '.')",
            )
        )
    base = publish.get("base")
    if isinstance(base, str) and base == branch:
        problems.append(
            ctx.at_value(
                ("publish", "base"),
                f"{base!r} is also publish.branch: the pull request would merge the branch"
                " into itself; name the branch it goes to (main)",
            )
        )
    return problems
