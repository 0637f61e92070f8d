"""The console display, rendered from a recorded event list (what users read)."""

from __future__ import annotations

import asyncio
import json
import random
import re
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.text import Text
from test_gateway_run import KEY, WORKER

from fanout import spec
from fanout.attempt.model import Attempt
from fanout.events import Events
from fanout.journal import Journal
from fanout.outcome import AttemptResult, Status
from fanout.pacing import limits
from fanout.progress import Display
from fanout.run import selection
from fanout.run.job import Options, Runner
from fanout.transports.ssh import SshTransport

from fakes import FakeTransport
from helpers import cli, make_runner, write_job

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
    rich_own = r"\x1b\[[0-9;]*m|\x1b\[\?25[lh]|\r?(\x1b\[1A|\x1b\[2K)+"
    assert ESC not in re.sub(rich_own, "", out.getvalue())
    assert EXPECTED[3] in out.getvalue()


# Golden renderings of runs: the events come from real runs on a fake transport and
# virtual time (each recorded with the loop's clock), replayed into a display whose clock
# reads the recorded time, so a dispatcher that stops emitting what the display needs
# changes what users read here.

Recorded = list[tuple[float, dict[str, Any]]]


def _job(tmp_path: Path, items: int, concurrency: int, extra: str = "") -> spec.Spec:
    names = ", ".join(f'"u{n:03d}"' for n in range(items))
    return spec.load(
        write_job(
            tmp_path,
            f"""
version = 1
name = "sweep"
[inputs]
items = [{names}]
[task]
command = ["agent"]
[runtime]
maxConcurrentTasks = {concurrency}
[retry]
backoff = {{ initial = "10s", max = "1m", jitter = "none" }}
[[retry.ladder]]
name = "default"
attempts = 2
{extra}
""",
        )
    )


LIMIT = """
[[limits]]
name = "api"
requests = 120
per = "1m"
"""


def _fails_u003(attempt: Attempt) -> AttemptResult:
    if attempt.unit_id == "u003":
        return AttemptResult(status=Status.FAILED, reason="exit 1", exit_code=1, duration=1.0)
    return AttemptResult(status=Status.SUCCEEDED, reason="ok", exit_code=0, duration=1.0)


def _runner(job: spec.Spec, transport: Any, recorded: Recorded, journal: Journal) -> Runner:
    loop = asyncio.get_running_loop()
    events = Events(lambda event: recorded.append((loop.time(), event)))
    return make_runner(
        job,
        transport,
        journal=journal,
        events=events,
        gate=limits.gate_for(job, events, random.Random(7)),
        rng=random.Random(7),
    )


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _shown(display: Display, width: int) -> list[str]:
    """The live display's lines, as a terminal ``width`` wide shows them."""
    console = Console(file=StringIO(), record=True, force_terminal=True, width=width)
    console.print(display.progress.get_renderable())
    return [line.rstrip() for line in console.export_text().splitlines()]


def _live_transcript(recorded: Recorded, moments: list[float], width: int = 160) -> list[str]:
    """What a terminal shows: the lines printed above the live display, and the live
    display itself (marked ``|``) as it stands after the last event at each moment."""
    console = Console(file=StringIO(), record=True, force_terminal=True, width=width)
    clock = _Clock()
    start = recorded[0][0]
    display = Display(console, live=True, clock=clock)
    pending = sorted(moments)
    for n, (at, event) in enumerate(recorded):
        clock.now = at - start
        display(event)
        following = recorded[n + 1][0] - start if n + 1 < len(recorded) else float("inf")
        while pending and clock.now <= pending[0] < following:
            clock.now = pending.pop(0)
            for line in _shown(display, width):
                console.print(Text("| " + line), highlight=False, soft_wrap=True)
    return _lines(console.export_text())


def _plain_transcript(recorded: Recorded) -> list[str]:
    out = StringIO()
    clock = _Clock()
    start = recorded[0][0]
    display = Display(Console(file=out), live=False, clock=clock)
    for at, event in recorded:
        clock.now = at - start
        display(event)
    return _lines(out.getvalue())


async def _interrupted_then_resumed(tmp_path: Path, items: int, settled: int) -> Recorded:
    """The events of a run resumed after the first stretch was interrupted (as by Ctrl-C)
    once ``settled`` units had settled."""
    job = _job(tmp_path, items, 4)
    journal = Journal(job.runtime.state_dir / "journal.sqlite")
    first: Recorded = []
    runner = _runner(job, FakeTransport(script=_fails_u003), first, journal)
    task = asyncio.create_task(runner.execute(Options()))

    def interrupt(event: dict[str, Any]) -> None:
        if event["event"] == "unit.settled":
            count = sum(1 for _, e in first if e["event"] == "unit.settled")
            if count == settled:
                task.cancel()

    runner.events.add(interrupt)
    with pytest.raises(asyncio.CancelledError):
        await task
    resumed: Recorded = []
    transport = FakeTransport(script=_fails_u003)
    await _runner(job, transport, resumed, journal).execute(Options(resume=True))
    return resumed


