"""What the attempts used of the workers: their active seconds and, where the job
declared ``task.memory``, their byte-seconds (duration x allocated memory), summed per
run, every attempt counted (retries, lost and interrupted attempts: they were paid
for), with the attempts counted by host, status and kind: what a report reads of
``attempts`` in one scan of the run's (four scans before issue 26, a fifth of a
100k-unit report)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .store import Store


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptGroup:
    """The attempts of a run with one host, status and kind, and their sums."""

    host: str
    status: str | None
    kind: str
    attempts: int
    active_seconds: float
    byte_seconds: float
    # Attempts that ran (duration > 0) without a declared memory.
    unallocated: int
    memory_min: int | None
    memory_max: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptTally:
    """A run's attempts, grouped by host, status and kind (``Journal.attempt_tally``)."""

    groups: tuple[AttemptGroup, ...]

    @property
    def attempts(self) -> int:
        return sum(g.attempts for g in self.groups)

    @property
    def active_seconds(self) -> float:
        return sum(g.active_seconds for g in self.groups)

    @property
    def unallocated(self) -> int:
        return sum(g.unallocated for g in self.groups)

    @property
    def byte_seconds(self) -> float | None:
        """Duration x memory, summed; None when an attempt that ran had no memory: a
        sum that leaves attempts out is unknown, never a bill that looks complete."""
        return None if self.unallocated else sum(g.byte_seconds for g in self.groups)

    @property
    def memory_min(self) -> int | None:
        return min((g.memory_min for g in self.groups if g.memory_min is not None), default=None)

    @property
    def memory_max(self) -> int | None:
        return max((g.memory_max for g in self.groups if g.memory_max is not None), default=None)

    def by_status(self) -> dict[str, int]:
        """Attempts per status (``"None"``: not settled), by status."""
        found: dict[str, int] = {}
        for g in self.groups:
            found[str(g.status)] = found.get(str(g.status), 0) + g.attempts
        return dict(sorted(found.items()))

    def by_kind(self) -> dict[str, int]:
        """An agent task's attempts counted by the class its output read as, by kind."""
        found: dict[str, int] = {}
        for g in self.groups:
            if g.kind:
                found[g.kind] = found.get(g.kind, 0) + g.attempts
        return dict(sorted(found.items()))

    def by_host(self) -> Mapping[str, Mapping[str, int]]:
        """Per host (``""``: this machine), the attempts counted by status."""
        found: dict[str, dict[str, int]] = {}
        for g in self.groups:
            statuses = found.setdefault(g.host, {})
            statuses[str(g.status)] = statuses.get(str(g.status), 0) + g.attempts
        return found


class Compute(Store):
    """Reads of ``attempts`` as the report's compute accounting sees them."""

    def attempt_tally(self, run_id: str) -> AttemptTally:
        """The run's attempts grouped by host, status and kind, with their sums."""
        # A journal an older fanout wrote, opened read-only (``fanout report``), has no
        # ``memory`` column: its attempts declared none.
        memory = "memory" if "memory" in self._columns("attempts") else "NULL"
        sql = (
            "SELECT host, status, kind, COUNT(*), COALESCE(SUM(duration), 0),"  # noqa: S608 - constant SQL
            f" COALESCE(SUM(duration * {memory}), 0), SUM({memory} IS NULL AND duration > 0),"
            f" MIN({memory}), MAX({memory}) FROM attempts WHERE run = ?"
            " GROUP BY host, status, kind ORDER BY host, status, kind"
        )
        return AttemptTally(
            groups=tuple(
                AttemptGroup(
                    host=str(host),
                    status=None if status is None else str(status),
                    kind=str(kind),
                    attempts=int(n),
                    active_seconds=float(active),
                    byte_seconds=float(byte_seconds),
                    unallocated=int(unallocated),
                    memory_min=low,
                    memory_max=high,
                )
                for host, status, kind, n, active, byte_seconds, unallocated, low, high in (
                    self.db.execute(sql, (run_id,))
                )
            )
        )
