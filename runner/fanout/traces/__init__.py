"""Spans of each run for the dashboards users already have (the ``fanout[otel]``
extra): a run, its rounds, units and attempts exported over OTLP/HTTP (protobuf) with
the OpenTelemetry SDK when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set; ``Tracer`` is the ``Runner.ended`` hook
launch adds beside notify's and publish's.

Built once a run's stretch has ended, from the journal, not from the run's events as
they happen.  The journal already holds every fact a span needs with its real times
(attempts' start and end, host, rung, status, classified kind, reason; units' fates;
the usage rows' tokens and cost), so one reader covers every transport (local, SSH,
Ray) and resumed runs alike, and nothing is added to the dispatch path that each
attempt crosses: a run without the endpoint set pays nothing, and never imports
opentelemetry (``fanout --version`` stays fast).  Hooking the events instead would need
spans kept open across the whole run (100k units of them) and would lose the attempts
of a coordinator killed before it could end them; read back at the end, a stretch that
a SIGKILL cut short shows its unsettled attempts in the next stretch, which settled
them (``journal.stretches``).

What is exported is the stretch that just ended (a run's start or resume to its
end): a resumed run adds a stretch, never sends the same span twice.  Every stretch of
a run shares one trace id, derived from the run id (``trace_id``), so a trace is found
by the run.  A stretch ended by Ctrl-C or SIGTERM is not exported, as it is not
notified: someone stopped it on purpose and a second Ctrl-C must not wait on a
collector.

Bounded: the export runs in a thread of its own, reading the journal through a
connection of its own row by row; spans are ended as they are read and the SDK's
``BatchSpanProcessor`` is flushed every ``otlp.FLUSH_EVERY`` spans, so memory holds a
batch, never the run.  Each request waits at most ``BOUND_S`` seconds (less when
``OTEL_EXPORTER_OTLP_TIMEOUT`` says so) and the first request that fails ends the
export: a dead collector costs the run about ``BOUND_S``, and one warning
(``traces.failed``), never its result.  The export cannot leak a secret: unit ids and
reasons are redacted in the journal, and the headers (which may hold a token) are
neither logged nor shown (the endpoint is shown as its scheme, host and port).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..events import Events
from ..outcome import Summary

__all__ = ["BOUND_S", "Settings", "Tracer", "settings_of", "trace_id"]

# The longest fanout waits for one export request, retries included (seconds).
BOUND_S = 5.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    """Where and how spans go, from the standard OTEL_* variables: ``url`` the full
    traces URL, ``headers`` sent with each request (never shown), ``timeout_s`` each
    request's bound, ``service`` the resource's ``service.name``."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout_s: float = BOUND_S
    service: str = "fanout"

    @property
    def shown(self) -> str:
        """The collector as events name it: scheme, host and port (a URL's user,
        path or query may hold a key)."""
        parts = urllib.parse.urlsplit(self.url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}"


def settings_of(environ: Mapping[str, str]) -> Settings | None:
    """The export ``environ`` asks for, or None: no endpoint set, ``OTEL_SDK_DISABLED``
    true, or ``OTEL_TRACES_EXPORTER`` naming no ``otlp``."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters and "otlp" not in {name.strip() for name in exporters.split(",")}:
        return None
    url = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if not url:
        base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        if not base:
            return None
        url = base.removesuffix("/") + "/v1/traces"
    headers = _headers(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
        or environ.get("OTEL_EXPORTER_OTLP_HEADERS", "")
    )
    timeout = environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or environ.get(
        "OTEL_EXPORTER_OTLP_TIMEOUT", ""
    )
    try:
        # Seconds, as the Python SDK reads it; never more than the bound.
        timeout_s = min(BOUND_S, float(timeout)) if timeout.strip() else BOUND_S
    except ValueError:
        timeout_s = BOUND_S
    if timeout_s <= 0:
        timeout_s = BOUND_S
    service = environ.get("OTEL_SERVICE_NAME", "").strip() or "fanout"
    return Settings(url=url, headers=headers, timeout_s=timeout_s, service=service)


def _headers(text: str) -> dict[str, str]:
    """``key=value,key=value`` (values percent-encoded), what the standard variable
    holds; a pair without ``=`` is skipped."""
    headers = {}
    for pair in text.split(","):
        key, equals, value = pair.partition("=")
        if equals and key.strip():
            headers[key.strip().lower()] = urllib.parse.unquote(value.strip())
    return headers


def trace_id(run_id: str) -> int:
    """The trace id of every stretch of run ``run_id``: the first 128 bits of its
    SHA-256 (a run's trace is found from its id)."""
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:16], "big") or 1


class Tracer:
    """Exports the spans of each run that ends (``Runner.ended``); never raises but
    CancelledError, never changes the run's result.  Its events: ``traces.exported``
    (spans, to), ``traces.failed`` (to, reason), and a ``notice`` when the extra is not
    installed."""

    def __init__(self, settings: Settings, *, journal_path: Path, events: Events) -> None:
        self.settings = settings
        self.journal_path = journal_path
        self.events = events

    async def __call__(self, summary: Summary) -> None:
        stop = threading.Event()
        try:
            spans, failure = await asyncio.to_thread(self._export, summary, stop)
        except asyncio.CancelledError:
            stop.set()  # the thread ends at its next span, its request within the bound
            raise
        except Exception as exc:  # a bug here must not cost the run its result
            spans, failure = 0, f"fanout internal error: {type(exc).__name__}"
        if failure is None:
            self.events.emit("traces.exported", spans=spans, to=self.settings.shown)
        elif failure == _MISSING:
            self.events.emit("notice", message=_MISSING)
        else:
            self.events.emit("traces.failed", spans=spans, to=self.settings.shown, reason=failure)

    def _export(self, summary: Summary, stop: threading.Event) -> tuple[int, str | None]:
        try:
            from . import otlp
        except ImportError:
            return 0, _MISSING
        return otlp.export(
            self.settings,
            journal_path=self.journal_path,
            summary=summary,
            trace=trace_id(summary.run_id),
            stop=stop,
        )


_MISSING = (
    "spans are not exported: OTEL_EXPORTER_OTLP_ENDPOINT is set but the otel extra is"
    " not installed (pip install 'fanout[otel]')"
)
