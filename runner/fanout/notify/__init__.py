"""Telling someone how a run ended (``[notify]``): the ``Notifier`` a run calls once it
has ended (``Runner.ended``), and what it reads from the coordinator's environment
(``secrets_of``).

Once per run, whoever started it (``fanout run``, ``fanout retry``, a fire of ``fanout
schedule``), after its report is written and before its error, if any, is raised: so a
run that parks or stops on spend, which the CLI turns into exit 8 or 7, notifies too.
The endings it is (``message.endings``) that ``notify.on`` names decide whether a
message goes; it goes to the webhook (``webhook``) and the command (``command``) at
once, each bounded by ``notify.timeout``.  What became of each is one event in the
run's log: ``notify.sent``, or ``notify.failed`` with the reason, which the console
shows too.  A notification that fails never changes the run's result or raises.

The webhook's URL is read once, when the run starts (a run that could not tell of its
ending does not start, as one without its secrets does not), and never shown: events
name the webhook by its variable, or by the host of a URL written in the job file.
"""

from __future__ import annotations

import asyncio
import os
import socket
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backlog.units import base_context
from ..errors import EnvironmentProblem
from ..events import Events
from ..journal import Journal
from ..outcome import Summary
from ..spec import Notify, Spec
from ..spec.checks.notify import webhook_refusal
from ..spec.templates import RenderError
from ..values.redact import redact_text
from . import command, message, webhook
from .message import Failure, Message

__all__ = ["Notifier", "Secrets", "secrets_of", "webhook_name"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Secrets:
    """What ``[notify]`` reads from the coordinator's environment: the webhook's URL
    (None: no webhook) and the values of the variables its command gets."""

    url: str | None = None
    command: Mapping[str, str] = field(default_factory=dict)


def secrets_of(spec: Spec, environ: Mapping[str, str]) -> Secrets:
    """``spec``'s notify secrets from ``environ``: EnvironmentProblem naming each
    variable that is not set (or whose URL fanout cannot POST to), checked when the run
    starts, before it is recorded, as ``task.secrets`` are."""
    notify = spec.notify
    if notify is None:
        return Secrets()
    named = [notify.webhook_secret] if notify.webhook_secret else []
    missing = [name for name in [*named, *notify.secrets] if name not in environ]
    if missing:
        raise EnvironmentProblem(
            f"notify: {', '.join(missing)} not set: export {'it' if len(missing) == 1 else 'them'}"
            " in the environment fanout runs in (notify.webhookSecret and notify.secrets"
            " name them; cron and systemd start fanout with almost no environment)"
        )
    url = notify.webhook
    if notify.webhook_secret is not None:
        url = environ[notify.webhook_secret]
        refused = webhook_refusal(url)
        if refused is not None:
            raise EnvironmentProblem(
                f"notify.webhookSecret: the value of {notify.webhook_secret} {refused}"
            )
    return Secrets(url=url, command={name: environ[name] for name in notify.secrets})


def webhook_name(notify: Notify) -> str:
    """The webhook as events and the plan name it: its variable, or a URL written in the
    job file cut to its scheme and host (the path of a webhook's URL is often a key)."""
    if notify.webhook_secret is not None:
        return f"${notify.webhook_secret}"
    assert notify.webhook is not None
    parts = urllib.parse.urlsplit(notify.webhook)
    return f"{parts.scheme}://{parts.netloc}/…"


class Notifier:
    """Sends the message of a run's ending to ``spec.notify``'s webhook and command.
    ``redacted``: every secret value the message must not hold (the job's task.secrets,
    its [[apis]] keys; the notifier's own are added)."""

    def __init__(
        self,
        spec: Spec,
        *,
        secrets: Secrets,
        environ: Mapping[str, str],
        redacted: Sequence[str],
        journal: Journal,
        events: Events,
        host: str | None = None,
    ) -> None:
        assert spec.notify is not None
        self.spec = spec
        self.notify = spec.notify
        self.secrets = secrets
        self.environ = environ
        self.redacted = (*redacted, *([secrets.url] if secrets.url else []))
        self.redacted += tuple(secrets.command.values())
        self.journal = journal
        self.events = events
        self.host = host or socket.gethostname()

    async def __call__(self, summary: Summary) -> None:
        """Notify of ``summary`` if ``notify.on`` names one of its endings.  Raises only
        CancelledError."""
        events = tuple(e for e in message.endings(summary) if e in self.notify.on)
        if not events:
            return
        try:
            said = message.compose(
                self.spec,
                summary,
                events,
                **self._failures(summary),
                host=self.host,
                redacted=self.redacted,
            )
        except Exception as exc:  # a bug here must not cost the run its result
            self._failed("the message", events, f"fanout internal error: {type(exc).__name__}")
            return
        async with asyncio.TaskGroup() as group:
            if self.secrets.url is not None:
                group.create_task(self._webhook(self.secrets.url, said))
            if self.notify.command:
                group.create_task(self._command(said, summary))

    def _failures(self, summary: Summary) -> dict[str, Any]:
        if not summary.counts.get("failed"):
            return {"failures": (), "failed": 0}
        try:
            count, rows = self.journal.failed_units(summary.run_id, message.FAILURES_SHOWN)
        except Exception:  # a journal that failed under the run: its counts still say it
            return {"failures": (), "failed": summary.counts["failed"]}
        failures = tuple(Failure(unit=row.unit.id, reason=row.reason) for row in rows)
        return {"failures": failures, "failed": count}

    async def _webhook(self, url: str, said: Message) -> None:
        to = f"webhook {webhook_name(self.notify)}"
        try:
            failure = await webhook.post(url, said.body(), deadline_s=self.notify.timeout)
        except Exception as exc:
            failure = f"fanout internal error: {type(exc).__name__}"
        self._settled(to, said, failure)

    async def _command(self, said: Message, summary: Summary) -> None:
        to = "command"
        try:
            context = base_context(self.spec, summary.trigger)
            argv = [part.render(context) for part in self.notify.command]
            to = f"command {argv[0]}"
            env = {
                "PATH": self.environ.get("PATH", os.defpath),
                "HOME": self.environ.get("HOME", "/nonexistent"),
                "LANG": "C.UTF-8",
                **said.environment(),
                **self.secrets.command,
            }
            failure = await command.run(
                argv,
                cwd=self.spec.runtime.workspace,
                env=env,
                stdin=said.body(),
                deadline_s=self.notify.timeout,
                out=Path(summary.report_dir) / "notify.out",
                redacted=self.redacted,
            )
        except RenderError as exc:
            failure = f"template: {exc}"
        except Exception as exc:
            failure = f"fanout internal error: {type(exc).__name__}"
        self._settled(to, said, failure)

    def _settled(self, to: str, said: Message, failure: str | None) -> None:
        if failure is None:
            to = redact_text(to, self.redacted)
            self.events.emit("notify.sent", to=to, events=[str(e) for e in said.events])
        else:
            self._failed(to, said.events, failure)

    def _failed(self, to: str, events: Sequence[Any], reason: str) -> None:
        self.events.emit(
            "notify.failed",
            to=redact_text(to, self.redacted),
            events=[str(e) for e in events],
            reason=redact_text(reason, self.redacted),
        )
