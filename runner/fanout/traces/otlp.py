"""The OpenTelemetry SDK's side of ``traces``, the one module that imports
opentelemetry: a stretch of a run read from the journal, ended span by span into a
``BatchSpanProcessor`` over an ``OTLPSpanExporter`` (http/protobuf).

The tree: ``run`` -> ``round`` -> ``unit`` -> ``attempt``, each with its real start and
end (a round and a unit from the first start to the last end of their attempts), and
the attributes ``docs/guides/tracing.md`` lists.  A failed unit and an attempt that did
not succeed have status ERROR with the journal's (redacted) reason; a run whose exit
code is not 0 too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from .. import __version__
from ..journal import Journal, Stretch, StretchAttempt
from ..outcome import Summary
from ..values.redact import redact_text
from . import Settings

# Spans ended between two flushes: half the processor's queue, so none is ever dropped
# for a full queue, and memory holds at most that many.
QUEUE = 2048
FLUSH_EVERY = QUEUE // 2
# The longest reason a span's status carries (a reason is one line, but a worker's).
REASON_CHARS = 500

# Where the SDK logs: fanout says what failed once, as an event, and a library's
# records are not printed by logging's last resort.
logging.getLogger("opentelemetry").addHandler(logging.NullHandler())


def export(
    settings: Settings, *, journal_path: Path, summary: Summary, trace: int, stop: threading.Event
) -> tuple[int, str | None]:
    """Export the latest stretch of ``summary``'s run: the spans the collector took,
    and why the export ended early (None: it did not)."""
    guarded = _Guarded(
        OTLPSpanExporter(
            endpoint=settings.url, headers=dict(settings.headers), timeout=settings.timeout_s
        )
    )
    processor = BatchSpanProcessor(
        guarded, max_queue_size=QUEUE, max_export_batch_size=512, schedule_delay_millis=60_000
    )
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": settings.service, "service.version": __version__}
        ),
        id_generator=_RunTrace(trace),
        sampler=ALWAYS_ON,
        shutdown_on_exit=False,
    )
    provider.add_span_processor(processor)
    caught = _Caught()
    logger = logging.getLogger("opentelemetry")
    logger.addHandler(caught)
    journal = Journal(journal_path, read_only=True)
    try:
        stretch = journal.stretch(summary.run_id)
        spans = _Spans(provider.get_tracer("fanout", __version__), stretch, summary)
        for attempt in journal.stretch_attempts(stretch):
            if stop.is_set() or guarded.failed:
                break
            if spans.add(attempt) >= FLUSH_EVERY:
                spans.ended = 0
                processor.force_flush()
        else:
            spans.close()
        processor.force_flush()
    finally:
        journal.close()
        guarded.failed = True  # what is still queued is dropped, not retried at shutdown
        provider.shutdown()
        logger.removeHandler(caught)
    if stop.is_set():
        return guarded.sent, "the run was interrupted while its spans were exported"
    if guarded.sent < spans.total or caught.reason:
        # The URL's path and query, and the headers, may hold a key.
        said = redact_text(caught.reason, settings.headers.values()).replace(
            settings.url, settings.shown
        )
        said = said or "it took no more"
        return guarded.sent, f"{said} (sent {guarded.sent} of {spans.total} spans)"
    return guarded.sent, None


class _Spans:
    """The stretch's spans, opened and ended as its attempts are read in order."""

    def __init__(self, tracer: trace.Tracer, stretch: Stretch, summary: Summary) -> None:
        self.tracer = tracer
        self.stretch = stretch
        self.summary = summary
        self.ended = self.total = 0
        self.end = stretch.ended if stretch.ended is not None else stretch.began
        common = {"fanout.job": stretch.job, "fanout.run": stretch.run}
        self.common = common
        began = min([stretch.began, *(first for first, _ in stretch.rounds.values())])
        self.run = self._open("run", None, began, common)
        self.round: trace.Span | None = None
        self.round_number = 0
        self.round_usage = _Usage()
        self.unit: trace.Span | None = None
        self.unit_key: tuple[int, str] | None = None
        self.unit_usage = _Usage()
        self.run_usage = _Usage()
        self.unit_last: StretchAttempt | None = None

    def add(self, attempt: StretchAttempt) -> int:
        """Open the round and the unit ``attempt`` is in (ending those it left), add its
        span; the spans ended since the last flush."""
        if self.round is None or attempt.round != self.round_number:
            self._end_unit()
            self._end_round()
            first, _ = self.stretch.rounds[attempt.round]
            self.round_number = attempt.round
            attributes = {**self.common, "fanout.round": attempt.round}
            self.round = self._open("round", self.run, first, attributes)
        if self.unit_key != (attempt.round, attempt.unit):
            self._end_unit()
            self.unit_key = (attempt.round, attempt.unit)
            attributes = {
                **self.common,
                "fanout.round": attempt.round,
                "fanout.unit": attempt.unit,
                "fanout.status": attempt.unit_state,
            }
            self.unit = self._open("unit", self.round, attempt.started, attributes)
            if attempt.unit_state == "failed":
                self.unit.set_status(trace.StatusCode.ERROR, attempt.unit_reason[:REASON_CHARS])
        attributes = {
            **self.common,
            "fanout.round": attempt.round,
            "fanout.unit": attempt.unit,
            "fanout.attempt": attempt.n,
            "fanout.rung": attempt.rung,
            "fanout.host": attempt.host,
            "fanout.status": attempt.status,
        }
        if attempt.kind:
            attributes["fanout.kind"] = attempt.kind
        if attempt.exit_code is not None:
            attributes["fanout.exit_code"] = attempt.exit_code
        usage = _Usage()
        if attempt.used:
            usage.add(attempt.input_tokens, attempt.output_tokens, attempt.cost_usd)
            attributes.update(usage.attributes())
        span = self._open("attempt", self.unit, attempt.started, attributes)
        if attempt.status != "succeeded":
            span.set_status(trace.StatusCode.ERROR, attempt.reason[:REASON_CHARS])
        finished = attempt.finished if attempt.finished is not None else self.end
        self._end(span, finished)
        for total in (self.unit_usage, self.round_usage, self.run_usage):
            total.merge(usage, finished)
        self.unit_last = attempt
        return self.ended

    def close(self) -> None:
        self._end_unit()
        self._end_round()
        for state, count in sorted(self.summary.counts.items()):
            self.run.set_attribute(f"fanout.units.{state}", count)
        self.run.set_attribute("fanout.status", str(self.summary.state))
        self.run.set_attribute("fanout.exit_code", self.summary.exit_code)
        self.run.set_attributes(self.run_usage.attributes())
        if self.summary.exit_code != 0:
            self.run.set_status(trace.StatusCode.ERROR, self.summary.describe())
        self._end(self.run, max(self.end, self.run_usage.last))

    def _end_unit(self) -> None:
        if self.unit is None or self.unit_last is None:
            return
        self.unit.set_attribute("fanout.rung", self.unit_last.rung)
        self.unit.set_attribute("fanout.attempts", self.unit_last.n)
        self.unit.set_attributes(self.unit_usage.attributes())
        self._end(self.unit, self.unit_usage.last)
        self.unit, self.unit_last, self.unit_usage = None, None, _Usage()

    def _end_round(self) -> None:
        if self.round is None:
            return
        self.round.set_attributes(self.round_usage.attributes())
        self._end(self.round, self.round_usage.last)
        self.round, self.round_usage = None, _Usage()

    def _open(
        self, name: str, parent: trace.Span | None, at: float, attributes: dict[str, Any]
    ) -> trace.Span:
        context = trace.set_span_in_context(parent) if parent is not None else Context()
        return self.tracer.start_span(
            name, context=context, attributes=attributes, start_time=_ns(at)
        )

    def _end(self, span: trace.Span, at: float) -> None:
        span.end(end_time=_ns(at))
        self.ended += 1
        self.total += 1


