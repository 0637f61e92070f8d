"""``fanout plan``'s estimate of the job's next run, from its earlier runs in the
journal: the selected units it would run, what a unit took before (per rung and per
unit), the run's expected attempts, active seconds and spend with its p50 and p90, its
wall time at the pace it would go, and how that compares with the budgets.

- **The units it runs.**  Each selected unit is fingerprinted (``run.fingerprints``,
  as a run by hand renders it: no trigger) and sorted by ``run.reusing``, the code a
  run's first round sorts with: reused, quarantined, or run.  Of those it runs, a unit
  unchanged since it failed in an earlier run (its failure streak has this
  fingerprint) is counted apart: it is priced as a failed unit.  The selection is read
  as ``fanout run`` reads it, a batch at a time: a plan of 100,000 units holds a batch.
- **The history.**  The job's latest ``HISTORY_RUNS`` runs that made attempts
  (``journal.past``): recent runs say most about the next (a prompt, a model or the
  backlog changes), and a run that reused all but a few units adds only those few.
- **The model** is ``report.estimate``'s (the report's next-run estimate is the same).
- **Wall time** is the largest of what bounds it: the slots (the expected active
  seconds over ``concurrency``, or a learned cap on it), each declared limit and each
  learned ceiling (the expected attempts, each one start, at its pace), each API's
  windows (the expected requests or tokens at the window's rate, or its learned
  ceiling's), and one unit's attempts in a row.  Backoffs and pauses are not in it.
- Only the first round is estimated: later rounds select again after fan-in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..backlog.units import Unit
from ..journal import Journal, KeptCeiling
from ..journal.ceilings import API, label
from ..journal.past import PastRun, RungHistory, Sample, UnitHistory, UnitSums
from ..outcome import UnitState
from ..pacing import limits
from ..report import estimate
from ..report.estimate import Projection
from ..run.fingerprints import Fingerprints, agent_version
from ..run.reusing import Reusing
from ..spec import Spec

# The runs of the job an estimate reads, newest first.
HISTORY_RUNS = 5
# Units fingerprinted and sorted at a time (a run's selection takes 200).
_BATCH = 500
# Units to run listed by id.
SHOWN = 10


@dataclass(frozen=True, kw_only=True, slots=True)
class Sorting:
    """The selection as the next run's first round would sort it."""

    selected: int
    to_run: int
    # Of ``to_run``: unchanged since they failed in an earlier run.
    again: int = 0
    reused: int = 0
    quarantined: int = 0
    # The first units to run, by id.
    first: tuple[str, ...] = ()
    # False: nothing was sorted (no earlier run, or a journal without fingerprints).
    sorted: bool = False


class Sorter:
    """Fingerprints and sorts a selection a batch at a time, as ``add`` is given it."""

    def __init__(self, spec: Spec, journal: Journal, environ: Mapping[str, str]) -> None:
        self._spec = spec
        self._journal = journal
        self._prints = Fingerprints(spec, trigger=None, agent_version=agent_version(spec, environ))
        # As a run's selection finds them: by inputs first (no rendering), then by the
        # fingerprint (``run.selection``).
        self._successes = journal.all_successes(spec.name)
        self._reusing = Reusing(
            spec, journal, self._successes, run_id="", round_number=1, reuse=True
        )
        self._batch: list[Unit] = []
        self._selected = self._to_run = self._again = self._reused = self._quarantined = 0
        self._first: list[str] = []

    def add(self, unit: Unit) -> None:
        self._batch.append(unit)
        if len(self._batch) >= _BATCH:
            self._flush()

    def done(self) -> Sorting:
        self._flush()
        return Sorting(
            selected=self._selected,
            to_run=self._to_run,
            again=self._again,
            reused=self._reused,
            quarantined=self._quarantined,
            first=tuple(self._first),
            sorted=True,
        )

    def _flush(self) -> None:
        batch = [self._prints.found(unit, self._successes) for unit in self._batch]
        self._batch = []
        if not batch:
            return
        self._selected += len(batch)
        result = self._reusing.sort(batch)
        for item in result.settled:
            if item.state is UnitState.REUSED:
                self._reused += 1
            else:
                self._quarantined += 1
        streaks = self._journal.streaks(self._spec.name, (u.id for u in result.run))
        for unit in result.run:
            streak = streaks.get(unit.id)
            self._again += streak is not None and streak.fingerprint == unit.fingerprint
        self._to_run += len(result.run)
        self._first += [u.id for u in result.run[: SHOWN - len(self._first)]]


class Unsorted:
    """A selection counted, not sorted: every selected unit would run."""

    def __init__(self) -> None:
        self._selected = 0
        self._first: list[str] = []

    def add(self, unit: Unit) -> None:
        self._selected += 1
        if len(self._first) < SHOWN:
            self._first.append(unit.id)

    def done(self) -> Sorting:
        return Sorting(selected=self._selected, to_run=self._selected, first=tuple(self._first))


def sorter(spec: Spec, journal: Journal | None, environ: Mapping[str, str]) -> Sorter | Unsorted:
    """What sorts the plan's selection: a ``Sorter`` once the job has run here before."""
    if journal is None or not journal.runs(spec.name, limit=1) or not journal.has_fingerprints():
        return Unsorted()
    return Sorter(spec, journal, environ)