class _Fleet(FakeTransport):
    """A fake pool of SSH hosts that emits what ``SshTransport`` emits (``host.up`` at
    start and when a host is back, ``attempt.placed``, ``host.quarantined`` then
    ``host.lost`` for a host that refuses units, ``host.lost``), placing each attempt on
    the least loaded host that is up.  h3 refuses its first unit; h2 is lost at 3.5 s
    (its attempts end lost at once) and back at 9 s."""

    def __init__(self, events: Events) -> None:
        super().__init__(delay=1.0)
        self.events = events
        self.slots_of = {"h1": 2, "h2": 2, "h3": 1}
        self.busy = dict.fromkeys(self.slots_of, 0)
        self.up = dict.fromkeys(self.slots_of, True)
        self.gone: dict[str, asyncio.Event] = {h: asyncio.Event() for h in self.slots_of}
        self.changed = asyncio.Condition()
        self.saboteur: asyncio.Task[None] | None = None

    @property
    def capacity(self) -> int:
        return sum(self.slots_of.values())

    async def start(self) -> None:
        for host, slots in self.slots_of.items():
            self.events.emit("host.up", host=host, slots=slots, sandbox="bwrap", back=False)
        self.saboteur = asyncio.create_task(self._sabotage())

    async def close(self) -> None:
        if self.saboteur is not None:
            self.saboteur.cancel()

    async def _sabotage(self) -> None:
        await asyncio.sleep(3.5)
        await self._down("h2", "lost", "connection lost: keepalive timeout")
        await asyncio.sleep(5.5)
        self.up["h2"] = True
        self.gone["h2"] = asyncio.Event()
        self.events.emit("host.up", host="h2", slots=2, sandbox="bwrap", back=True)
        async with self.changed:
            self.changed.notify_all()

    async def _down(self, host: str, state: str, reason: str) -> None:
        self.up[host] = False
        self.gone[host].set()
        self.events.emit(f"host.{state}", host=host, slots=self.slots_of[host], reason=reason)

    async def run(self, attempt: Attempt) -> AttemptResult:
        async with self.changed:
            while True:
                free = [h for h in self.slots_of if self.up[h] and self.busy[h] < self.slots_of[h]]
                if free:
                    host = min(free, key=lambda h: (self.busy[h] / self.slots_of[h], h))
                    break
                await self.changed.wait()
            self.busy[host] += 1
        self.events.emit(
            "attempt.placed",
            round=attempt.round,
            unit=attempt.unit_id,
            attempt=attempt.number,
            host=host,
        )
        try:
            if host == "h3":
                reason = "h3: cannot create a sandbox in /srv/sandboxes: Permission denied"
                await self._down(host, "quarantined", reason)
                await self._down(host, "lost", reason)
                return AttemptResult(status=Status.LOST, reason=reason, host=host)
            gone = asyncio.create_task(self.gone[host].wait())
            done, _ = await asyncio.wait({gone}, timeout=self.delay)
            gone.cancel()
            if done:
                return AttemptResult(
                    status=Status.LOST, reason=f"lost {host}: connection lost", host=host
                )
            return AttemptResult(status=Status.SUCCEEDED, reason="ok", duration=1.0, host=host)
        finally:
            async with self.changed:
                self.busy[host] -= 1
                self.changed.notify_all()


# What users read, per run (the live display's lines start with ``|``).
STREAMED_LIVE = [
    "run R of sweep started",
    "| round 1  ━━━━━━━━━━━━━━━━━━━━  0 done, 200 selected so far  0.0s",
    "| 1 running  199 queued  0 failed  paced by limit api 120/min",
    "| round 1  ━━━━━━━━━━━━━━━━━━━━  1 done, 200 selected so far  1.0s  1.0/s  eta at least 3m 19s",
    "| 1 running  198 queued  0 failed  paced by limit api 120/min",
    "u003: attempt 1 (default) failed in 1.0s: exit 1",
    "| round 1  ━━━━━━━━━━━━━━━━━━━━  22 done, 200 selected so far  12s  1.8/s  eta at least 1m 41s",
    "| 2 running  176 queued  0 failed  paced by limit api 120/min",
    "u003: attempt 2 (default) failed in 1.0s: exit 1",
    "FAILED u003 after 2 attempt(s), rung default: exit 1",
    "| round 1  ━━━━━━━━━━━━━━━━━━━━  117 done, 200 selected so far  1m  1.9/s  eta at least 43s",
    "| 2 running  81 queued  1 failed  paced by limit api 120/min",
    "round 1: 450 unit(s) from 450 record(s)",
    "| round 1  ━━━━━━━━━━━━━━━━━╸━━  397/450 done  3m 20s  2.0/s  eta 27s",
    "| 2 running  51 queued  1 failed  paced by limit api 120/min",
    "| round 1  ━━━━━━━━━━━━━━━━━╸━━  399/450 done  3m 21s  2.0/s  eta 26s",
    "| 2 running  49 queued  1 failed  paced by limit api 120/min",
    "| round 1  ━━━━━━━━━━━━━━━━━━━╸  449/450 done  3m 46s  2.0/s  eta 0.5s",
    "| 1 running  0 queued  1 failed  paced by limit api 120/min",
]