class _Usage:
    """Tokens and cost summed over attempts (``used``: any was recorded), and the last
    end among them."""

    def __init__(self) -> None:
        self.used = False
        self.input_tokens = self.output_tokens = 0
        self.cost_usd = 0.0
        self.last = 0.0

    def add(self, input_tokens: int, output_tokens: int, cost_usd: float) -> None:
        self.used = True
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cost_usd += cost_usd

    def merge(self, other: _Usage, finished: float) -> None:
        if other.used:
            self.add(other.input_tokens, other.output_tokens, other.cost_usd)
        self.last = max(self.last, finished)

    def attributes(self) -> dict[str, Any]:
        if not self.used:
            return {}
        return {
            "fanout.tokens.input": self.input_tokens,
            "fanout.tokens.output": self.output_tokens,
            "fanout.cost_usd": round(self.cost_usd, 6),
        }


class _Guarded(SpanExporter):
    """The OTLP exporter, until its first failed request: after it every batch fails at
    once, so a dead collector costs one request's bound, not one per batch."""

    def __init__(self, inner: OTLPSpanExporter) -> None:
        self.inner = inner
        self.failed = False
        self.sent = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.failed:
            return SpanExportResult.FAILURE
        result = self.inner.export(spans)
        if result is SpanExportResult.SUCCESS:
            self.sent += len(spans)
        else:
            self.failed = True
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()  # type: ignore[no-untyped-call]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class _RunTrace(RandomIdGenerator):
    """Random span ids in the run's own trace."""

    def __init__(self, trace_id: int) -> None:
        self.trace_id = trace_id

    def generate_trace_id(self) -> int:
        return self.trace_id


class _Caught(logging.Handler):
    """The first error the SDK logged while exporting: why a request failed."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.reason = ""

    def emit(self, record: logging.LogRecord) -> None:
        if not self.reason:
            self.reason = record.getMessage().splitlines()[0][:REASON_CHARS]


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)
