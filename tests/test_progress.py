"""The console display, rendered from a recorded event list (what users read)."""

from __future__ import annotations

import re
from io import StringIO
from typing import Any

from rich.console import Console

from fanout.progress import Display

ESC = "\x1b"
HOSTILE = "\x1b[2J\x1b]0;pwned\x07[bold red]x[/] :smile:\u202egnp.exe"

# Events as a run emits them, for units whose ids and output a backlog chose.
EVENTS: list[dict[str, Any]] = [
    {"event": "run.started", "run": "r1", "job": "hostile"},
    {"event": "round.started", "round": 1},
    {"event": "round.selected", "round": 1, "units": 2, "records": 2},
    {"event": "attempt.started", "round": 1, "unit": HOSTILE, "attempt": 1, "rung": "default"},
    {
        "event": "attempt.finished",
        "round": 1,
        "unit": HOSTILE,
        "attempt": 1,
        "rung": "default",
        "status": "failed",
        "reason": "exit 1\r\n12:00:00 all units succeeded",
        "duration": 1.0,
        "host": "local",
    },
    {
        "event": "unit.settled",
        "round": 1,
        "unit": HOSTILE,
        "state": "failed",
        "rung": "default",
        "attempts": 1,
        "reason": "exit 1 \x1b[1A\x1b[2K[green]ok[/green]",
    },
    {"event": "file.conflict", "round": 1, "unit": "# u2", "path": "a\x1b[8m.txt"},
    {"event": "run.finished", "note": ""},
]

EXPECTED = [
    "run r1 of hostile started",
    "round 1: selecting units",
    "round 1: 2 unit(s) from 2 record(s)",
    "\\x1b[2J\\x1b]0;pwned\\x07[bold red]x[/] :smile:\\u202egnp.exe: attempt 1 (default) failed"
    " in 1.0s: exit 1\\r\\n12:00:00 all units succeeded",
    "FAILED \\x1b[2J\\x1b]0;pwned\\x07[bold red]x[/] :smile:\\u202egnp.exe after 1 attempt(s),"
    " rung default: exit 1 \\x1b[1A\\x1b[2K[green]ok[/green]",
    "conflict: a\\x1b[8m.txt changed in the workspace since # u2 staged it",
]


def _lines(output: str) -> list[str]:
    """The lines without their time stamps."""
    return [re.sub(r"^\d\d:\d\d:\d\d ", "", line) for line in output.splitlines()]


def test_plain_lines_show_hostile_ids_and_reasons_as_text() -> None:
    out = StringIO()
    display = Display(Console(file=out, record=True), live=False)
    for event in EVENTS:
        display(event)
    assert ESC not in out.getvalue()
    assert _lines(out.getvalue()) == EXPECTED


def test_a_terminal_gets_no_escape_sequence_and_no_markup_from_a_unit() -> None:
    out = StringIO()
    console = Console(file=out, record=True, force_terminal=True, width=400)
    display = Display(console, live=False)
    for event in EVENTS:
        display(event)
    # Only rich's own colours reach the terminal.
    assert ESC not in re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())
    assert _lines(console.export_text()) == EXPECTED


def test_the_live_display_gets_no_escape_sequence_from_a_unit() -> None:
    out = StringIO()
    console = Console(file=out, force_terminal=True, width=400)
    with Display(console, live=True) as display:
        for event in EVENTS:
            display(event)
    # Rich's colours and the moves that redraw the live line, and nothing else.
    rich_own = r"\x1b\[[0-9;]*m|\x1b\[\?25[lh]|\r\x1b\[2K|\r\x1b\[1A\x1b\[2K$"
    assert ESC not in re.sub(rich_own, "", out.getvalue())
    assert EXPECTED[3] in out.getvalue()
