"""The hosts of a run, for its report: per SSH host, its slots, the attempts it ran and
how many of them were lost, how often the host was lost, and whether it was
quarantined (taken out of the run for good).

Attempts per host come from the journal.  Host states come from the run's event log
(``events.jsonl``: the SSH transport's ``host.up``, ``host.lost`` and
``host.quarantined`` events), the one place they are recorded; a log cut short by a
crash only loses the states of its last half second.  A run on this machine has no
hosts: its report has no hosts table.

A resumed run appends to the same log, and its transport starts afresh: a host
quarantined before the resume that comes up again (any event of it after
``run.resumed``) is in the run again, so it is no longer shown quarantined; one that
does not come back keeps its quarantine.  Attempts and times lost count every stretch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..values import safetext

LOCAL = ("", "local")


def hosts(attempts: Mapping[str, Mapping[str, int]], events_log: Path) -> list[dict[str, Any]]:
    """One record per host, in the order hosts first appear (the events, then attempts);
    ``attempts`` is ``Journal.host_attempts``.  Empty for a run without hosts."""
    found: dict[str, dict[str, Any]] = {}

    def host(name: str) -> dict[str, Any]:
        return found.setdefault(
            name,
            {
                "host": name,
                "slots": None,
                "attempts": 0,
                "lostAttempts": 0,
                "timesLost": 0,
                "quarantined": False,
                "reason": "",
            },
        )

    # Hosts quarantined in an earlier stretch of a resumed run, until they show up again.
    earlier: set[str] = set()
    for event in _host_events(events_log):
        if event["event"] == _RESUMED:
            earlier = {name for name, record in found.items() if record["quarantined"]}
            continue
        record = host(str(event["host"]))
        if record["host"] in earlier:
            earlier.discard(record["host"])
            record["quarantined"], record["reason"] = False, ""
        if event.get("slots") is not None:
            record["slots"] = event["slots"]
        if event["event"] == "host.quarantined":
            record["quarantined"] = True
            record["reason"] = str(event.get("reason", ""))
        elif event["event"] == "host.lost" and not record["quarantined"]:
            record["timesLost"] += 1
            record["reason"] = str(event.get("reason", ""))
    for name, by_status in attempts.items():
        if name in LOCAL and name not in found:
            continue
        record = host(name)
        record["attempts"] = sum(by_status.values())
        record["lostAttempts"] = by_status.get("lost", 0)
    return list(found.values())


_RESUMED = "run.resumed"


def _host_events(events_log: Path) -> list[dict[str, Any]]:
    """The host events of the log and each ``run.resumed`` between them, in order.  The
    log is read a block at a time and a block without either is skipped unsplit: a run
    on this machine has none, and its 100,000 units' log is 45 MB."""
    events: list[dict[str, Any]] = []
    try:
        with events_log.open("rb") as stream:
            rest = b""
            while block := stream.read(_BLOCK):
                block = rest + block
                cut = block.rfind(b"\n") + 1
                block, rest = block[:cut], block[cut:]
                events += _parsed(block)
            events += _parsed(rest)  # the last line of a log a crash cut short
    except FileNotFoundError:
        pass
    return events


_BLOCK = 1 << 20
_MARKS = (b'"event": "host.', f'"event": "{_RESUMED}"'.encode())


def _parsed(lines: bytes) -> list[dict[str, Any]]:
    """The host events and resumes among ``lines``, whole lines of the log."""
    if not any(mark in lines for mark in _MARKS):
        return []
    events = []
    for line in lines.split(b"\n"):
        # Most lines: skipped without parsing.
        if not any(mark in line for mark in _MARKS):
            continue
        try:
            event = json.loads(line.decode("utf-8", errors="replace"))
        except ValueError:  # a line a crash cut short
            continue
        if isinstance(event, dict) and ("host" in event or event.get("event") == _RESUMED):
            events.append(event)
    return events


def markdown(records: list[dict[str, Any]]) -> list[str]:
    """The hosts table of report.md (no lines for a run without hosts)."""
    if not records:
        return []
    md, code = safetext.for_markdown, safetext.code
    lines = [
        "| host | slots | attempts | lost attempts | times lost | quarantined |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for record in records:
        quarantined = f"yes: {md(record['reason'])}" if record["quarantined"] else "no"
        slots = "-" if record["slots"] is None else str(record["slots"])
        lines.append(
            f"| {code(record['host'])} | {slots} | {record['attempts']} "
            f"| {record['lostAttempts']} | {record['timesLost']} | {quarantined} |"
        )
    return [*lines, ""]
