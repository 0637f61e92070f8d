"""Spans over OTLP/HTTP (the otel extra): a real run exported to a real receiver on
loopback that decodes the protobuf (opentelemetry-proto), the span tree and attributes
asserted exactly; a dead collector costs the run its bound and one warning; without the
endpoint nothing is sent and opentelemetry is never imported."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fanout.events import Events
from fanout.journal import Journal
from fanout.outcome import ApiUsage, StopReason, Summary
from fanout.traces import BOUND_S, Tracer, settings_of, trace_id

from helpers import cli, events_of, only_run, write_job

trace_service_pb2 = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    reason="the otel extra (scripts/test installs it)",
)

# "ok" succeeds; "flaky" fails on the first rung and succeeds on the second; "bad"
# fails on both, saying why.
JOB = """\
version = 1
name = "traced"
[inputs]
items = ["ok", "flaky", "bad"]
[task]
command = ["sh", "-c", 'test "$0" = ok || {{ test "$0" = flaky && test "$1" = second; }} || {{ echo went wrong >&2; exit 3; }}', "{{{{ unit.id }}}}", "{{{{ rung.name }}}}"]
[runtime]
sandbox = "none"
[retry]
backoff = {{ initial = "10ms", max = "10ms", jitter = "none" }}
[[retry.ladder]]
name = "first"
[[retry.ladder]]
name = "second"
"""


class Receiver:
    """An OTLP/HTTP traces endpoint on 127.0.0.1 (port 0), served on a thread: each
    POST /v1/traces decoded into an ExportTraceServiceRequest."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.headers: list[dict[str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                assert self.path == "/v1/traces"
                assert self.headers["Content-Type"] == "application/x-protobuf"
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.requests.append(request)
                receiver.headers.append(dict(self.headers))
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> list[dict[str, Any]]:
        """Every span received, as a plain dict (ids in hex, attributes by key)."""
        found = []
        for request in self.requests:
            for resource in request.resource_spans:
                service = {a.key: _value(a.value) for a in resource.resource.attributes}
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        found.append(
                            {
                                "name": span.name,
                                "trace": span.trace_id.hex(),
                                "id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano,
                                "attributes": {a.key: _value(a.value) for a in span.attributes},
                                "status": (span.status.code, span.status.message),
                                "scope": scope.scope.name,
                                "service": service["service.name"],
                            }
                        )
        return found


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value"))


def closed_port() -> int:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        return int(closed.getsockname()[1])


@pytest.fixture
def traced_job(chdir_tmp: Path) -> Path:
    return write_job(chdir_tmp, JOB.format())


