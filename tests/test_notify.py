"""[notify]: a run's ending told to a webhook (a real HTTP receiver on loopback) and to a
command, once per run, with the exact message; what fails is one logged line and never
the run's exit code; secrets never reach the message."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fanout import spec
from fanout.errors import ExitCode, FanoutError, Parked, SpendStopped
from fanout.events import Events
from fanout.journal import Journal
from fanout.notify import Notifier, Secrets, message
from fanout.notify.message import Failure
from fanout.outcome import StopReason, Summary
from fanout.run import launch
from fanout.run.job import Options
from fanout.schedule.scheduler import Fire
from fanout.spec import NotifyEvent

from fakes import FakeTransport
from helpers import cli, events_of, make_runner, only_run, write_job

HOST = socket.gethostname()


class Receiver:
    """A webhook on 127.0.0.1 (port 0), served on a thread: it records every request
    (method, path, headers, body) and answers ``status`` with ``body``, or, with
    ``hang``, never answers until the test is over."""

    def __init__(
        self,
        *,
        status: int = 200,
        body: bytes = b"ok",
        hang: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                receiver.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": self.rfile.read(length),
                    }
                )
                if hang:
                    receiver.release.wait()
                    return
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a hung answer's client is gone when it is released

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T0/B0/abc"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def messages(self) -> list[dict[str, Any]]:
        return [json.loads(request["body"]) for request in self.requests]


# A unit "ok" that succeeds and any other that fails, saying why on stderr.
WORKER = """command = ["sh", "-c", 'test "$0" = ok || { echo went wrong >&2; exit 3; }', "{{ unit.id }}"]"""


def notify_job(directory: Path, notify: str, *, items: tuple[str, ...] = ("ok", "bad")) -> Path:
    text = (
        'version = 1\nname = "nightly"\n[inputs]\n'
        f"items = {json.dumps(list(items))}\n[task]\n{WORKER}\n"
        '[runtime]\nsandbox = "none"\n[notify]\n' + notify.strip() + "\n"
    )
    return write_job(directory, text)


def failed_run_message(directory: Path, run: Any, *, events: list[str]) -> dict[str, Any]:
    """The exact message of the run of ``notify_job`` whose unit "bad" failed."""
    report = f"{directory.resolve()}/.fanout/runs/{run.id}/report.md"
    return {
        "text": (
            f"fanout: job nightly failed, exit 1 (run {run.id} on {HOST})\n"
            f"1 failed, 1 succeeded; wall {round(run.wall, 1):.1f}s\n"
            "Failed units:\n"
            "• bad: worker exited with status 3: went wrong\n"
            f"Report: {report}"
        ),
        "fanout": {
            "job": "nightly",
            "run": run.id,
            "event": events[0],
            "events": events,
            "state": "finished",
            "exitCode": 1,
            "counts": {"failed": 1, "succeeded": 1},
            "quarantined": 0,
            "wallSeconds": round(run.wall, 1),
            "report": report,
            "note": "",
            "failed": [{"unit": "bad", "reason": "worker exited with status 3: went wrong"}],
            "failedCount": 1,
            "host": HOST,
            "trigger": None,
        },
    }


# -- a real fanout run, a real receiver ------------------------------------------------


def test_a_run_with_a_failed_unit_posts_its_message_to_the_webhook(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = notify_job(chdir_tmp, 'webhookSecret = "HOOK_URL"')
    with Receiver() as hook:
        monkeypatch.setenv("HOOK_URL", hook.url)
        # A proxy in the environment is not used: the message goes to the URL's host.
        monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
        ran = cli("run", str(path))
    assert ran.code == 1
    run = only_run(chdir_tmp)
    ((request,),) = [hook.requests]
    assert (request["method"], request["path"]) == ("POST", "/hooks/T0/B0/abc")
    assert request["headers"]["Content-Type"] == "application/json; charset=utf-8"
    assert request["headers"]["User-Agent"] == "fanout/0.1.0"
    assert json.loads(request["body"]) == failed_run_message(chdir_tmp, run, events=["failed"])
    sent = {"event": "notify.sent", "to": "webhook $HOOK_URL", "events": ["failed"]}
    assert events_of(chdir_tmp, run.id, "notify.sent") == [sent]
    assert "notified webhook $HOOK_URL of failed" in ran.err
    assert hook.url not in ran.err + ran.out


@pytest.mark.parametrize(
    ("on", "posted"),
    [("", []), ('on = ["finished"]', ["finished"]), ('on = ["failed"]', [])],
    ids=["default", "finished", "failed-only"],
)
def test_a_run_that_succeeds_notifies_only_when_finished_is_asked_for(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch, on: str, posted: list[str]
) -> None:
    path = notify_job(chdir_tmp, f'webhookSecret = "HOOK_URL"\n{on}', items=("ok",))
    with Receiver() as hook:
        monkeypatch.setenv("HOOK_URL", hook.url)
        ran = cli("run", str(path))
    assert ran.code == 0
    assert [m["fanout"]["events"] for m in hook.messages()] == ([posted] if posted else [])
    if posted:
        (said,) = hook.messages()
        run = only_run(chdir_tmp)
        assert said["text"] == (
            f"fanout: job nightly finished, exit 0 (run {run.id} on {HOST})\n"
            f"1 succeeded; wall {round(run.wall, 1):.1f}s\n"
            f"Report: {chdir_tmp.resolve()}/.fanout/runs/{run.id}/report.md"
        )
        assert (said["fanout"]["exitCode"], said["fanout"]["failed"]) == (0, [])


@pytest.mark.parametrize(
    ("receiver", "reason"),
    [
        (
            {"status": 500, "body": b"no_service\nmore"},
            "answered 500 (Internal Server Error): no_service",
        ),
        (
            {"status": 302, "headers": {"Location": "http://127.0.0.1:9/elsewhere"}},
            "answered 302 (Found, a redirect, which is not followed): ok",
        ),
    ],
    ids=["500", "redirect"],
)
def test_a_webhook_that_answers_an_error_is_one_logged_line_and_changes_no_exit_code(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch, receiver: dict[str, Any], reason: str
) -> None:
    path = notify_job(chdir_tmp, 'webhookSecret = "HOOK_URL"')
    with Receiver(**receiver) as hook:
        monkeypatch.setenv("HOOK_URL", hook.url)
        ran = cli("run", str(path))
    assert ran.code == 1
    assert len(hook.requests) == 1
    run = only_run(chdir_tmp)
    failed = {"event": "notify.failed", "to": "webhook $HOOK_URL", "events": ["failed"]}
    assert events_of(chdir_tmp, run.id, "notify.failed") == [{**failed, "reason": reason}]
    line = f"could not notify webhook $HOOK_URL of failed: {reason} (the run's result stands)"
    assert [x.split(" ", 1)[1] for x in ran.err.splitlines() if "notify" in x] == [line]


def test_a_webhook_that_never_answers_is_given_up_at_the_timeout(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = notify_job(
        chdir_tmp, 'webhookSecret = "HOOK_URL"\non = ["finished"]\ntimeout = "300ms"', items=("ok",)
    )
    with Receiver(hang=True) as hook:
        monkeypatch.setenv("HOOK_URL", hook.url)
        ran = cli("run", str(path))
        assert len(hook.requests) == 1
    assert ran.code == 0
    run = only_run(chdir_tmp)
    (failed,) = events_of(chdir_tmp, run.id, "notify.failed")
    assert failed["reason"] == "no answer within 300ms (notify.timeout)"
    log = (chdir_tmp / ".fanout" / "runs" / run.id / "events.jsonl").read_text().splitlines()
    times = {json.loads(line)["event"]: json.loads(line)["time"] for line in log}
    waited = times["notify.failed"] - times["run.finished"]
    assert 0.3 <= waited < 1.5, waited


def test_a_webhook_nobody_listens_on_is_one_logged_line(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    path = notify_job(chdir_tmp, 'webhookSecret = "HOOK_URL"')
    monkeypatch.setenv("HOOK_URL", f"http://127.0.0.1:{port}/hook")
    ran = cli("run", str(path))
    assert ran.code == 1
    (failed,) = events_of(chdir_tmp, only_run(chdir_tmp).id, "notify.failed")
    assert failed["reason"] == "cannot connect: Connection refused"


def test_an_https_webhook_whose_certificate_is_not_trusted_is_refused(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command makes the test's self-signed certificate")
    key, cert = chdir_tmp / "key.pem", chdir_tmp / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    with Receiver() as hook:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        hook.server.socket = context.wrap_socket(hook.server.socket, server_side=True)
        path = notify_job(chdir_tmp, 'webhookSecret = "HOOK_URL"')
        monkeypatch.setenv("HOOK_URL", hook.url.replace("http:", "https:"))
        ran = cli("run", str(path))
    assert ran.code == 1
    assert hook.requests == []
    (failed,) = events_of(chdir_tmp, only_run(chdir_tmp).id, "notify.failed")
    assert failed["reason"] == "its certificate was refused: self-signed certificate"


def test_a_webhook_variable_not_set_refuses_the_run_before_it_starts(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HOOK_URL", raising=False)
    path = notify_job(chdir_tmp, 'webhookSecret = "HOOK_URL"')
    ran = cli("run", str(path))
    assert ran.code == 4
    assert ran.err == (
        "notify: HOOK_URL not set: export it in the environment fanout runs in"
        " (notify.webhookSecret and notify.secrets name them; cron and systemd start"
        " fanout with almost no environment)\n"
    )
    assert not (chdir_tmp / ".fanout" / "runs").exists()
    planned = cli("plan", str(path))
    assert planned.code == 0
    assert "            webhook $HOOK_URL NOT SET (`fanout run` refuses)\n" in planned.out


def test_a_webhook_variable_that_holds_no_url_refuses_the_run_without_showing_it(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOOK_URL", "hooks.slack.com/services/T0/B0/sekrit")
    ran = cli("run", str(notify_job(chdir_tmp, 'webhookSecret = "HOOK_URL"')))
    assert (ran.code, ran.err) == (
        4,
        "notify.webhookSecret: the value of HOOK_URL is not an http(s) URL; write it as"
        " http(s)://host[:port][/path][?query]\n",
    )


def test_the_plan_shows_a_webhook_written_in_the_file_without_its_path(chdir_tmp: Path) -> None:
    path = notify_job(chdir_tmp, 'webhook = "http://127.0.0.1:8/hooks/relay-key-123"\n')
    planned = cli("plan", str(path))
    assert planned.code == 0
    assert "relay-key-123" not in planned.out
    assert (
        "Notify    on failed, parked, spend, quarantined (within 10s each; a failure is"
        " logged, the exit code stays)\n            webhook http://127.0.0.1:8/…\n"
    ) in planned.out
    assert '  webhook = "http://127.0.0.1:8/…"\n' in planned.out


# -- the command ----------------------------------------------------------------------


def test_a_command_gets_the_message_on_stdin_and_only_its_own_secrets(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = notify_job(
        chdir_tmp,
        'command = ["sh", "-c", "cat > message.json; env > env.txt", "{{ job.name }}"]\n'
        'secrets = ["PAGER_TOKEN"]\n',
    )
    text = path.read_text().replace("[task]\n", '[task]\nsecrets = ["CRM_TOKEN"]\n')
    path.write_text(text.replace('sandbox = "none"', 'sandbox = "none"\nunsandboxedSecrets = true'))
    monkeypatch.setenv("CRM_TOKEN", "crm-value-never-for-the-notifier")
    monkeypatch.setenv("PAGER_TOKEN", "pager-value")
    ran = cli("run", str(path))
    assert ran.code == 1
    run = only_run(chdir_tmp)
    said = json.loads((chdir_tmp / "message.json").read_text())
    assert said == failed_run_message(chdir_tmp, run, events=["failed"])
    env = dict(line.split("=", 1) for line in (chdir_tmp / "env.txt").read_text().splitlines())
    env.pop("PWD", None), env.pop("SHLVL", None), env.pop("_", None)  # sh's own
    assert env == {
        "PATH": env["PATH"],
        "HOME": os.environ["HOME"],
        "LANG": "C.UTF-8",
        "FANOUT_JOB": "nightly",
        "FANOUT_RUN_ID": run.id,
        "FANOUT_EVENT": "failed",
        "FANOUT_EVENTS": "failed",
        "FANOUT_STATE": "finished",
        "FANOUT_EXIT_CODE": "1",
        "FANOUT_REPORT": said["fanout"]["report"],
        "PAGER_TOKEN": "pager-value",
    }
    sent = {"event": "notify.sent", "to": "command sh", "events": ["failed"]}
    assert events_of(chdir_tmp, run.id, "notify.sent") == [sent]


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ('["sh", "-c", "echo first; echo pager down >&2; exit 5"]', "exited 5: pager down"),
        ('["sleep", "30"]', "killed after 300ms (notify.timeout)"),
        ('["no-such-notifier"]', "cannot start no-such-notifier: No such file or directory"),
    ],
    ids=["exits-5", "hangs", "missing"],
)
def test_a_command_that_fails_or_hangs_is_one_logged_line_and_changes_no_exit_code(
    chdir_tmp: Path, command: str, reason: str
) -> None:
    path = notify_job(chdir_tmp, f'command = {command}\ntimeout = "300ms"')
    begun = time.monotonic()
    ran = cli("run", str(path))
    assert time.monotonic() - begun < 10
    assert ran.code == 1
    run = only_run(chdir_tmp)
    to = f"command {json.loads(command)[0]}"
    failed = {"event": "notify.failed", "to": to, "events": ["failed"], "reason": reason}
    assert events_of(chdir_tmp, run.id, "notify.failed") == [failed]
    assert f"could not notify {to} of failed: {reason} (the run's result stands)" in ran.err


# -- endings and the message ----------------------------------------------------------


def summary(**fields: Any) -> Summary:
    base: dict[str, Any] = {
        "run_id": "20270101T030000-ab12",
        "reason": StopReason.LAST_ROUND,
        "counts": {"succeeded": 3},
        "report_dir": Path("/srv/repo/.fanout/runs/20270101T030000-ab12"),
        "wall_seconds": 125.04,
    }
    return Summary(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "endings"),
    [
        ({}, ["finished"]),
        ({"reason": StopReason.NOTHING_SELECTED, "counts": {}}, ["finished"]),
        ({"counts": {"succeeded": 2, "failed": 1}}, ["failed"]),
        ({"counts": {"succeeded": 2, "interrupted": 1}}, ["failed"]),
        ({"reason": StopReason.STOPPED, "stopped_by": ExitCode.PARKED}, ["parked"]),
        ({"reason": StopReason.STOPPED, "stopped_by": ExitCode.SPEND_STOPPED}, ["spend"]),
        ({"reason": StopReason.STOPPED, "stopped_by": ExitCode.CANNOT_RUN}, ["failed"]),
        ({"reason": StopReason.STOPPED, "stopped_by": ExitCode.INTERNAL}, ["failed"]),
        ({"reason": StopReason.INTERRUPTED}, []),
        ({"reason": StopReason.STOPPED, "stopped_by": ExitCode.INTERRUPTED}, []),
        ({"quarantined": 2}, ["finished", "quarantined"]),
        ({"quarantined": 2, "counts": {"failed": 1}}, ["failed", "quarantined"]),
        ({"quarantined": 2, "reason": StopReason.INTERRUPTED}, []),
    ],
)
def test_the_endings_of_a_run(fields: dict[str, Any], endings: list[str]) -> None:
    assert list(message.endings(summary(**fields))) == endings


@pytest.fixture
def nightly(tmp_path: Path) -> spec.Spec:
    return spec.load(notify_job(tmp_path, 'command = ["cat"]'))


def compose(
    job: spec.Spec, the_summary: Summary, failures: list[Failure], redacted: list[str]
) -> dict[str, Any]:
    said = message.compose(
        job,
        the_summary,
        message.endings(the_summary),
        failures=failures,
        failed=len(failures),
        host="build-3",
        redacted=redacted,
    )
    assert json.loads(said.body()) == said.payload
    return dict(said.payload)


PEM = (
    "-----BEGIN PRIVATE KEY-----\n"
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n"
    "BKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n"
    "-----END PRIVATE KEY-----\n"
)


def test_a_secret_in_a_failure_reason_or_the_note_never_reaches_the_message(
    nightly: spec.Spec,
) -> None:
    token = "crm-9f8e7d6c5b4a"
    gateway = "fanout-token-" + "A" * 43
    failures = [
        Failure(unit="a.py", reason=f"exit 1: login with {token} refused"),
        Failure(unit="b.py", reason=f"exit 1: key was\n{PEM}and then"),
        # One line of the key, re-indented by a worker, and a gateway token by its shape.
        Failure(unit="c.py", reason=f"  MIIEvQIBADANBgkqhkiG9w0BAQEFAASC  {gateway}"),
    ]
    the_summary = summary(counts={"failed": 3}, note=f"stopped: {token}")
    payload = compose(nightly, the_summary, failures, [token, PEM])
    text = json.dumps(payload)
    for secret in [
        token,
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
        "BKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj",
        gateway,
    ]:
        assert secret not in text
    assert [f["reason"] for f in payload["fanout"]["failed"]] == [
        "exit 1: login with [secret] refused",
        "exit 1: key was [secret]and then",
        "[secret] [secret]",
    ]
    assert payload["fanout"]["note"] == "stopped: [secret]"
    assert payload["text"] == (
        "fanout: job nightly failed, exit 1 (run 20270101T030000-ab12 on build-3)\n"
        "3 failed; wall 2m 5s\n"
        "stopped: [secret]\n"
        "Failed units:\n"
        "• a.py: exit 1: login with [secret] refused\n"
        "• b.py: exit 1: key was [secret]and then\n"
        "• c.py: [secret] [secret]\n"
        "Report: /srv/repo/.fanout/runs/20270101T030000-ab12/report.md"
    )


def test_the_message_is_bounded_escaped_for_slack_and_one_line_per_fact(
    nightly: spec.Spec,
) -> None:
    failures = [Failure(unit=f"u{n}", reason="x" * 10_000) for n in range(1000)]
    failures[0] = Failure(unit="<!channel> & \x1b[2J", reason="a\nb\r\nc <@U123>")
    the_summary = summary(counts={"failed": 1000}, note="n" * 10_000)
    payload = compose(nightly, the_summary, failures, [])
    said = message.Message(events=(NotifyEvent.FAILED,), payload=payload)
    assert len(said.body()) < 8 * 1024
    facts = payload["fanout"]
    assert len(facts["failed"]) == message.FAILURES_SHOWN
    assert facts["failed"][0] == {"unit": "<!channel> & \\x1b[2J", "reason": "a b c <@U123>"}
    assert len(facts["failed"][1]["reason"]) == message.REASON_CHARS
    assert facts["failedCount"] == 1000
    lines = payload["text"].split("\n")
    assert lines[3] == "Failed units (first 5 of 1000):"
    assert lines[4] == "• &lt;!channel&gt; &amp; \\x1b[2J: a b c &lt;@U123&gt;"


def test_a_run_that_parked_spent_or_quarantined_notifies_with_its_ending(tmp_path: Path) -> None:
    job = spec.load(notify_job(tmp_path, 'webhook = "http://127.0.0.1:1/x"'))
    with Receiver() as hook:
        notifier = Notifier(
            job,
            secrets=Secrets(url=hook.url),
            environ={},
            redacted=[],
            journal=Journal(tmp_path / "journal.sqlite"),
            events=Events(),
            host="build-3",
        )
        asyncio.run(notifier(summary(quarantined=2)))
        asyncio.run(notifier(summary()))  # finished alone: not in the default "on"
    (said,) = hook.messages()
    assert said["fanout"]["events"] == ["quarantined"]
    assert said["text"] == (
        "fanout: job nightly quarantined units, exit 0 (run 20270101T030000-ab12 on build-3)\n"
        "3 succeeded; 2 newly quarantined; wall 2m 5s\n"
        "Report: /srv/repo/.fanout/runs/20270101T030000-ab12/report.md"
    )


@pytest.mark.parametrize(
    ("error", "ending", "code"),
    [
        (Parked("claude's usage window resets at 15:45", resume_at=None), "parked", 8),
        (SpendStopped("apis[0] budget $5.00 spent"), "spend", 7),
    ],
    ids=["parked", "spend"],
)
async def test_a_run_an_error_stops_notifies_before_it_raises(
    tmp_path: Path, error: FanoutError, ending: str, code: int
) -> None:
    job = spec.load(notify_job(tmp_path, 'webhook = "http://127.0.0.1:1/x"'))
    with Receiver() as hook:
        events: list[dict[str, Any]] = []
        runner = make_runner(job, FakeTransport(delay=0.0), events=events.append)
        runner.ended = Notifier(
            job,
            secrets=Secrets(url=hook.url),
            environ={},
            redacted=[],
            journal=runner.journal,
            events=runner.events,
            host="build-3",
        )
        runner.stop(error)  # as the gateway does for money, the dispatcher for a window
        with pytest.raises(type(error)):
            await runner.execute(Options())
    (said,) = hook.messages()
    assert said["fanout"]["events"] == [ending]
    assert (said["fanout"]["state"], said["fanout"]["exitCode"]) == ("stopped", code)
    assert said["fanout"]["note"] == str(error).split("\n")[0]
    assert [e["event"] for e in events][-2:] == ["run.finished", "notify.sent"]


async def test_a_scheduled_fire_notifies_with_its_trigger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = notify_job(tmp_path, 'webhookSecret = "HOOK_URL"')
    path.write_text(
        path.read_text()
        + '[[triggers]]\nname = "nightly-3am"\ntype = "cron"\nschedule = "0 3 * * *"\n'
    )
    job = spec.load(path)
    with Receiver() as hook:
        fire = Fire(
            job=job, index=0, trigger=job.triggers[0], at=datetime(2027, 1, 1, 3, tzinfo=UTC)
        )
        environ = {"HOOK_URL": hook.url, "PATH": os.environ["PATH"], "HOME": str(tmp_path)}
        done = await launch.run_fire(fire, environ, [])
    (said,) = hook.messages()
    assert done.exit_code == 1
    assert said["fanout"]["trigger"] == "nightly-3am"
    assert said["text"].startswith(
        f"fanout: job nightly (nightly-3am) failed, exit 1 (run {done.run_id} on "
    )


def test_the_notify_variables_leave_the_input_commands_environment(tmp_path: Path) -> None:
    from fanout.spec.apikeys import secret_names, without_keys

    path = notify_job(
        tmp_path, 'webhookSecret = "HOOK_URL"\ncommand = ["cat"]\nsecrets = ["PAGER_TOKEN"]'
    )
    job = spec.load(path)
    job = replace(job, task=replace(job.task, secrets=("CRM_TOKEN",)))
    assert secret_names(job) == ("CRM_TOKEN", "HOOK_URL", "PAGER_TOKEN")
    environ = {"HOOK_URL": "u", "PAGER_TOKEN": "p", "CRM_TOKEN": "c", "PATH": "/bin"}
    assert without_keys(job, environ) == {"PAGER_TOKEN": "p", "CRM_TOKEN": "c", "PATH": "/bin"}
