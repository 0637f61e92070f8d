"""What of a worker's request goes upstream, and what of the answer comes back: the
URL, the headers without hop-by-hop ones and without the worker's token, the real key
in the style's header, and where a worker may have put its token.

A worker's headers go upstream as they came (its client's version headers, betas,
session ids), except: hop-by-hop headers (RFC 9110 7.6.1, and those ``Connection``
lists), ``host`` and ``content-length`` (the client session sets its own), every
header a token may ride in, and ``accept-encoding``, which becomes ``identity`` so
usage can be read on the way.  The query loses ``key`` (Gemini's token) and keeps the
rest byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from urllib.parse import unquote

from ..spec.apis import FACTS, Style

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# What a server may take for a path's separator once it decodes the path.
_SLASHES = re.compile(r"[/\\]")
TOKEN_HEADERS = frozenset({"x-api-key", "authorization", "x-goog-api-key"})
_NOT_UPSTREAM = HOP_BY_HOP | TOKEN_HEADERS | {"host", "content-length", "accept-encoding"}
# The client session decompresses whatever the upstream sends despite "identity".
_NOT_DOWNSTREAM = HOP_BY_HOP | {"content-length", "content-encoding"}


def tokens_offered(headers: Mapping[str, str], query: str) -> list[str]:
    """Every place a worker's client may carry its key, in the order they are tried:
    ``x-api-key`` (Anthropic), ``Authorization: Bearer`` (OpenAI, and Anthropic's
    ANTHROPIC_AUTH_TOKEN), ``x-goog-api-key`` and ``?key=`` (Gemini)."""
    bearer = headers.get("authorization", "")
    found = [
        headers.get("x-api-key", ""),
        bearer[7:].strip() if bearer[:7].lower() == "bearer " else "",
        headers.get("x-goog-api-key", ""),
    ]
    found += [unquote(part[4:]) for part in query.split("&") if part.startswith("key=")]
    return [token for token in found if token]


def within(rest: str) -> str | None:
    """``rest`` (the path after the API's name, as sent) with its dot segments removed
    (RFC 3986 5.2.4), a segment counting as one once percent-decoded (``%2e%2e`` is
    ``..``); None if it would leave the upstream's path: a ``..`` that climbs above it,
    or a dot segment behind an encoded or a back slash (``..%2f``, ``..\\``), which
    some servers decode before they resolve.  The real key goes with the request, so
    what the upstream resolves must stay under the path the job named."""
    kept: list[str] = []
    segments = rest.split("/")
    for index, segment in enumerate(segments):
        decoded = unquote(segment)
        parts = _SLASHES.split(decoded)
        if len(parts) > 1 and any(part in (".", "..") for part in parts):
            return None
        if decoded not in (".", ".."):
            kept.append(segment)
            continue
        if decoded == "..":
            if not kept:
                return None
            kept.pop()
        if index == len(segments) - 1:
            kept.append("")  # "a/b/.." is "a/", as a resolver makes it
    return "/".join(kept)


def upstream_url(upstream: str, rest: str, query: str) -> str:
    """``rest`` (the path after the API's name, as the worker sent it) under the
    upstream's own path, with the query less any ``key``."""
    kept = "&".join(p for p in query.split("&") if p and p.split("=", 1)[0] != "key")
    return f"{upstream.rstrip('/')}/{rest}" + (f"?{kept}" if kept else "")


def _kept(items: Sequence[tuple[str, str]], dropped: frozenset[str]) -> list[tuple[str, str]]:
    listed = {
        name.strip().lower()
        for header, value in items
        if header.lower() == "connection"
        for name in value.split(",")
    }
    return [(n, v) for n, v in items if n.lower() not in dropped and n.lower() not in listed]


def upstream_headers(
    items: Sequence[tuple[str, str]], style: Style, key: str
) -> list[tuple[str, str]]:
    """The headers to send upstream: ``items`` (the worker's, repeated ones kept) less
    what must not pass, plus identity encoding and the real key (none if ``key`` is
    empty)."""
    sent = _kept(items, _NOT_UPSTREAM)
    sent.append(("accept-encoding", "identity"))
    if key:
        facts = FACTS[style]
        sent.append((facts.key_header, facts.key_prefix + key))
    return sent


def downstream_headers(items: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The upstream's answer headers to give the worker."""
    return _kept(items, _NOT_DOWNSTREAM)
