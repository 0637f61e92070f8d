"""Wiring a run together: the journal, the transport (local sandboxes or the SSH pool),
the rate gate, and an event loop on which SIGINT and SIGTERM drain the run (running
units are stopped, their sandboxes removed, the journal marks them interrupted)
instead of killing it.  The command line and the scheduler both start runs here.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import Interrupted
from ..events import Events, Sink
from ..journal import Journal
from ..outcome import Summary
from ..pacing import limits
from ..schedule.scheduler import Fire
from ..spec import Spec
from ..spec.apikeys import api_keys, secret_names, without_keys
from ..spec.model import Overlap
from ..transports import preflight as commands
from . import kept
from .job import Options, Runner
from .lock import JobLock
from .where import transport_for

Action = Callable[[Runner], Awaitable[Summary]]
Ended = Callable[[Summary], Awaitable[None]]


def gateway_socket_dir(environ: Mapping[str, str]) -> Path:
    """Where the gateway's unix socket goes (in a fresh 0700 directory of its own):
    ``$XDG_RUNTIME_DIR`` (the user's own, 0700, short), else the system's temporary
    directory.  Not the state directory: a socket path holds at most 107 bytes, and a
    workspace may lie deeper than that."""
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime)
    return Path(tempfile.gettempdir())


def runner_for(
    job: Spec, environ: Mapping[str, str], sinks: list[Sink], journal: Journal
) -> Runner:
    events = Events(*sinks)

    def notice(message: str) -> None:
        events.emit("notice", message=message)

    # What [notify] reads, a missing variable refused before anything is started (the
    # gateway binds a socket) or recorded, as the run's secrets are.
    told = None
    if job.notify is not None:
        from ..notify import secrets_of

        told = secrets_of(job, environ)
    # Spans of the run for an OpenTelemetry collector (the otel extra), read before the
    # job's secrets leave the environment: its headers may be one of them.
    tracer = None
    if "OTEL_EXPORTER_OTLP_ENDPOINT" in environ or "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" in environ:
        from ..traces import Tracer, settings_of

        traced = settings_of(environ)
        if traced is not None:
            tracer = Tracer(traced, journal_path=journal.path, events=events)
    # Each limit starts from what the job's last runs learned of it (``kept``).
    seeds, api_seeds = kept.seeds(journal, job)
    gateway = None
    if job.apis:
        from ..gateway import Gateway
        from ..isolation import hidden

        # A budget spent or an API refusing for money stops the run the way a closed
        # console does: nothing new starts, running attempts finish and settle.
        gateway = Gateway(
            job.apis,
            api_keys(job, environ),
            events=events,
            stop=lambda e: runner.stop(e),
            # Local sandboxes of network "apis" bind it in (SSH hosts forward a socket
            # of their own to the port).
            socket_dir=(
                gateway_socket_dir(environ)
                if job.runtime.network == "apis" and not job.runtime.hosts
                else None
            ),
            # Workers on Ray nodes connect to it at runtime.ray.gatewayHost.
            host=job.runtime.ray.gateway_host if job.runtime.ray is not None else "127.0.0.1",
            learned=api_seeds,
            # The per-user pacing ledger, beside the state-dir registry (which every
            # local sandbox hides): jobs calling an API with the same key share its limit.
            shares_dir=hidden.registry(environ).parent / "shares",
        )
    # From here on the keys are the gateway's alone, and the webhook's URL the
    # notifier's: the input command, the aggregate command and the workers' PATH come
    # from an environment without them.
    environ = without_keys(job, environ)
    present = [environ[name] for name in job.task.secrets if name in environ]
    redacted = [*present, *(gateway.keys if gateway is not None else ())]
    notifier = None
    if told is not None:
        from ..notify import Notifier

        notifier = Notifier(
            job, secrets=told, environ=environ, redacted=redacted, journal=journal, events=events
        )
    publisher = None
    if job.publish is not None:
        from ..publish import Publisher

        # git and the pull request's command run as the user would run them (their
        # login, ssh-agent, GH_TOKEN), less every secret the job names for others.
        named = set(secret_names(job))
        publisher = Publisher(
            job,
            environ={k: v for k, v in environ.items() if k not in named},
            redacted=redacted,
            journal=journal,
            events=events,
        )
    runner = Runner(
        spec=job,
        transport=transport_for(
            job,
            environ,
            notice,
            events.emit,
            gateway_port=gateway.port if gateway else None,
            gateway_socket=gateway.socket_path if gateway else None,
        ),
        journal=journal,
        environ=environ,
        events=events,
        gate=limits.gate_for(job, events, learned=seeds),
        gateway=gateway,
        workers=commands.local_workers(job, environ),
        # Published before notified: the message then tells of a run whose pull
        # request is up to date.  Spans last: a dead collector delays neither.
        ended=_in_turn(publisher, notifier, tracer),
        refuse=publisher.refuse if publisher is not None else None,
    )
    return runner


def _in_turn(*hooks: Callable[[Summary], Awaitable[None]] | None) -> Ended | None:
    """One ``Runner.ended`` that awaits each of ``hooks`` (those not None) in turn."""
    present = [hook for hook in hooks if hook is not None]
    if len(present) <= 1:
        return present[0] if present else None

    async def ended(summary: Summary) -> None:
        for hook in present:
            await hook(summary)

    return ended


async def run_async(
    job: Spec,
    environ: Mapping[str, str],
    sinks: list[Sink],
    action: Action,
    *,
    overlap: Overlap = "skip",
    by: str = "fanout run",
) -> Summary:
    """Run ``action`` holding the job's lock (``overlap`` decides how it is taken)."""
    lock = JobLock(job.runtime.state_dir, job.name)
    await lock.acquire(overlap, by=by)
    journal = Journal(job.runtime.state_dir / "journal.sqlite")
    runner: Runner | None = None
    try:
        runner = runner_for(job, environ, sinks, journal)
        return await action(runner)
    finally:
        # A run refused before its rounds (a missing secret) never started the gateway,
        # whose socket is bound already: a scheduler fires many runs in one process.
        if runner is not None and runner.gateway is not None:
            await runner.gateway.close()
        journal.close()
        lock.release()


class Drain:
    """A request to stop the run, from any thread and at any time, for a cause that is not
    a signal: the console the run reports to was closed (``| head``, a dropped terminal).

    Unlike Ctrl-C it stops the run gently (``Runner.stop``): nothing new starts, the
    attempts running finish and settle, and the run ends stopped, resumable, with exit
    130.  Nobody is watching to be kept waiting, and killing the running workers would
    throw their work away (and run again a unit whose side effect was already done).  A
    request before the run started stops it as soon as it starts; one after it ended
    does nothing."""

    REASON = "the console fanout reported to was closed"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._target: tuple[asyncio.AbstractEventLoop, Runner] | None = None
        self.requested = False

    def request(self) -> None:
        with self._lock:
            self.requested = True
            target = self._target
        if target is not None:
            loop, runner = target
            # RuntimeError: the loop closed meanwhile, the run is over.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(runner.stop, Interrupted(self.REASON))

    @contextlib.contextmanager
    def bound(self, loop: asyncio.AbstractEventLoop, runner: Runner) -> Iterator[None]:
        """Requests stop ``runner`` (on ``loop``) while inside this block."""
        with self._lock:
            self._target = (loop, runner)
            requested = self.requested
        try:
            if requested:
                runner.stop(Interrupted(self.REASON))
            yield
        finally:
            with self._lock:
                self._target = None


def run_blocking(
    job: Spec,
    environ: Mapping[str, str],
    sinks: list[Sink],
    action: Action,
    *,
    overlap: Overlap = "skip",
    drain: Drain | None = None,
) -> Summary:
    """Run to the end on a fresh event loop; Ctrl-C or SIGTERM raise Interrupted once the
    run has drained, with one line saying what happened, where the report is and how to
    continue; ``drain.request()`` stops the run gently (see ``Drain``)."""
    seen = _RunSeen()
    sinks = [*sinks, seen]

    async def main() -> Summary:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, task.cancel)

        async def bound(runner: Runner) -> Summary:
            if drain is None:
                return await action(runner)
            with drain.bound(loop, runner):
                return await action(runner)

        return await run_async(job, environ, sinks, bound, overlap=overlap)

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        raise Interrupted(seen.interrupted(job)) from None