STREAMED_PLAIN = [
    "run R of sweep started",
    "round 1: selecting units (up to 4 at once, tightest limit api 120/min)",
    "u003: attempt 1 (default) failed in 1.0s: exit 1",
    "u003: attempt 2 (default) failed in 1.0s: exit 1",
    "FAILED u003 after 2 attempt(s), rung default: exit 1",
    "progress: round 1  117 done, 200 selected so far  1m  1.9/s  eta at least 43s  1 running  82 queued  1 failed  paced by limit api 120/min",
    "progress: round 1  237 done, 400 selected so far  2m  2.0/s  eta at least 1m 23s  1 running  162 queued  1 failed  paced by limit api 120/min",
    "progress: round 1  357 done, 400 selected so far  3m  2.0/s  eta at least 22s  1 running  42 queued  1 failed  paced by limit api 120/min",
    "round 1: 450 unit(s) from 450 record(s)",
]

RESUMED_LIVE = [
    "run R resumed at round 1",
    "round 1: 450 unit(s) from 450 record(s), 30 settled before (30 succeeded, 0 failed), 420 remain",
    "| round 1  ━╺━━━━━━━━━━━━━━━━━━  30/450 done  0.0s",
    # Slow start's first generation is one start, the next two once it is through.
    "| 1 running  419 queued  0 failed  paced by slow start (finding the pace)",
    "u003: attempt 2 (default) failed in 1.0s: exit 1",
    "FAILED u003 after 2 attempt(s), rung default: exit 1",
    "| round 1  ━╺━━━━━━━━━━━━━━━━━━  31/450 done  1.0s  1.0/s  eta 6m 59s",
    "| 2 running  417 queued  1 failed  paced by slow start (finding the pace)",
    "| round 1  ━━━━━━╺━━━━━━━━━━━━━  145/450 done  30s  3.8/s  eta 1m 20s",
    "| 4 running  301 queued  1 failed  paced by 4 slot(s)",
]

RESUMED_PLAIN = [
    "run R resumed at round 1",
    "limit all dispatch: slow start, finding the pace (nothing learned yet)",
    "round 1: resuming (up to 4 at once)",
    "round 1: 450 unit(s) from 450 record(s), 30 settled before (30 succeeded, 0 failed), 420 remain",
    "u003: attempt 2 (default) failed in 1.0s: exit 1",
    "FAILED u003 after 2 attempt(s), rung default: exit 1",
    "limit all dispatch: slow start over, the slots bound it",
    "progress: round 1  261/450 done  1m  3.9/s  eta 49s  3 running  186 queued  1 failed  paced by 4 slot(s)",
]

RESUMED_SELECTED_LIVE = [
    "run R resumed at round 1",
    "round 1: 20 unit(s) from 20 record(s), 10 settled before (10 succeeded, 0 failed), 10 remain",
    "| round 1  ━━━━━━━━━━╺━━━━━━━━━  10/20 done  0.0s",
    "| 1 running  9 queued  0 failed  paced by slow start (finding the pace)",
    "u003: attempt 2 (default) failed in 1.0s: exit 1",
    "FAILED u003 after 2 attempt(s), rung default: exit 1",
    "| round 1  ━━━━━━━━━━━╺━━━━━━━━  11/20 done  1.0s  1.0/s  eta 9.0s",
    "| 2 running  7 queued  1 failed  paced by slow start (finding the pace)",
]

