"""The timeline of report.html: each attempt in a lane of its host, the throttle
pauses, and each API's requests per window against its declared and learned limits."""

from __future__ import annotations

import heapq
import json
from pathlib import Path
from typing import Any

from ..journal import Journal
from ..pacing.ceiling import Learned

# Events read from events.jsonl: the pauses of the rate gate and the gateway.
PAUSE_EVENTS = ("limit.paused", "api.throttled")
# At most this many pauses and windows are shown (a run throttled all day has more).
MAX_PAUSES = 2000
MAX_WINDOWS = 500


def read_events(path: Path) -> list[dict[str, Any]]:
    """The pause events of a run's event log (a line cut by a crash is skipped)."""
    found: list[dict[str, Any]] = []
    try:
        with path.open(encoding="utf-8", errors="replace") as stream:
            for line in stream:
                if '"limit.paused"' not in line and '"api.throttled"' not in line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("event") in PAUSE_EVENTS:
                    found.append(event)
    except OSError:
        return []
    return found


def lanes(attempts: list[list[Any]]) -> list[int]:
    """The lane of each attempt (rows as ``data.ATTEMPT_KEYS``, ordered by start) within
    its host: interval colouring, each attempt on the lowest lane free at its start.  An
    attempt still running holds its lane to the end of the run.  With N slots on a host
    no more than N attempts overlap there, so it uses at most N lanes."""
    free: dict[str, list[int]] = {}  # host -> free lanes (a heap)
    busy: dict[str, list[tuple[float, int]]] = {}  # host -> (end, lane) heap
    count: dict[str, int] = {}
    out: list[int] = []
    for row in attempts:
        host, start, end = row[4], row[5], row[6]
        running = busy.setdefault(host, [])
        spare = free.setdefault(host, [])
        while running and running[0][0] <= start:
            heapq.heappush(spare, heapq.heappop(running)[1])
        if spare:
            lane = heapq.heappop(spare)
        else:
            lane = count.get(host, 0)
            count[host] = lane + 1
        heapq.heappush(running, (float("inf") if end is None else end, lane))
        out.append(lane)
    return out


def pauses(events: list[dict[str, Any]]) -> list[list[Any]]:
    """Each pause as [limit, start, seconds, reason]: a limit's pause starts at its
    event; a gateway throttle's (``api:<name>``) at its event, for ``pause`` seconds."""
    found: list[list[Any]] = []
    for event in events[:MAX_PAUSES]:
        if event["event"] == "limit.paused":
            name, seconds = str(event.get("limit", "")), event.get("seconds") or 0
            reason = str(event.get("reason", ""))
        else:
            name, seconds = f"api:{event.get('api', '')}", event.get("pause") or 0
            reason = f"HTTP {event.get('status', '')} for {event.get('unit', '')}"
        found.append([name, event.get("time", 0), seconds, reason])
    return found


def api_windows(
    journal: Journal, run_id: str, summary: dict[str, Any], attempts: list[list[Any]]
) -> list[dict[str, Any]]:
    """Per API: requests per window (each attempt's requests spread evenly over its
    span: the journal keeps an attempt's count, not each request's time), the window
    being the learned one or a minute, with the learned and declared limits per window
    where the run recorded them."""
    spans = {(a[1], a[0], a[2]): (a[5], a[6] if a[6] is not None else a[5]) for a in attempts}
    per_api: dict[str, list[tuple[float, float, int]]] = {}
    for r in journal.attempt_requests(run_id):
        span = spans.get((r["round"], r["unit"], r["n"]))
        if span is not None and r["requests"]:
            per_api.setdefault(r["api"], []).append((span[0], span[1], r["requests"]))
    found = []
    limits = summary.get("limits") or {}
    for api, spans_of in sorted(per_api.items()):
        stats = limits.get(f"api:{api}") or {}
        learned = stats.get("learned") or {}
        window = float(learned.get("window") or 60.0)
        start = min(s for s, _, _ in spans_of)
        end = max(e for _, e, _ in spans_of)
        size = max(window, (end - start) / MAX_WINDOWS)
        counts = [0.0] * (int((end - start) / size) + 1)
        for begin, finish, requests in spans_of:
            _spread(counts, start, size, begin, finish, requests)
        found.append(
            {
                "api": api,
                "start": round(start, 3),
                "window": round(size, 3),
                "counts": [round(c, 1) for c in counts],
                "learned": _per_window(learned, size),
                "declared": _declared(stats, size),
                "text": str(stats.get("learnedText") or ""),
            }
        )
    return found


def _spread(
    counts: list[float], start: float, size: float, begin: float, end: float, n: int
) -> None:
    if end <= begin:
        counts[min(len(counts) - 1, int((begin - start) / size))] += n
        return
    first, last = int((begin - start) / size), min(len(counts) - 1, int((end - start) / size))
    for index in range(first, last + 1):
        lo, hi = max(begin, start + index * size), min(end, start + (index + 1) * size)
        counts[index] += n * max(0.0, hi - lo) / (end - begin)


def _per_window(learned: dict[str, Any], size: float) -> float | None:
    known = Learned.from_dict(learned)
    if known is None or known.window <= 0:
        return None
    return round(known.per_window * size / known.window, 3)


def _declared(stats: dict[str, Any], size: float) -> float | None:
    per_minute = stats.get("configuredPerMinute")
    return None if per_minute is None else round(float(per_minute) * size / 60.0, 3)
