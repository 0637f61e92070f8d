"""Text from units and workers (ids, reasons, output, paths) made safe to show: on a
terminal, and in ``report.md``, which is pasted into pull request comments.

Neither a unit id nor a worker's output is fanout's to trust.  On a terminal an ESC
sequence clears the screen, moves the cursor over earlier lines or retitles the window;
in markdown a run of backticks closes the fence around an output tail, and what follows
renders as headings and links of the report's own.

- Invisible and control characters are replaced by visible escapes (``\\x1b``,
  ``\\u202e``), never dropped, so a reader sees that something was there: C0 controls
  (tab and newline are kept only inside output blocks), DEL, C1 controls, the
  bidirectional overrides, isolates and marks (U+202A..U+202E, U+2066..U+2069, U+200E,
  U+200F, U+061C), the line and paragraph separators (U+2028, U+2029) and lone
  surrogates (a file name's undecodable byte, which no UTF-8 file could even hold).
- ``for_markdown``: inline markdown text.  ``&``, ``<`` and ``>`` become entities, and a
  backslash goes before every character that can start markup inline (emphasis, code,
  links, strikethrough, math, headings, table cells).
- ``for_html``: text inside a raw HTML block (GitHub shows ``<details>`` lines as HTML,
  without markdown), where only entities are needed.
- ``code``: code text inside a table cell, as ``<code>`` with escaped markdown inside: a
  backtick code span cannot hold a pipe next to a backslash in a GFM table cell.
- ``code_fence``: an output block fenced by more backticks than the longest run in it
  (CommonMark: a fence closes only on a run at least as long as the opening one).
- ``shorten`` and ``one_line``: text cut to a size its place holds (a reason, a detail,
  a line of ``fanout status``), ending in an ellipsis where it was cut; ``one_line``
  first makes every run of whitespace, newlines included, one space.

Left as they are: ``@name`` and bare URLs in reasons (GitHub links them from the
rendered text, which escaping cannot reach; ids are in ``<code>``, where it does not).
"""

from __future__ import annotations

import html
import re

_INVISIBLE = (
    "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029"
    "\u202a-\u202e\u2066-\u2069\ud800-\udfff"
)
_BLOCK = re.compile(f"[{_INVISIBLE}]")
_LINE = re.compile(f"[\t\n{_INVISIBLE}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
_MARKUP = re.compile(r"([\\`*_\[\]|~#$])")
_BACKTICKS = re.compile(r"`+")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, *, multiline: bool = False) -> str:
    """``text`` with control and invisible characters as visible escapes; newlines and
    tabs are kept when ``multiline``."""
    return (_BLOCK if multiline else _LINE).sub(_escape, text)


def for_terminal(text: str) -> str:
    """One line of ``text`` that a terminal prints as it reads, and nothing else."""
    return visible(text)


def for_markdown(text: str) -> str:
    """``text`` as literal inline markdown on one line."""
    escaped = html.escape(visible(text), quote=False)
    return _MARKUP.sub(r"\\\1", escaped)


def for_html(text: str) -> str:
    """``text`` as literal text on one line inside raw HTML."""
    return html.escape(visible(text), quote=True)


def code(text: str) -> str:
    """``text`` as inline code that is safe in a GFM table cell, too."""
    return f"<code>{for_markdown(text)}</code>"


def code_fence(text: str) -> str:
    """``text`` as a fenced code block no line of it can close."""
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{visible(text, multiline=True)}\n{fence}"


def shorten(text: str, limit: int, *, ellipsis: str = "…") -> str:
    """``text`` if it has at most ``limit`` characters, else its start and ``ellipsis``,
    ``limit`` characters in all."""
    return text if len(text) <= limit else text[: limit - len(ellipsis)] + ellipsis


def one_line(text: str, limit: int, *, ellipsis: str = "…") -> str:
    """``text`` on one line (each run of whitespace one space), shortened to ``limit``."""
    return shorten(" ".join(text.split()), limit, ellipsis=ellipsis)