FLEET_LIVE = [
    "run R of sweep started",
    "round 1: 24 unit(s) from 24 record(s)",
    "| round 1  ━━━━━━━━━━━━━━━━━━━━  0/24 done  0.0s",
    # Nothing declared, nothing learned: all dispatch starts slowly, one start, then two
    # once it is through; the second generation's second start is lost on h3.
    "| 1 running  23 queued  0 failed  paced by slow start (finding the pace)",
    "| hosts  h1 1/2 up  h2 0/2 up  h3 0/1 up",
    "host h3 quarantined: h3: cannot create a sandbox in /srv/sandboxes: Permission denied",
    "u005: attempt 1 (default) lost in 0.0s: h3: cannot create a sandbox in /srv/sandboxes: Permission denied",
    "host h2 lost: connection lost: keepalive timeout (2 attempt(s) were running on it)",
    "u008: attempt 1 (default) lost in 0.0s: lost h2: connection lost",
    "u009: attempt 1 (default) lost in 0.0s: lost h2: connection lost",
    "| round 1  ━━━━━╺━━━━━━━━━━━━━━  6/24 done  3.5s  1.7/s  eta 10s",
    "| 2 running  16 queued  0 failed  paced by 2 slot(s)",
    "| hosts  h1 2/2 up  h2 0/2 lost  h3 0/1 quarantined",
    "| round 1  ━━━━━━╸━━━━━━━━━━━━━  8/24 done  4.0s  2.0/s  eta 8.0s",
    "| 2 running  14 queued  0 failed  paced by 2 slot(s)",
    "| hosts  h1 2/2 up  h2 0/2 lost  h3 0/1 quarantined",
    "host h2 is back: 2 slot(s)",
    "| round 1  ━━━━━━━━━━━━━━━╺━━━━  18/24 done  9.0s  2.0/s  eta 3.0s",
    "| 4 running  2 queued  0 failed  paced by 4 slot(s)",
    "| hosts  h1 2/2 up  h2 2/2 up  h3 0/1 quarantined",
]

FLEET_PLAIN = [
    "run R of sweep started",
    "limit all dispatch: slow start, finding the pace (nothing learned yet)",
    "host h1 up: 2 slot(s), sandbox bwrap",
    "host h2 up: 2 slot(s), sandbox bwrap",
    "host h3 up: 1 slot(s), sandbox bwrap",
    "round 1: selecting units (up to 5 at once)",
    "round 1: 24 unit(s) from 24 record(s)",
    "host h3 quarantined: h3: cannot create a sandbox in /srv/sandboxes: Permission denied",
    "u005: attempt 1 (default) lost in 0.0s: h3: cannot create a sandbox in /srv/sandboxes: Permission denied",
    "limit all dispatch: slow start over, the slots bound it",
    "host h2 lost: connection lost: keepalive timeout (2 attempt(s) were running on it)",
    "u008: attempt 1 (default) lost in 0.0s: lost h2: connection lost",
    "u009: attempt 1 (default) lost in 0.0s: lost h2: connection lost",
    "u005: attempt 2 (default) succeeded in 1.0s",
    "u008: attempt 2 (default) succeeded in 1.0s",
    "u009: attempt 2 (default) succeeded in 1.0s",
    "host h2 is back: 2 slot(s)",
]


def _not_successes(lines: list[str]) -> list[str]:
    """Plain lines but one per successful attempt (hundreds of them)."""
    return [
        line
        for line in lines
        if not re.fullmatch(r"u\d+: attempt 1 \(default\) succeeded in 1\.0s", line)
    ]


def _run_lines(lines: list[str]) -> list[str]:
    """Lines without the run id (a new one each time)."""
    return [re.sub(r"run \d{8}T\d{6}-[0-9a-f]{4}", "run R", line) for line in lines]


