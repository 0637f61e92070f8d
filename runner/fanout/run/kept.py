"""What a job's limits learned, kept from one run to the next (``journal.ceilings``):
the ceilings a new run's rate gate and gateway start from, what each round's end and
the run's end keep, the APIs' rows of the run's limit statistics, and what a run says
of its limits as it starts (the live line names the pace from its first start)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..events import Events
from ..journal import Journal, KeptCeiling
from ..journal.ceilings import API, label
from ..pacing.ceiling import Learned, describe
from ..pacing.limits import ALL, Gate, RateGate
from ..spec import Spec

if TYPE_CHECKING:  # the gateway (and aiohttp) load only for a job with [[apis]]
    from ..gateway import Gateway


def applies(name: str, spec: Spec) -> bool:
    """Whether a kept name is one of ``spec``'s limits now: an API it has, a limit its
    task uses, or all dispatch when it uses none."""
    if name.startswith(API):
        return any(api.name == name.removeprefix(API) for api in spec.apis)
    names = {limit.name for limit in spec.task_limits()}
    return name in names if names else name == ALL


def kept(journal: Journal, spec: Spec) -> list[KeptCeiling]:
    """What earlier runs of ``spec``'s job learned that its next run starts from."""
    return [row for row in journal.kept_ceiling_rows(spec.name) if applies(row.name, spec)]


def seeds(journal: Journal, spec: Spec) -> tuple[dict[str, Learned], dict[str, Learned]]:
    """The kept ceilings a run starts from: the rate gate's (by limit name, ``*`` all
    dispatch) and the gateway's (by API name)."""
    gate: dict[str, Learned] = {}
    apis: dict[str, Learned] = {}
    for row in kept(journal, spec):
        if row.name.startswith(API):
            apis[row.name.removeprefix(API)] = row.learned
        else:
            gate[row.name] = row.learned
    return gate, apis


def learned(gate: Gate, gateway: Gateway | None) -> dict[str, tuple[Learned, str]]:
    """What the run's limits know now, by kept name, with the text that says it."""
    stats = gate.stats()
    found = {
        name: (known, stats.get(name, {}).get("learnedText") or describe(known))
        for name, known in gate.learned().items()
    }
    if gateway is not None:
        for api, (known, text) in gateway.learned().items():
            found[API + api] = (known, text)
    return found


def save(journal: Journal, spec: Spec, gate: Gate, gateway: Gateway | None, run_id: str) -> None:
    """Keep what the run's limits know for the job's next run."""
    journal.save_ceilings(spec.name, learned(gate, gateway), run_id=run_id)


def limit_stats(gate: Gate, gateway: Gateway | None) -> dict[str, dict[str, Any]]:
    """The run's limit statistics (``Gate.stats``), and a row per API whose gateway
    window learned its ceiling: ``api:<name>`` with ``learned`` and ``learnedText``."""
    stats = gate.stats()
    if gateway is not None:
        for api, (known, text) in gateway.learned().items():
            stats[API + api] = {"learned": known.as_dict(), "learnedText": text}
    return stats


def tell(events: Events, spec: Spec, gate: Gate, gateway: Gateway | None) -> None:
    """Say what the run's limits start from, as the events their changes emit later
    do (``limit.learned``, ``api.learned``, ``limit.ramp``), marked ``kept`` where an
    earlier run learned it: the gate and the gateway say a change only."""
    for name, (known, text) in learned(gate, gateway).items():
        fields: dict[str, Any] = {
            "perWindow": round(known.per_window, 3),
            "window": round(known.window, 3),
            "throttles": known.throttles,
            "concurrency": known.concurrency,
            "text": text,
            "kept": True,
        }
        if name.startswith(API):
            events.emit("api.learned", api=name.removeprefix(API), **fields)
        else:
            events.emit("limit.learned", limit=label(name), **fields)
    if isinstance(gate, RateGate):
        for name in gate.ramping():
            events.emit("limit.ramp", limit=name, ramping=True)
