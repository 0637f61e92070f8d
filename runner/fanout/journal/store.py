"""The journal's SQLite connection: opening it (for writing or for reading only), the
one transaction every write goes through, the reserve kept for a full disk, and how
sqlite3's errors become StateError.

Every write goes through ``Store._atomic``, the one place sqlite3's errors become
StateError.  A full disk is met with a reserve: ``journal.reserve`` (a few hundred KiB
kept beside the journal) is deleted the first time a write finds the disk full and the
write is retried, so the settles of the attempts still running and the run's "stopped"
record still fit; ``storage_error`` then tells dispatch to stop starting units.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ..errors import StateError, storage_error
from .tables import MIGRATIONS, SCHEMA

T = TypeVar("T")

# Room kept free for the writes that let a run stop cleanly on a full disk: a settle is
# a few 4 KiB WAL frames, so this holds the settles of a few dozen running attempts.
RESERVE_BYTES = 256 * 1024
# sqlite3's primary result codes (the low byte of an extended code).
_SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_FULL = 8, 10, 13


class Store:
    """The journal's connection and the one way to write through it."""

    def __init__(
        self, path: Path, *, clock: Callable[[], float] = time.time, read_only: bool = False
    ) -> None:
        self.path = path
        self.clock = clock
        self.reserve = path.parent / "journal.reserve"
        # Set once a write found the disk full (and used the reserve): the run must stop.
        self.storage_error: StateError | None = None
        if read_only:
            self.db = _open_read_only(path)
            self.db.row_factory = sqlite3.Row
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(path, isolation_level=None, timeout=30)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
            for table, column, sql in MIGRATIONS:
                if column not in self._columns(table):
                    self.db.execute(sql)
        except (sqlite3.Error, OSError) as exc:
            raise StateError(f"cannot open the journal {path}: {exc}") from None
        self.db.row_factory = sqlite3.Row

    def close(self) -> None:
        self.db.close()

    def _columns(self, table: str) -> set[str]:
        """The columns ``table`` has in this journal: one an older fanout wrote, opened
        read-only (``fanout report``), lacks those added since (``MIGRATIONS``)."""
        try:
            return {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
        except sqlite3.Error:
            return set()

    def keep_reserve(self) -> None:
        """Make sure the reserve is there before a run dispatches anything (put it back
        if an earlier run used it).  A disk without room for it refuses the run before
        any unit starts, rather than running units whose results may not fit."""
        if self.reserve.exists():
            return
        try:
            with self.reserve.open("wb") as stream:
                stream.write(b"\0" * RESERVE_BYTES)
        except OSError as exc:
            self.reserve.unlink(missing_ok=True)
            raise storage_error(self.path.parent, _lower(exc.strerror or str(exc))) from None

    def _atomic(self, work: Callable[[], T]) -> T:
        """Run ``work`` (some statements) as one write transaction and commit it.  On a
        full disk the reserve is given up and ``work`` is tried once more."""
        for last_try in (False, True):
            try:
                self.db.execute("BEGIN IMMEDIATE")
                try:
                    value = work()
                    self.db.execute("COMMIT")
                finally:
                    if self.db.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            self.db.execute("ROLLBACK")
                return value
            except sqlite3.Error as exc:
                full = _code(exc) == _SQLITE_FULL
                if full and not last_try and self.reserve.exists():
                    self.reserve.unlink(missing_ok=True)
                    self.storage_error = self._state_error(exc)
                    continue
                raise self._state_error(exc) from None
        raise AssertionError("unreachable")

    def _state_error(self, exc: sqlite3.Error) -> StateError:
        code = _code(exc)
        if code == _SQLITE_FULL:
            return storage_error(self.path.parent, "no space left on device")
        if code == _SQLITE_READONLY:
            return storage_error(self.path, f"the journal is read-only ({exc})")
        if code == _SQLITE_IOERR:
            return storage_error(self.path, f"the journal cannot be written ({exc})")
        return StateError(f"journal write failed ({self.path}): {exc}")

    def _write(self, sql: str, parameters: Iterable[Any] = ()) -> int:
        """One statement in its own transaction; the number of rows it changed."""
        return self._atomic(lambda: self._run(sql, parameters))

    def _run(self, sql: str, parameters: Iterable[Any] = ()) -> int:
        """One statement inside a transaction ``_atomic`` holds."""
        return self.db.execute(sql, tuple(parameters)).rowcount


# Unit ids per query at most: under SQLite's limit on a statement's parameters.
_PAGE = 500


def unit_pages(units: Iterable[tuple[int, str]]) -> Iterator[tuple[int, list[str], str]]:
    """The (round, unit id) pairs ``units`` as queries want them: per round, pages of
    ids with the placeholders for them (``?, ?, ...``: placeholders, never values)."""
    by_round: dict[int, list[str]] = {}
    for number, unit_id in units:
        by_round.setdefault(number, []).append(unit_id)
    for number, ids in sorted(by_round.items()):
        for start in range(0, len(ids), _PAGE):
            page = ids[start : start + _PAGE]
            yield number, page, ", ".join("?" * len(page))


def no_state(state_dir: Path) -> StateError:
    """What a read-only command says where no run ever wrote a journal."""
    return StateError(
        f"no fanout state in {state_dir} (no runs yet here; --state-dir names another)"
    )


def _open_read_only(path: Path) -> sqlite3.Connection:
    """Open the journal for reading only (status, report, retry's look-up): nothing is
    created, neither the state directory, nor the journal, its tables, its indexes or
    the reserve, and no migration runs.  (Beside an existing journal, SQLite's WAL
    mode may leave its ``-wal`` and ``-shm`` files, as any reader does: they hold no
    data of fanout's and a run has them anyway.)  A journal an older fanout wrote is read as it
    is: the reads select columns by name and none of them needs a migrated column (a
    missing index only makes them slower); the next ``fanout run`` upgrades it."""
    if not path.is_file():
        raise no_state(path.parent)
    try:
        db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=30)
        # The journal is a database with runs in it, not any file of that name.
        db.execute("SELECT 1 FROM runs LIMIT 1").fetchall()
    except sqlite3.Error as exc:
        raise StateError(f"cannot read the journal {path}: {exc}") from None
    return db


def _code(exc: sqlite3.Error) -> int:
    return int(getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF


def _lower(text: str) -> str:
    return text[:1].lower() + text[1:]
