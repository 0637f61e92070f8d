"""How a run ended, as values: each StopReason owns its state, its note and its exit code,
and run states read from the journal as the enum they were written from."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from fanout import spec
from fanout.errors import FanoutError, Interrupted, NothingSelected
from fanout.journal import Journal
from fanout.outcome import RunState, StopReason
from fanout.run.job import Options

from fakes import FakeTransport
from helpers import make_runner, write_job

pytestmark = pytest.mark.looptime


@pytest.mark.parametrize(
    ("reason", "state", "note", "clean", "failed"),
    [
        (StopReason.NOTHING_SELECTED, "finished", "nothing selected", 3, 3),
        (StopReason.NOTHING_REMAINS, "finished", "nothing remains after round 2", 0, 1),
        (
            StopReason.SAME_SELECTION,
            "finished",
            "round 3 would select what round 2 did: no progress",
            0,
            1,
        ),
        (StopReason.LAST_ROUND, "finished", "", 0, 1),
        (
            StopReason.NOT_APPLIED,
            "finished",
            "more rounds need collected files applied (collect.apply or --apply)",
            0,
            1,
        ),
        (
            StopReason.NO_CHANGE,
            "finished",
            "round 3 changed nothing in the workspace: no progress",
            0,
            1,
        ),
        (
            StopReason.INTERRUPTED,
            "interrupted",
            "interrupted; `fanout run --resume` continues",
            130,
            130,
        ),
        (StopReason.STOPPED, "stopped", "", 1, 1),
    ],
)
def test_each_reason_owns_its_state_note_and_exit_code(
    reason: StopReason, state: str, note: str, clean: int, failed: int
) -> None:
    assert reason.state is RunState(state)
    assert reason.note(3) == note
    assert reason.exit_code({"succeeded": 4}) == clean
    assert reason.exit_code({"succeeded": 3, "failed": 1}) == failed
    # A unit left interrupted in a finished run needs a human like a failed one.
    assert reason.exit_code({"succeeded": 3, "interrupted": 1}) == failed


def test_exit_codes_are_the_error_classes_own() -> None:
    assert StopReason.NOTHING_SELECTED.exit_code({}) == NothingSelected.exit_code
    assert StopReason.INTERRUPTED.exit_code({}) == Interrupted.exit_code
    assert StopReason.STOPPED.exit_code({}) == FanoutError.exit_code


async def test_a_run_that_selects_nothing_ends_on_its_reason_and_exits_3(tmp_path: Path) -> None:
    job = spec.load(
        write_job(
            tmp_path,
            """
            version = 1
            name = "empty"
            [inputs]
            files = ["*.none"]
            [task]
            command = ["true"]
            """,
        )
    )
    runner = make_runner(job, FakeTransport(), events=lambda e: None, rng=random.Random(7))
    summary = await runner.execute(Options())
    assert (summary.reason, summary.state, summary.note) == (
        StopReason.NOTHING_SELECTED,
        RunState.FINISHED,
        "nothing selected",
    )
    # Decided by the reason, not by the CLI comparing the note's text.
    assert summary.exit_code == 3
    assert runner.journal.run(summary.run_id).state is RunState.FINISHED


def test_run_states_of_an_older_journal_read_as_the_enum(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    Journal(path).close()
    db = sqlite3.connect(path)
    for n, state in enumerate(["finished", "stopped", "interrupted", "running"]):
        db.execute(
            "INSERT INTO runs (id, job, job_file, started, state) VALUES (?, ?, 'j.toml', ?, ?)",
            (f"r{n}", f"job{n}", float(n), state),
        )
    db.commit()
    db.close()
    journal = Journal(path, read_only=True)
    try:
        states = [journal.run(f"r{n}").state for n in range(4)]
        assert states == [
            RunState.FINISHED,
            RunState.STOPPED,
            RunState.INTERRUPTED,
            RunState.RUNNING,
        ]
        assert all(type(s) is RunState for s in states)
        # A finished run is never resumed; the three others are.
        assert journal.last_unfinished("job0") is None
        resumable = [journal.last_unfinished(f"job{n}") for n in (1, 2, 3)]
        assert [r.id if r else None for r in resumable] == ["r1", "r2", "r3"]
    finally:
        journal.close()