@dataclass(frozen=True, kw_only=True, slots=True)
class Bound:
    """One bound on the next run's wall time: what sets it, and the seconds it needs."""

    by: str
    seconds: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Budget:
    """One budget against the estimate: ``task.budget`` against a unit's p90 spend, or
    an API's budget against the run's p90 spend there."""

    name: str
    budget_usd: float
    p90_usd: float
    # task.budget: the past units that spent it all (their budget stopped them, or their
    # last request reached it), estimated from the sample.
    spent_all: float | None = None

    @property
    def under(self) -> bool:
        return self.p90_usd < self.budget_usd


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    """The plan's estimate; ``projection`` None: no earlier run made an attempt."""

    sorting: Sorting
    # The job's latest run, when it did not finish: ``fanout run`` continues it.
    unfinished: str | None = None
    runs: tuple[PastRun, ...] = ()
    sample: Sample | None = None
    rungs: tuple[RungHistory, ...] = ()
    units: UnitHistory | None = None
    projection: Projection | None = None
    # The bounds on the wall time, the largest (the wall time) first.
    wall: tuple[Bound, ...] = ()
    budgets: tuple[Budget, ...] = ()


def make(
    spec: Spec, journal: Journal | None, sorting: Sorting, learned: Sequence[KeptCeiling]
) -> Estimate:
    """The estimate of the next run of ``sorting``'s units (see the module docstring)."""
    if journal is None:
        return Estimate(sorting=sorting)
    latest = journal.last_unfinished(spec.name)
    unfinished = latest.id if latest is not None else None
    runs = tuple(journal.past_runs(spec.name, HISTORY_RUNS))
    if not runs:
        return Estimate(sorting=sorting, unfinished=unfinished)
    sample = journal.sample([run.id for run in runs])
    units = journal.unit_history(sample, budget_usd=spec.task.budget_usd)
    everyone = estimate.per_unit(units.all, {a: units.api_all(a) for a in units.apis})
    if everyone is None:  # the runs' attempts were all of units that did not settle
        return Estimate(sorting=sorting, unfinished=unfinished, runs=runs)
    failed = str(UnitState.FAILED)
    failures = estimate.per_unit(
        units.by_state.get(failed, UnitSums()),
        {a: by[failed] for a, by in units.apis.items() if failed in by},
    )
    again = sorting.again if failures is not None else 0
    projection = estimate.project(
        [(sorting.to_run - again, everyone), (again, failures or everyone)]
    )
    heaviest = max(everyone.seconds, failures.seconds if again and failures else 0.0)
    return Estimate(
        sorting=sorting,
        unfinished=unfinished,
        runs=runs,
        rungs=tuple(journal.rung_history(sample)),
        sample=sample,
        units=units,
        projection=projection,
        wall=wall_bounds(spec, projection, learned, heaviest) if sorting.to_run else (),
        budgets=budgets(spec, units, projection),
    )


def wall_bounds(
    spec: Spec, projection: Projection, learned: Iterable[KeptCeiling], unit_seconds: float
) -> tuple[Bound, ...]:
    """What bounds the next run's wall time, the largest first (see the module
    docstring).  ``unit_seconds``: one unit's attempts in a row."""
    learned = list(learned)
    slots = limits.concurrency(spec)
    for row in learned:
        cap = row.learned.concurrency
        if not row.name.startswith(API) and cap is not None:
            slots = min(slots, cap)
    attempts = projection.attempts
    found = [Bound(by=f"{slots} slot(s)", seconds=projection.seconds / slots)]
    found += [
        Bound(by=f"limit {pace.limit.name}", seconds=attempts / pace.tasks_per_second)
        for pace in limits.paces(spec)
    ]
    for pace in limits.pace_fields(spec)["paces"]:
        if "api" not in pace:
            continue
        used = projection.apis.get(pace["api"])
        amount = sum(used.usage.get(key, 0.0) for key in pace["counts"]) if used else 0.0
        found.append(
            Bound(
                by=f"api {pace['api']} {limits.WINDOW_WORDS[pace['window']]}",
                seconds=amount / (pace["perMinute"] / 60),
            )
        )
    for row in learned:
        if row.name.startswith(API):
            used = projection.apis.get(row.name.removeprefix(API))
            amount = used.usage["requests"] if used else 0.0
        else:
            amount = attempts
        found.append(Bound(by=f"{label(row.name)} learned", seconds=amount / row.learned.rate))
    found.append(Bound(by="a unit's attempts in a row", seconds=unit_seconds))
    return tuple(sorted(found, key=lambda bound: -bound.seconds))


def budgets(spec: Spec, units: UnitHistory, projection: Projection) -> tuple[Budget, ...]:
    """``task.budget`` against a unit's p90 spend, and each API's budget against the
    run's p90 spend on it."""
    found = []
    if spec.task.budget_usd is not None:
        found.append(
            Budget(
                name="task.budget",
                budget_usd=spec.task.budget_usd,
                p90_usd=units.spend.p90,
                spent_all=units.over_budget,
            )
        )
    for api in spec.apis:
        if api.budget_usd is None:
            continue
        used = projection.apis.get(api.name)
        found.append(
            Budget(
                name=f"api {api.name} budget",
                budget_usd=api.budget_usd,
                p90_usd=used.spend.p90 if used else 0.0,
            )
        )
    return tuple(found)