@pytest.mark.slow
@pytest.mark.looptime
async def test_a_streaming_run_counts_what_is_selected_so_far_and_names_the_pace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Batches of 200 (the selection's are larger): the display counts 200, then 400,
    # selected so far, before the total is known.
    monkeypatch.setattr(selection, "_BATCH", 200)
    recorded: Recorded = []
    job = _job(tmp_path, 450, 4, LIMIT)
    journal = Journal(job.runtime.state_dir / "journal.sqlite")
    await _runner(job, FakeTransport(script=_fails_u003), recorded, journal).execute(Options())
    assert _run_lines(_live_transcript(recorded, [0, 1, 12.5, 60, 200, 201, 226])) == STREAMED_LIVE
    assert _run_lines(_not_successes(_plain_transcript(recorded))) == STREAMED_PLAIN


@pytest.mark.looptime
async def test_a_resumed_run_counts_the_units_settled_before(tmp_path: Path) -> None:
    # Interrupted while the selection streamed (200 of 450 units selected): the resumed
    # run selects again, and its counts start from what the journal says had settled.
    recorded = await _interrupted_then_resumed(tmp_path / "streamed", 450, 30)
    assert _run_lines(_live_transcript(recorded, [0, 1, 30])) == RESUMED_LIVE
    assert _run_lines(_not_successes(_plain_transcript(recorded))) == RESUMED_PLAIN
    # Interrupted after the selection ended: the resumed round is read from the journal.
    recorded = await _interrupted_then_resumed(tmp_path / "selected", 20, 10)
    assert _run_lines(_live_transcript(recorded, [0, 1])) == RESUMED_SELECTED_LIVE


@pytest.mark.looptime
async def test_a_run_on_hosts_shows_each_host_busy_lost_and_quarantined(tmp_path: Path) -> None:
    recorded: Recorded = []
    job = _job(tmp_path, 24, 8)
    journal = Journal(job.runtime.state_dir / "journal.sqlite")
    runner = _runner(job, FakeTransport(), recorded, journal)
    runner.transport = _Fleet(runner.events)
    await runner.execute(Options())
    assert _run_lines(_live_transcript(recorded, [0, 3.5, 4, 9])) == FLEET_LIVE
    assert _run_lines(_not_successes(_plain_transcript(recorded))) == FLEET_PLAIN


async def test_ssh_hosts_emit_their_states_and_placements(ssh_pool: Any, tmp_path: Path) -> None:
    """The real SSH pool emits what the display reads: ``host.up`` for each host at
    start, ``attempt.placed`` for every attempt, ``host.quarantined`` (and no separate
    line for its loss) for a host that cannot run units, ``host.lost`` for a dead one."""
    servers = {name: ssh_pool.add(name) for name in ("good", "refuses", "dies")}
    closed_root = ssh_pool.base / "closed"  # fanout's 0755 directory: not the host user's
    closed_root.mkdir(mode=0o755)
    hosts = [ssh_pool.host(server, slots=2) for server in servers.values()]
    hosts[1] = ssh_pool.host(servers["refuses"], slots=2, sandbox_root=str(closed_root))
    items = ", ".join(f'"u{n:02d}"' for n in range(16))
    job = spec.load(
        write_job(
            tmp_path,
            f"""
            version = 1
            name = "fleet"
            [inputs]
            items = [{items}]
            [task]
            command = ["sh", "-c", "sleep 0.3"]
            timeout = "30s"
            [runtime]
            maxConcurrentTasks = 6
            sandbox = "none"
            """,
        )
    )
    recorded: list[dict[str, Any]] = []
    four_settled = asyncio.Event()

    def count(event: dict[str, Any]) -> None:
        if sum(1 for e in recorded if e["event"] == "unit.settled") >= 4:
            four_settled.set()

    events = Events(recorded.append, count)
    transport = SshTransport(
        hosts,
        known_hosts=[ssh_pool.known_hosts],
        sandbox_kind="none",
        keepalive_interval=1.0,
        keepalive_count=2,
        connect_timeout=3.0,
        emit=events.emit,
        rng=random.Random(3),
    )
    runner = make_runner(job, transport, events=events)

    async def kill_after_four() -> None:
        await four_settled.wait()
        servers["dies"].kill()

    killer = asyncio.create_task(kill_after_four())
    summary = await asyncio.wait_for(runner.execute(Options()), 90)
    await killer
    assert summary.counts == {"succeeded": 16}
    ups = [
        (e["host"], e["slots"], e["sandbox"], e["back"])
        for e in recorded
        if e["event"] == "host.up"
    ]
    assert sorted(ups) == [
        ("dies", 2, "none", False),
        ("good", 2, "none", False),
        ("refuses", 2, "none", False),
    ]
    quarantined = [e for e in recorded if e["event"] == "host.quarantined"]
    # "dies" may be quarantined too, after its reconnects failed, if the run lasts.
    assert quarantined[0]["host"] == "refuses"
    assert {e["host"] for e in quarantined} <= {"refuses", "dies"}
    assert quarantined[0]["reason"].startswith(f"refuses: cannot create a sandbox in {closed_root}")
    assert "dies" in {e["host"] for e in recorded if e["event"] == "host.lost"}
    started = sorted((e["unit"], e["attempt"]) for e in recorded if e["event"] == "attempt.started")
    placed = [e for e in recorded if e["event"] == "attempt.placed"]
    assert sorted((e["unit"], e["attempt"]) for e in placed) == started
    assert {e["host"] for e in placed} == {"good", "refuses", "dies"}
    assert not [e for e in recorded if e["event"] == "notice" and "host" in e["message"]]
    out = StringIO()
    display = Display(Console(file=out), live=False)
    for event in recorded:
        display(event)
    lines = _lines(out.getvalue())
    shown = [line for line in lines if line.startswith("host ")]
    assert shown[:3] == [f"host {name} up: 2 slot(s), sandbox none" for name in [e[0] for e in ups]]
    assert f"host refuses quarantined: {quarantined[0]['reason']}" in shown
    assert not [line for line in shown if line.startswith("host refuses lost")]
    assert [line for line in shown if line.startswith("host dies lost: ")]


@pytest.mark.looptime
async def test_the_report_of_a_run_on_hosts_has_a_hosts_table(tmp_path: Path) -> None:
    recorded: Recorded = []
    job = _job(tmp_path / "fleet", 24, 8)
    journal = Journal(job.runtime.state_dir / "journal.sqlite")
    runner = _runner(job, FakeTransport(), recorded, journal)
    runner.transport = _Fleet(runner.events)
    summary = await runner.execute(Options())
    lines = (summary.report_dir / "report.md").read_text().splitlines()
    header = lines.index("| host | slots | attempts | lost attempts | times lost | quarantined |")
    assert lines[header + 1 : header + 6] == [
        "| --- | ---: | ---: | ---: | ---: | --- |",
        # Slow start's generations (4, then 8 once all 4 are through) put one more
        # attempt on h1 than a flight refilled as each ended did.
        "| <code>h1</code> | 2 | 19 | 0 | 0 | no |",
        "| <code>h2</code> | 2 | 7 | 2 | 1 | no |",
        "| <code>h3</code> | 1 | 1 | 1 | 0 | yes: h3: cannot create a sandbox in /srv/sandboxes: "
        "Permission denied |",
        "",
    ]
    data = json.loads((summary.report_dir / "report.json").read_text())
    assert data["hosts"][2] == {
        "host": "h3",
        "slots": 1,
        "attempts": 1,
        "lostAttempts": 1,
        "timesLost": 0,
        "quarantined": True,
        "reason": "h3: cannot create a sandbox in /srv/sandboxes: Permission denied",
    }
    # A run on this machine has no hosts.
    job = _job(tmp_path / "local", 3, 2)
    journal = Journal(job.runtime.state_dir / "journal.sqlite")
    summary = await _runner(job, FakeTransport(), [], journal).execute(Options())
    assert "| host |" not in (summary.report_dir / "report.md").read_text()
    assert json.loads((summary.report_dir / "report.json").read_text())["hosts"] == []


def test_the_live_display_moves_on_while_no_event_comes() -> None:
    # An agent's unit can take minutes: the clock and a pause's countdown still move.
    out = StringIO()
    clock = _Clock()
    console = Console(file=out, force_terminal=True, width=200)
    with Display(console, live=True, clock=clock) as display:
        display({"event": "round.started", "round": 1, "concurrency": 4})
        display({"event": "round.selected", "round": 1, "units": 10, "records": 10})
        display({"event": "attempt.started", "round": 1, "unit": "u0", "attempt": 1, "rung": "a"})
        display({"event": "limit.paused", "limit": "api", "seconds": 200.0, "reason": "429"})
        clock.now = 125.0
        display.progress.refresh()  # what rich's refresh thread does four times a second
    shown = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())
    assert "round 1  ━━━━━━━━━━━━━━━━━━━━  0/10 done  2m 5s" in shown
    assert "1 running  9 queued  0 failed  paced by 4 slot(s)  [api paused 1m 15s]" in shown