class _RunSeen:
    """A sink that remembers which run the events were about and where its report went,
    for the line an interrupt ends with (the run is gone by then, its events are not)."""

    def __init__(self) -> None:
        self.run: str | None = None
        self.report: str | None = None
        self.state: str | None = None

    def __call__(self, event: dict[str, Any]) -> None:
        if event["event"] in ("run.started", "run.resumed"):
            self.run, self.state = event.get("run"), None
        elif event["event"] == "run.finished":
            self.run, self.report = event.get("run"), event.get("report")
            self.state = event.get("state")

    def interrupted(self, job: Spec) -> str:
        if self.run is None:
            return "interrupted before the run started: nothing ran"
        report = f"; report: {self.report}" if self.report else ""
        if self.state == "finished":
            # Ctrl-C while the transport closed or the aggregate command ran: the run's
            # end was recorded first, so there is nothing to continue.
            return f"interrupted after run {self.run} finished{report}"
        return (
            f"interrupted: running units were stopped and their sandboxes removed{report};"
            f" `fanout run {job.file} --resume` continues run {self.run}"
        )


def _resume(fire: Fire) -> bool | None:
    """A parked run's continuation resumes it (never a new run); a run this trigger
    started and a crash cut short is continued, not redone; but "replace" means start
    over (the run it replaced is the one left unfinished)."""
    if fire.resume:
        return True
    return False if fire.trigger.overlap == "replace" else None


async def run_fire(fire: Fire, environ: Mapping[str, str], sinks: list[Sink]) -> Summary:
    """The run a scheduled fire starts: the trigger's context and overlap policy."""
    return await run_async(
        fire.job,
        environ,
        sinks,
        lambda runner: runner.execute(Options(trigger=fire.context, resume=_resume(fire))),
        # A continuation never interrupts a run that holds the lock (whoever started it,
        # it is the parked run going again, or a newer one).
        overlap="skip" if fire.resume else fire.trigger.overlap,
        by=f"fanout schedule ({fire.trigger.name})",
    )