def tree(spans: list[dict[str, Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
    """The spans depth first from the root, children in start order (then by name)."""
    children: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        children.setdefault(span["parent"], []).append(span)

    def walk(parent: str, depth: int) -> Iterator[tuple[int, dict[str, Any]]]:
        below = children.get(parent, [])
        for span in sorted(
            below, key=lambda s: (s["attributes"].get("fanout.unit", ""), s["start"])
        ):
            yield depth, span
            yield from walk(span["id"], depth + 1)

    yield from walk("", 0)


OK = (0, "")  # STATUS_CODE_UNSET
ERROR = 2  # STATUS_CODE_ERROR
WENT_WRONG = "worker exited with status 3: went wrong"


def test_a_run_exports_its_span_tree_with_attributes_and_error_status(
    traced_job: Path, chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Receiver() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cret")
        ran = cli("run", str(traced_job))
    assert ran.code == 1
    run = only_run(chdir_tmp)
    spans = collector.spans()
    assert {h["authorization"] for h in collector.headers} == {"Bearer s3cret"}
    assert {(s["trace"], s["scope"], s["service"]) for s in spans} == {
        (f"{trace_id(run.id):032x}", "fanout", "fanout")
    }
    job = {"fanout.job": "traced", "fanout.run": run.id}
    r1 = {**job, "fanout.round": 1}
    assert [(depth, s["name"], s["attributes"], s["status"]) for depth, s in tree(spans)] == [
        (
            0,
            "run",
            {
                **job,
                "fanout.units.failed": 1,
                "fanout.units.succeeded": 2,
                "fanout.status": "finished",
                "fanout.exit_code": 1,
            },
            (ERROR, f"run {run.id} finished: 1 failed, 2 succeeded"),
        ),
        (1, "round", r1, OK),
        (
            2,
            "unit",
            {
                **r1,
                "fanout.unit": "bad",
                "fanout.status": "failed",
                "fanout.rung": "second",
                "fanout.attempts": 2,
            },
            (ERROR, WENT_WRONG),
        ),
        *[
            (
                3,
                "attempt",
                {
                    **r1,
                    "fanout.unit": "bad",
                    "fanout.attempt": n,
                    "fanout.rung": rung,
                    "fanout.host": "local",
                    "fanout.status": "failed",
                    "fanout.exit_code": 3,
                },
                (ERROR, WENT_WRONG),
            )
            for n, rung in ((1, "first"), (2, "second"))
        ],
        (
            2,
            "unit",
            {
                **r1,
                "fanout.unit": "flaky",
                "fanout.status": "succeeded",
                "fanout.rung": "second",
                "fanout.attempts": 2,
            },
            OK,
        ),
        (
            3,
            "attempt",
            {
                **r1,
                "fanout.unit": "flaky",
                "fanout.attempt": 1,
                "fanout.rung": "first",
                "fanout.host": "local",
                "fanout.status": "failed",
                "fanout.exit_code": 3,
            },
            (ERROR, WENT_WRONG),
        ),
        (
            3,
            "attempt",
            {
                **r1,
                "fanout.unit": "flaky",
                "fanout.attempt": 2,
                "fanout.rung": "second",
                "fanout.host": "local",
                "fanout.status": "succeeded",
                "fanout.exit_code": 0,
            },
            OK,
        ),
        (
            2,
            "unit",
            {
                **r1,
                "fanout.unit": "ok",
                "fanout.status": "succeeded",
                "fanout.rung": "first",
                "fanout.attempts": 1,
            },
            OK,
        ),
        (
            3,
            "attempt",
            {
                **r1,
                "fanout.unit": "ok",
                "fanout.attempt": 1,
                "fanout.rung": "first",
                "fanout.host": "local",
                "fanout.status": "succeeded",
                "fanout.exit_code": 0,
            },
            OK,
        ),
    ]
    # Every child lies within its parent, and each span is the journal's time.
    by_id = {s["id"]: s for s in spans}
    for span in spans:
        assert span["start"] <= span["end"]
        if span["parent"]:
            parent = by_id[span["parent"]]
            assert parent["start"] <= span["start"] <= span["end"] <= parent["end"]
    (root,) = [s for s in spans if s["name"] == "run"]
    assert root["start"] == int(run.started * 1e9)
    assert root["end"] == int(run.finished * 1e9)
    assert events_of(chdir_tmp, run.id, "traces.exported") == [
        {"event": "traces.exported", "spans": 10, "to": collector.url}
    ]
    assert f"exported 10 span(s) to {collector.url}" in ran.err
    assert "s3cret" not in ran.err + ran.out


def test_usage_is_summed_from_attempt_to_unit_round_and_run(
    traced_job: Path, chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert cli("run", str(traced_job)).code == 1
    run = only_run(chdir_tmp)
    path = chdir_tmp / ".fanout" / "journal.sqlite"
    journal = Journal(path)
    spent = ApiUsage(api="claude", requests=2, input_tokens=120, output_tokens=30, cost_usd=0.25)
    other = ApiUsage(api="openai", requests=1, input_tokens=5, output_tokens=7, cost_usd=0.5)
    journal.record_usages(run.id, [(1, "flaky", 1, [spent]), (1, "flaky", 2, [spent, other])])
    journal.close()
    with Receiver() as collector:
        settings = settings_of({"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url + "/"})
        assert settings is not None
        seen: list[dict[str, Any]] = []
        summary = Summary(
            run_id=run.id,
            reason=StopReason.LAST_ROUND,
            counts={"failed": 1, "succeeded": 2},
            report_dir=chdir_tmp,
        )
        tracer = Tracer(settings, journal_path=path, events=Events(seen.append))
        asyncio.run(tracer(summary))
    usage = {
        (s["name"], s["attributes"].get("fanout.unit"), s["attributes"].get("fanout.attempt")): (
            s["attributes"].get("fanout.tokens.input"),
            s["attributes"].get("fanout.tokens.output"),
            s["attributes"].get("fanout.cost_usd"),
        )
        for s in collector.spans()
    }
    assert usage == {
        ("run", None, None): (245, 67, 1.0),
        ("round", None, None): (245, 67, 1.0),
        ("unit", "bad", None): (None, None, None),
        ("attempt", "bad", 1): (None, None, None),
        ("attempt", "bad", 2): (None, None, None),
        ("unit", "flaky", None): (245, 67, 1.0),
        ("attempt", "flaky", 1): (120, 30, 0.25),
        ("attempt", "flaky", 2): (125, 37, 0.75),
        ("unit", "ok", None): (None, None, None),
        ("attempt", "ok", 1): (None, None, None),
    }
    assert [e["event"] for e in seen] == ["traces.exported"]


def test_a_dead_collector_costs_the_run_its_bound_and_one_warning(
    traced_job: Path, chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = closed_port()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}/secret/path")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    ran = cli("run", str(traced_job))
    assert ran.code == 1
    run = only_run(chdir_tmp)
    (failed,) = events_of(chdir_tmp, run.id, "traces.failed")
    assert (failed["spans"], failed["to"]) == (0, f"http://127.0.0.1:{port}")
    assert failed["reason"].endswith("(sent 0 of 10 spans)"), failed["reason"]
    assert "/secret/path" not in failed["reason"]
    log = (chdir_tmp / ".fanout" / "runs" / run.id / "events.jsonl").read_text().splitlines()
    times = {json.loads(line)["event"]: json.loads(line)["time"] for line in log}
    waited = times["traces.failed"] - times["run.finished"]
    assert waited < 1 + 1.5, waited
    (line,) = [x for x in ran.err.splitlines() if "spans" in x]
    assert line.split(" ", 1)[1] == (
        f"could not export spans to http://127.0.0.1:{port}: {failed['reason']} (the run's"
        " result stands)"
    )
    assert "Traceback" not in ran.err


@pytest.mark.slow  # a fanout process of its own
def test_without_the_endpoint_nothing_is_sent_and_opentelemetry_is_not_imported(
    traced_job: Path, chdir_tmp: Path
) -> None:
    probe = (
        "import sys\n"
        "from fanout.cli import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exit:\n"
        "    loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'opentelemetry')\n"
        "    print('LOADED', loaded, exit.code)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    with Receiver() as collector:
        done = subprocess.run(
            [sys.executable, "-c", probe, "run", str(traced_job)],
            capture_output=True,
            text=True,
            env=env,
            cwd=chdir_tmp,
            timeout=60,
            check=False,
        )
        assert collector.requests == []
    assert done.stdout.splitlines()[-1] == "LOADED [] 1", done.stdout + done.stderr
    run = only_run(chdir_tmp)
    assert [e for e in events_of(chdir_tmp, run.id, "traces.exported")] == []


def test_the_settings_follow_the_standard_variables() -> None:
    assert settings_of({}) is None
    assert (
        settings_of({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
        is None
    )
    assert (
        settings_of(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}
        )
        is None
    )
    got = settings_of(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/",
            "OTEL_EXPORTER_OTLP_HEADERS": "X-Key=a%3Db, broken ,y=2",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2.5",
            "OTEL_SERVICE_NAME": "nightly",
        }
    )
    assert got is not None
    assert (got.url, dict(got.headers), got.timeout_s, got.service, got.shown) == (
        "http://c:4318/v1/traces",
        {"x-key": "a=b", "y": "2"},
        2.5,
        "nightly",
        "http://c:4318",
    )
    assert "a=b" not in repr(got)
    traces = settings_of(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://u:p@t.example:443/x?k=1",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "10000",
        }
    )
    assert traces is not None
    assert (traces.url, traces.shown, traces.timeout_s) == (
        "https://u:p@t.example:443/x?k=1",
        "https://t.example:443",
        BOUND_S,
    )


@pytest.mark.slow  # a fanout process of its own
def test_without_the_extra_the_run_says_so_once_and_succeeds(
    traced_job: Path, chdir_tmp: Path
) -> None:
    # A directory that shadows the opentelemetry namespace, as if it were not installed.
    blocker = chdir_tmp / "blocked"
    blocker.mkdir()
    (blocker / "opentelemetry.py").write_text("raise ImportError('not installed')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{closed_port()}"
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "fanout", "run", str(traced_job)],
        capture_output=True,
        text=True,
        env=env,
        cwd=chdir_tmp,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    said = [line for line in done.stderr.splitlines() if "spans" in line]
    assert [line.split(" ", 1)[1] for line in said] == [
        "spans are not exported: OTEL_EXPORTER_OTLP_ENDPOINT is set but the otel extra is"
        " not installed (pip install 'fanout[otel]')"
    ]
    assert "Traceback" not in done.stderr