@pytest.mark.slow
def test_a_run_an_apis_window_paces_names_the_window_not_the_slots(
    mock_api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 8 units of 2 requests, 4 slots, 4 requests a second through the gateway: 2 units a
    # second, where 4 slots of workers that take well under a second each would do more.
    # The run's own events.jsonl, replayed into the live display.
    monkeypatch.setenv("FANOUT_TEST_ANTHROPIC_KEY", KEY)
    items = ", ".join(f'"u{n}"' for n in range(8))
    job = write_job(
        tmp_path,
        f"""
        version = 1
        name = "paced"
        [inputs]
        items = [{items}]
        [task]
        command = ["python3", "-c", {json.dumps(WORKER)}, "2"]
        timeout = "60s"
        [runtime]
        maxConcurrentTasks = 4
        network = true
        [[apis]]
        name = "anthropic"
        upstream = "{mock_api.url}"
        style = "anthropic"
        keySecret = "FANOUT_TEST_ANTHROPIC_KEY"
        requests = {{ limit = 4, per = "1s" }}
        """,
    )
    monkeypatch.chdir(tmp_path)
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    (log_path,) = (tmp_path / ".fanout" / "runs").glob("*/events.jsonl")
    log = [json.loads(line) for line in log_path.read_text().splitlines()]
    console = Console(file=StringIO(), record=True, width=120, force_terminal=True)
    clock = _Clock()
    display = Display(console, live=True, clock=clock)
    paced: list[str] = []
    finished = 0

    for event in log:
        finished += event["event"] == "attempt.finished"
        clock.now = event["time"] - log[0]["time"]
        display(event)
        if event["event"] == "unit.settled" or (event["event"] == "attempt.started" and not paced):
            paced.append(_shown(display, 118)[1])  # the line under the bar
    # Before an attempt has finished nothing says what an attempt takes of the API (all
    # dispatch's slow start is named); from the first one on, the window.
    assert finished == 8
    assert paced[0].endswith("  0 failed  paced by slow start (finding the pace)")
    assert len(paced) == 9  # the first start, then each unit settled
    # Slow start's first generation (4 starts) names itself until it is over, at the
    # latest once the fifth unit has started: never the slots.
    window = "paced by api anthropic 240 requests/min"
    slow = "paced by slow start (finding the pace)"
    assert all(line.endswith((window, slow)) for line in paced), paced
    assert all(line.endswith(window) for line in paced[5:]), paced
    assert paced[-1] == "0 running  0 queued  0 failed  paced by api anthropic 240 requests/min"
    (started,) = [e for e in log if e["event"] == "round.started"]
    assert started["paces"] == [
        {"api": "anthropic", "window": "requests", "perMinute": 240.0, "counts": ["requests"]}
    ]


# A golden rendering of a recorded event log (tests/data/progress/events.jsonl, as a run
# on three SSH hosts writes it: a streamed selection, a notice, a quarantined host, a
# throttle pause, a lost host that comes back, a hostile unit id and reason, a Ctrl-C),
# on a terminal 100 columns wide, with the clocks reading each event's time.  Regenerate
# nothing automatically: the golden file is a reviewed statement of what users read.
DATA = Path(__file__).parent / "data"


def _recorded_log() -> list[dict[str, Any]]:
    text = (DATA / "progress" / "events.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def _replay(display: Display, clock: _Clock, log: list[dict[str, Any]], shown: Any) -> None:
    start = log[0]["time"]
    for n, event in enumerate(log):
        clock.now = event["time"] - start
        display(event)
        if n + 1 == len(log) or log[n + 1]["time"] != event["time"]:
            shown(clock.now)


def _live_rendering() -> str:
    log = _recorded_log()
    console = Console(file=StringIO(), record=True, width=100, force_terminal=True)
    clock = _Clock()
    start = log[0]["time"]
    wall = lambda: datetime.fromtimestamp(start + clock.now, UTC)  # noqa: E731
    display = Display(console, live=True, clock=clock, wall=wall)

    def shown(at: float) -> None:
        # What the screen holds until the next event: the live display, marked ``|``.
        console.print(Text(f"-- {at:g}s"), highlight=False)
        for line in _shown(display, 98):
            console.print(Text("| " + line), highlight=False, soft_wrap=True)

    _replay(display, clock, log, shown)
    return console.export_text()


def _plain_rendering() -> str:
    log = _recorded_log()
    out = StringIO()
    clock = _Clock()
    start = log[0]["time"]
    wall = lambda: datetime.fromtimestamp(start + clock.now, UTC)  # noqa: E731
    display = Display(Console(file=out, width=100), live=False, clock=clock, wall=wall)
    _replay(display, clock, log, lambda at: None)
    return out.getvalue()


def test_the_live_display_of_a_recorded_event_log_reads_as_its_golden_file() -> None:
    expected = (DATA / "golden" / "progress-live.txt").read_text(encoding="utf-8")
    assert _live_rendering() == expected


def test_the_log_lines_of_a_recorded_event_log_read_as_their_golden_file() -> None:
    expected = (DATA / "golden" / "progress-plain.txt").read_text(encoding="utf-8")
    assert _plain_rendering() == expected


def test_a_log_says_what_the_gateway_absorbed_and_what_it_cannot_price() -> None:
    out = StringIO()
    display = Display(Console(file=out, width=200), live=False)
    display(
        {
            "event": "api.throttled",
            "api": "anthropic",
            "unit": "u7",
            "attempt": 1,
            "status": 429,
            "retryAfter": 3.0,
            "pause": 3.4,
        }
    )
    display({"event": "api.unpriced", "api": "anthropic", "model": "claude-haiku-9"})
    shown = [line.split(" ", 1)[1] for line in out.getvalue().splitlines()]
    assert shown == [
        "api anthropic: 429 for u7, paused 3.4s and retried (the worker does not see it)",
        "api anthropic: no price matches model claude-haiku-9: its tokens cost $0 in the"
        " report and the budget (add it to [[apis]] prices)",
    ]


# What the limits learned, as the rate gate and the gateway say it: slow start, a pause
# and its episode, the learned pace, an API's window learned, what a run starts from.
LEARNING: list[dict[str, Any]] = [
    {"event": "run.started", "run": "r1", "job": "crm"},
    {"event": "limit.ramp", "limit": "all dispatch", "ramping": True},
    {"event": "round.started", "round": 1, "concurrency": 8, "paces": []},
    {"event": "limit.ramp", "limit": "all dispatch", "ramping": True},  # the flight grew
    {
        "event": "limit.paused",
        "limit": "all dispatch",
        "seconds": 12.0,
        "retryAfter": 10.0,
        "reason": "throttled (Retry-After)",
        "episode": "new",
        "level": 0,
        "learned": None,
    },
    {
        "event": "limit.learned",
        "limit": "all dispatch",
        "perWindow": 2.0,
        "window": 10.0,
        "throttles": 1,
        "concurrency": 2,
        "text": "2.0 per 10s learned from 1 throttle, 2 at once (none declared)",
    },
    {
        "event": "limit.paused",
        "limit": "all dispatch",
        "seconds": 3.0,
        "retryAfter": 9.0,
        "reason": "throttled (Retry-After)",
        "episode": "same",
        "level": 0,
        "learned": "2.0 per 10s learned from 2 throttles, 2 at once (none declared)",
    },
    {
        "event": "limit.learned",
        "limit": "all dispatch",
        "perWindow": 2.0,
        "window": 10.0,
        "throttles": 2,
        "concurrency": 2,
        "text": "2.0 per 10s learned from 2 throttles, 2 at once (none declared)",
    },
]

LEARNING_PLAIN = [
    "run r1 of crm started",
    "limit all dispatch: slow start, finding the pace (nothing learned yet)",
    "round 1: selecting units (up to 8 at once)",
    "limit all dispatch paused for 12s (throttled (Retry-After))",
    "limit all dispatch: 2.0 per 10s learned from 1 throttle, 2 at once (none declared)",
    "limit all dispatch paused for 3.0s (throttled (Retry-After)) (same episode)",
    "limit all dispatch: 2.0 per 10s learned from 2 throttles, 2 at once (none declared)",
]


def _pace_after(display: Display, events: list[dict[str, Any]]) -> list[str]:
    """The pace the live line names after each event."""
    paces = []
    for event in events:
        display(event)
        paces.append(display.counts.pacer())
    return paces


def test_the_log_says_each_change_of_what_a_limit_learned_and_the_live_line_its_pace() -> None:
    out = StringIO()
    display = Display(Console(file=out, width=200), live=False)
    paces = _pace_after(display, LEARNING)
    assert _lines(out.getvalue()) == LEARNING_PLAIN
    slow = "paced by slow start (finding the pace)"
    learned = "paced by all dispatch 2.0 per 10s learned"
    assert paces == ["", slow, slow, slow, slow, learned, learned, learned]
    # On a terminal the live line says it, and no line is printed above it.
    live = StringIO()
    with Display(Console(file=live, width=200, force_terminal=True), live=True) as shown:
        assert _pace_after(shown, LEARNING)[-1] == learned
    assert "learned from" not in live.getvalue()


def test_a_learned_ceiling_paces_in_place_of_what_was_declared_for_it() -> None:
    out = StringIO()
    display = Display(Console(file=out, width=200), live=False)
    paces = [
        {"limit": "crm", "perMinute": 30.0},
        {"limit": "search", "perMinute": 20.0},
        {"api": "anthropic", "window": "requests", "perMinute": 60.0, "counts": ["requests"]},
    ]
    kept = {"kept": True, "throttles": 3, "concurrency": None}
    events = [
        {"event": "round.started", "round": 1, "concurrency": 4, "paces": paces},
        # crm's ceiling, kept from an earlier run: 6/min, below search's 20.
        {"event": "limit.learned", "limit": "crm", "perWindow": 1.0, "window": 10.0, "text": "t"}
        | kept,
        {
            "event": "api.learned",
            "api": "anthropic",
            "perWindow": 2.0,
            "window": 60.0,
            "text": "2.0 per 1m learned from 3 throttles (declared 60 per 1m)",
        }
        | kept,
        # An attempt that made 2 requests through the gateway: anthropic's 2 a minute
        # is 1 unit a minute, the tightest.
        {
            "event": "attempt.finished",
            "unit": "u1",
            "attempt": 1,
            "rung": "default",
            "status": "succeeded",
            "reason": "ok",
            "duration": 1.0,
            "usage": [{"api": "anthropic", "requests": 2, "queuedSeconds": 0.0}],
        },
    ]
    assert _pace_after(display, events) == [
        "paced by limit search 20/min",
        "paced by limit crm 1.0 per 10s learned",
        "paced by limit crm 1.0 per 10s learned",
        "paced by api anthropic 2.0 per 1m learned",
    ]
    assert _lines(out.getvalue())[1:3] == [
        "limit crm starts at t, as an earlier run left it",
        "api anthropic starts at 2.0 per 1m learned from 3 throttles (declared 60 per 1m),"
        " as an earlier run left it",
    ]
