"""What a notification says: which endings a run's summary is (``endings``), and the
message for them (``compose``), a Slack-compatible JSON object: ``text`` for a person
(Slack's mrkdwn, with ``&``, ``<`` and ``>`` escaped, so nothing in it becomes a link
or a mention), and the same facts under ``fanout`` for a program.

Safe to paste: every string is redacted of the job's secrets first (``redact``: a
multi-line value whole and line by line, gateway tokens by their shape), then made one
visible line (``safetext``) and cut to the size its place holds, so a secret is never
shown in part.  The text is built from those facts only, and the whole message stays
under about 8 KiB: a notification says what happened and where the report is, it is
not the report.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ExitCode
from ..outcome import StopReason, Summary
from ..spec import NotifyEvent, Spec
from ..values.quantities import format_duration
from ..values.redact import redact_text
from ..values.safetext import shorten, visible

# The failed units a message lists (the report lists them all), and how many characters
# each place keeps.
FAILURES_SHOWN = 5
UNIT_CHARS = 120
REASON_CHARS = 300
NOTE_CHARS = 600
LINE_CHARS = 300
TEXT_CHARS = 3000

_HEADLINES = {
    NotifyEvent.FINISHED: "finished",
    NotifyEvent.FAILED: "failed",
    NotifyEvent.PARKED: "parked",
    NotifyEvent.SPEND: "stopped on spend",
    NotifyEvent.QUARANTINED: "quarantined units",
}


def endings(summary: Summary) -> tuple[NotifyEvent, ...]:
    """Every ending ``summary`` is, its outcome first (finished, failed, parked or
    spend), then quarantined if the run quarantined units.  None for a run that was
    interrupted (Ctrl-C, SIGTERM, a closed console): someone stopped it on purpose, and
    it is resumable."""
    stopped = summary.stopped_by
    outcome: NotifyEvent | None
    if stopped is ExitCode.INTERRUPTED or summary.reason is StopReason.INTERRUPTED:
        return ()
    if stopped is ExitCode.PARKED:
        outcome = NotifyEvent.PARKED
    elif stopped is ExitCode.SPEND_STOPPED:
        outcome = NotifyEvent.SPEND
    elif stopped is not None or summary.exit_code == ExitCode.FAILED:
        outcome = NotifyEvent.FAILED
    else:  # every unit succeeded, or nothing was selected
        outcome = NotifyEvent.FINISHED
    if summary.quarantined > 0:
        return (outcome, NotifyEvent.QUARANTINED)
    return (outcome,)


@dataclass(frozen=True, kw_only=True, slots=True)
class Failure:
    """A failed unit as a message lists it."""

    unit: str
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Message:
    """A notification, ready to send: ``payload`` is the JSON object."""

    events: tuple[NotifyEvent, ...]
    payload: Mapping[str, Any]

    def body(self) -> bytes:
        return json.dumps(self.payload, ensure_ascii=False).encode("utf-8")

    def environment(self) -> dict[str, str]:
        """The ``FANOUT_*`` variables a notify command gets."""
        facts = self.payload["fanout"]
        return {
            "FANOUT_JOB": facts["job"],
            "FANOUT_RUN_ID": facts["run"],
            "FANOUT_EVENT": facts["event"],
            "FANOUT_EVENTS": ",".join(facts["events"]),
            "FANOUT_STATE": facts["state"],
            "FANOUT_EXIT_CODE": str(facts["exitCode"]),
            "FANOUT_REPORT": facts["report"],
        }


def compose(
    spec: Spec,
    summary: Summary,
    events: Sequence[NotifyEvent],
    *,
    failures: Sequence[Failure],
    failed: int,
    host: str,
    redacted: Sequence[str],
) -> Message:
    """The message telling of ``summary``'s ``events`` (those of its endings the job's
    ``notify.on`` names, at least one): ``failures`` are the first failed units of
    ``failed`` in all, ``redacted`` the secret values no string may hold."""
    assert events, "a message tells of at least one ending"

    def clean(text: str, limit: int) -> str:
        return shorten(visible(" ".join(redact_text(text, redacted).split())), limit)

    trigger = summary.trigger.get("name") if summary.trigger else None
    facts: dict[str, Any] = {
        "job": clean(spec.name, LINE_CHARS),
        "run": clean(summary.run_id, LINE_CHARS),
        "event": str(events[0]),
        "events": [str(event) for event in events],
        "state": str(summary.state),
        "exitCode": summary.exit_code,
        "counts": {clean(k, LINE_CHARS): n for k, n in sorted(summary.counts.items())},
        "quarantined": summary.quarantined,
        "wallSeconds": round(summary.wall_seconds, 1),
        "report": clean(str(summary.report_dir / "report.md"), LINE_CHARS),
        "note": clean(summary.note, NOTE_CHARS),
        "failed": [
            {"unit": clean(f.unit, UNIT_CHARS), "reason": clean(f.reason, REASON_CHARS)}
            for f in failures[:FAILURES_SHOWN]
        ],
        "failedCount": failed,
        "host": clean(host, LINE_CHARS),
        "trigger": clean(str(trigger), LINE_CHARS) if trigger else None,
    }
    text = shorten(_text(facts, summary), TEXT_CHARS)
    return Message(events=tuple(events), payload={"text": text, "fanout": facts})


def _text(facts: Mapping[str, Any], summary: Summary) -> str:
    """The message for a person, from the facts alone (already redacted and cut)."""
    headline = _HEADLINES[NotifyEvent(facts["event"])]
    if summary.reason is StopReason.NOTHING_SELECTED:
        headline += ": nothing selected"
    by = f" ({facts['trigger']})" if facts["trigger"] else ""
    lines = [
        f"fanout: job {facts['job']}{by} {headline}, exit {facts['exitCode']}"
        f" (run {facts['run']} on {facts['host']})"
    ]
    counts = ", ".join(f"{n} {state}" for state, n in facts["counts"].items()) or "no units"
    if facts["quarantined"]:
        counts += f"; {facts['quarantined']} newly quarantined"
    lines.append(f"{counts}; wall {format_duration(facts['wallSeconds'])}")
    if facts["note"]:
        lines.append(facts["note"])
    if facts["failed"]:
        shown = len(facts["failed"])
        more = f" (first {shown} of {facts['failedCount']})" if facts["failedCount"] > shown else ""
        lines.append(f"Failed units{more}:")
        lines += [f"• {f['unit']}: {f['reason'] or 'no reason recorded'}" for f in facts["failed"]]
    lines.append(f"Report: {facts['report']}")
    return "\n".join(_slack_escaped(line) for line in lines)


def _slack_escaped(text: str) -> str:
    """``text`` as Slack's mrkdwn shows it literally: ``<`` opens a link or a mention
    (``<!channel>``), ``&`` an entity; Slack asks for these three escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
