"""The one driver of an attempt, whatever the transport: ``execute`` opens a sandbox on
the transport that runs the attempt and does, for every transport alike:

1. stage the files into ``work/``;
2. run the steps in order, each only if the one before it exited 0, all of them
   within one deadline (``invocation.timeout``) that starts with the first step;
3. read the throttle control file (``control.json``, outside ``work/``);
4. on success, list ``work/`` and collect what the patterns select (``collecting``);
5. leave the sandbox, which kills what is left and removes its directory.
"""

from __future__ import annotations

import asyncio

from ..outcome import AttemptResult, CollectedFile, Status
from . import staging
from .collecting import PathRefused
from .model import BACKSTOP_GRACE, LAYOUT, Attempt
from .sandbox import Lost, Sandbox
from .seam import Sandboxes
from .verdict import Verdict


async def execute(attempt: Attempt, transport: Sandboxes) -> AttemptResult:
    """Run ``attempt`` on ``transport`` to its result; never raises for the unit's fate
    (a lost host is a ``lost`` result), only for cancellation."""
    verdict: Verdict | None = None
    try:
        async with transport.sandbox(attempt) as box:
            verdict = Verdict(attempt, host=box.place.host)
            return await _carry_out(attempt, box, verdict)
    except Lost as exc:
        if verdict is None:
            verdict = Verdict(attempt, host=exc.host)
        return verdict.result(Status.LOST, str(exc))
    finally:
        if verdict is not None:
            verdict.close()


def last_look(attempt: Attempt) -> int | None:
    """The index of the step after which, should it run, ``execute`` reads nothing of
    the sandbox but the control file: the last step, when nothing is to be collected;
    None when something is.  A transport may remove the sandbox as that step ends
    (keeping the control file's bytes for ``Sandbox.read``), saving a round trip to
    its host (Ray's step call does).  Change it with ``_carry_out`` and ``_collect``."""
    return None if attempt.collect else len(attempt.steps) - 1


async def _carry_out(attempt: Attempt, box: Sandbox, verdict: Verdict) -> AttemptResult:
    place = box.place
    try:
        await box.stage(attempt.staged)
    except OSError as exc:
        return verdict.result(Status.FAILED, f"stage: {exc.strerror or exc}: {exc.filename}")
    loop = asyncio.get_running_loop()
    code: int | None = 0
    name = "worker"
    ends = loop.time() + attempt.deadline
    deadline = asyncio.timeout_at(ends)
    try:
        async with deadline:
            for step in attempt.steps:
                if step.gated and code != 0:
                    break
                name = step.name
                backstop = ends - loop.time() + BACKSTOP_GRACE
                code = await box.run(
                    attempt.command(step, place), verdict.capture, backstop=backstop
                )
    except TimeoutError:
        if not deadline.expired():
            raise
        code = None
    control = await box.read(LAYOUT.control)
    return await verdict.decide(
        code=code,
        stage=name,
        control=control.decode(errors="replace") if control is not None else None,
        collect=lambda: _collect(attempt, box),
    )


async def _collect(attempt: Attempt, box: Sandbox) -> tuple[CollectedFile, ...]:
    """The files the patterns select, copied to the unit folder.  Raises PathRefused."""
    if not attempt.collect:
        return ()
    names = attempt.collect.select(await box.listing(attempt.collect.roots))
    if not names:
        return ()
    destination = attempt.collect_dir
    destination.mkdir(parents=True, exist_ok=True)
    await box.fetch(names, destination)
    collected = []
    for name in names:
        path = destination / name
        if not path.is_file() or path.is_symlink():
            raise PathRefused(f"collect: {name!r} did not arrive from the sandbox")
        collected.append(
            CollectedFile(path=name, sha256=staging.sha256_file(path), size=path.stat().st_size)
        )
    return tuple(collected)
