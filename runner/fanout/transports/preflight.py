"""Whether the commands a job's workers start can be started where they run.

A worker that cannot start fails every attempt of every unit alike, and only the logs
say why (``bwrap: execvp claude: No such file or directory``).  So ``fanout plan``
warns and ``fanout run`` refuses before it dispatches anything (exit 4), naming the
command, the PATH it was looked for on and, for a file the sandbox hides, why.

What is checked: argv[0] of ``task.command`` (or of a rung's own ``command``) and of
``task.verify``, rendered for each rung.  An argv[0] that reads ``unit``, ``last``,
``attempt``, ``round`` or ``trigger`` can differ from one attempt to the next: it is
not checked (``plan`` says so), and an attempt that cannot start it fails with the
guard's ``fanout: cannot start X`` as its reason.

- A name without a slash is looked up on the PATH the workers get (the coordinator's,
  fanout's own bin first) as execvp does: in order, absolute entries only (a relative
  entry would be the sandbox itself), the first executable file wins.  Under bwrap a
  file is skipped where the sandbox does not show it: below the private ``/tmp`` or
  ``/var/tmp`` (except the PATH directories fanout binds back, ``sandbox.bound_tools``)
  or below what fanout hides (``hidden``), judged for the file, each symlink on the way
  and where it finally leads.
- An absolute path is checked the same way, as one file.
- A relative path with a slash (``./fix.sh``) runs from the sandbox, which holds the
  unit's staged files: it is checked in the workspace, where those come from.
- Podman: not checked (the image decides).  SSH hosts: ``names`` go to each host's
  probe at the run's start and to ``fanout hosts check`` (``ssh.probe``), which refuse
  a host that lacks one; on a bwrap host each is looked up inside a sandbox made as a
  unit's is, and ``sandbox.unseen``, the rule this check predicts with, says why.

Before the commands, the sandbox ``auto`` gives here: plain directories where bwrap is
missing cannot hide the other units from workers given tokens or secrets
(``exposure``), nor give network ``"apis"``; either refuses the run as a command that
cannot start does, before anything is recorded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..attempt.invocation import rung_context
from ..backlog.units import base_context
from ..errors import EnvironmentProblem
from ..isolation import hidden
from ..isolation import tools as sandbox
from ..isolation.exposure import hides, network_refusal
from ..spec import Spec
from ..spec.apikeys import handed
from ..spec.templates import RenderError, Template
from ..values import globs

# Template variables that differ between the attempts of a run.
VARYING = frozenset({"unit", "last", "attempt", "round", "trigger"})
NOT_FOUND = "not found on the PATH workers get"


@dataclass(frozen=True, kw_only=True, slots=True)
class Needed:
    """One command a job's workers start: where the job names it, and argv[0]."""

    key: str
    command: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Workers:
    """Where local workers start their commands (what ``LocalTransport`` is given)."""

    path: str
    sandbox: str  # runtime.sandbox as the job asks for it
    workspace: Path
    hidden: tuple[Path, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Checked:
    """What the check found: each command's file, the problems, and what it skipped."""

    found: tuple[tuple[Needed, str], ...] = ()
    problems: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


def needed(spec: Spec) -> tuple[list[Needed], list[str]]:
    """The argv[0]s that do not depend on the unit, each once, and a note for each
    that does (or does not render)."""
    found: list[Needed] = []
    skipped: list[str] = []
    base = base_context(spec)
    for index, rung in enumerate(spec.retry.ladder):
        own = rung.command is not None
        argvs: tuple[tuple[str, tuple[Template, ...]], ...] = (
            (
                f"retry.ladder[{index}].command" if own else "task.command",
                rung.command if rung.command is not None else spec.task.command,
            ),
            ("task.verify", spec.task.verify),
        )
        for key, argv in argvs:
            if not argv:
                continue
            first = argv[0]
            reads = sorted(spec.templates.variables(first.source) & VARYING)
            if reads:
                note = f"{key}: {first.source!r} depends on {', '.join(reads)}: not checked"
                if note not in skipped:
                    skipped.append(note)
                continue
            context = {**base, "rung": rung_context(rung, index, spec)}
            try:
                command = first.render(context)
            except RenderError as exc:
                skipped.append(f"{key} for rung {rung.name!r}: does not render: {exc}")
                continue
            if first.compiled is not None and len(spec.retry.ladder) > 1:
                key = f"{key} for rung {rung.name!r}"
            if all(n.command != command for n in found):
                found.append(Needed(key=key, command=command))
    return found, skipped


def names(spec: Spec) -> tuple[str, ...]:
    """The commands an SSH host must have (a relative path runs from the sandbox: the
    host cannot be asked about it in advance)."""
    commands, _ = needed(spec)
    return tuple(n.command for n in commands if n.command and not _relative_path(n.command))


def local_workers(spec: Spec, environ: Mapping[str, str]) -> Workers | None:
    """Where ``spec``'s workers start on this machine; None when they run elsewhere
    (SSH hosts, checked there) or in an image (podman, the image decides)."""
    if spec.runtime.hosts or spec.runtime.sandbox == "podman":
        return None
    return Workers(
        path=environ.get("PATH", ""),
        sandbox=spec.runtime.sandbox,
        workspace=spec.runtime.workspace,
        hidden=tuple(hidden.paths(environ, spec.runtime.state_dir)),
    )


def check(spec: Spec, workers: Workers) -> Checked:
    """Look every command up as the workers will.  Probes the sandbox (bwrap or not),
    so it blocks: call it in a thread from async code.  Raises EnvironmentProblem when
    the sandbox the job asks for is missing (as the transport's start would)."""
    commands, skipped = needed(spec)
    kind = sandbox.choose(workers.sandbox).kind
    bwrap = kind == "bwrap"
    tools = sandbox.bound_tools(workers.path) if bwrap else ()
    masks = _Masks(bwrap=bwrap, tools=tools, hidden=workers.hidden)
    found: list[tuple[Needed, str]] = []
    problems = _sandbox_problems(spec, workers, kind)
    for need in commands:
        where, problem = _locate(need.command, workers, masks)
        if problem:
            problems.append(f"{need.key}: cannot start {need.command or repr('')}: {problem}")
        else:
            found.append((need, where))
    return Checked(found=tuple(found), problems=tuple(problems), skipped=tuple(skipped))


def _sandbox_problems(spec: Spec, workers: Workers, kind: str) -> list[str]:
    """What ``auto`` giving sandboxes of ``kind`` here means for the job (a sandbox the
    file names itself is checked by ``validate``)."""
    if workers.sandbox != "auto" or kind != "none":
        return []
    where = (
        "runtime.sandbox: 'auto' gives plain directories on this machine (bubblewrap is"
        " not installed or cannot create namespaces here)"
    )
    problems = []
    given = handed(spec)
    if given and not hides(kind):
        problems.append(given.refusal(where, "install bubblewrap (apt-get install bubblewrap)"))
    refusal = network_refusal(kind) if spec.runtime.network == "apis" else None
    if refusal is not None:
        problems.append(f"{where}: {refusal}")
    return problems


def refuse(spec: Spec, workers: Workers) -> None:
    """Raise EnvironmentProblem naming every command the workers cannot start."""
    problems = check(spec, workers).problems
    if problems:
        error = EnvironmentProblem("\n".join(problems))
        error.hint = (
            f"no unit was started; `fanout plan {spec.file}` shows where each command resolves"
        )
        raise error


def plan_lines(spec: Spec, environ: Mapping[str, str]) -> list[str]:
    """What ``fanout plan`` says of the commands, in its ``Label     text`` layout."""
    if spec.runtime.hosts:
        shown = ", ".join(names(spec)) or "no command"
        lines = [f"{shown}: checked on each SSH host when the run starts"]
    elif spec.runtime.sandbox == "podman":
        lines = ["not checked: the image (runtime.image) decides what is installed"]
    else:
        workers = local_workers(spec, environ)
        assert workers is not None
        try:
            checked = check(spec, workers)
        except EnvironmentProblem as exc:
            checked = Checked(skipped=(f"not checked: {exc}",))
        lines = [f"{need.key}: {need.command} -> {where}" for need, where in checked.found]
        lines += [f"WARNING {problem}" for problem in checked.problems]
        if checked.problems:
            lines.append("`fanout run` refuses to start until this is fixed")
        lines += list(checked.skipped)
    return [f"{'Commands' if n == 0 else '':<10}{line}" for n, line in enumerate(lines)]


def _relative_path(command: str) -> bool:
    return "/" in command and not command.startswith("/")


@dataclass(frozen=True, slots=True)
class _Masks:
    """What a local sandbox does not show its worker (``sandbox.unseen``'s rule)."""

    bwrap: bool
    tools: tuple[Path, ...]
    hidden: tuple[Path, ...]


def _locate(command: str, workers: Workers, masks: _Masks) -> tuple[str, str]:
    """(the file ``command`` starts, "") or ("", why it cannot start)."""
    if not command:
        return "", "the command is empty"
    longest = max(len(part.encode("utf-8", "surrogatepass")) for part in command.split("/"))
    if longest > globs.NAME_MAX:  # the system refuses to look it up (ENAMETOOLONG)
        return (
            "",
            f"it has a name of {longest:,} bytes; a file name can be {globs.NAME_MAX} at most",
        )
    if _relative_path(command):
        file = workers.workspace / command
        if not _executable(file):
            return "", (
                f"{file} is not an executable file (a relative command runs from the "
                "sandbox, which holds the unit's staged workspace files)"
            )
        return str(file), ""
    if command.startswith("/"):
        candidates = [Path(command)]
    else:
        entries = [entry for entry in workers.path.split(":") if entry.startswith("/")]
        candidates = [Path(entry) / command for entry in entries]
    refusals: list[str] = []
    for candidate in candidates:
        if not _executable(candidate):
            if candidate.exists() and not candidate.is_dir():
                refusals.append(f"{candidate} is not executable")
            continue
        refusal = _hidden(command, candidate, masks)
        if refusal is None:
            return str(candidate), ""
        refusals.append(refusal)
    if refusals:
        # The first is the one the worker's own lookup would have reached first.
        return "", refusals[0]
    if command.startswith("/"):
        return "", "no such file"
    return "", f"{NOT_FOUND} ({workers.path})"


def _hidden(command: str, candidate: Path, masks: _Masks) -> str | None:
    """Why the sandbox does not show ``candidate``, or None where it does."""
    if not masks.bwrap:
        return None
    return sandbox.unseen_reason(command, _links(candidate), tools=masks.tools, hidden=masks.hidden)


def _links(path: Path) -> list[Path]:
    """``path``, each symlink hop from it, and where it finally leads."""
    hops = [path]
    current = path
    for _ in range(40):  # the kernel's own limit on a chain of symlinks
        if not current.is_symlink():
            break
        target = Path(os.readlink(current))
        current = Path(os.path.normpath(current.parent / target))
        hops.append(current)
    real = Path(os.path.realpath(path))
    if real not in hops:
        hops.append(real)
    return hops


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)
