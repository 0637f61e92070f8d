"""What a run's start and ``fanout hosts check`` ask a host: its tools, containment and
login facts (``facilities``), the place its sandboxes are made in (``host_place``), and
whether the job's workers start inside one (``unseen_commands``); the gateway forward a
job with APIs needs; (``hostkey`` is what ``fanout hosts trust`` asks).

The start check runs where the unit will: on a bwrap host, a sandbox is made with the
very argv a unit's step gets (``sandbox.command`` on the host's place) and each command
is looked up inside it.  A lookup outside only (``command -v``) passed a worker at an
absolute path under /tmp, which bwrap replaces with a private /tmp, and every unit then
failed with bwrap's ``execvp``; ``sandbox.unseen`` says why, in the local check's words.
"""

from __future__ import annotations

import asyncio
import posixpath
import re
import secrets
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

import asyncssh

from ...isolation import tools as sandbox
from ...isolation.exposure import network_refusal
from ...isolation.place import Place
from ...isolation.tools import _INIT
from ...spec import Host
from . import forward
from .connection import Connector, where
from .failures import Lost, Refused, Unreachable, describe

# The PID namespace fanout's agent runs in where the host allows one, so that a killed
# agent takes its sandbox's whole tree along (the kernel kills a namespace when its
# first process ends), and each step's own inside it.  A step's namespace mounts no
# /proc of its own: ``sandbox._INIT`` (its first process) reads /proc to check that its
# parent is unshare, as on the coordinator (the agent adds --mount-proc for bwrap
# hosts only: bwrap needs a /proc of the namespace it starts in).
PID_NAMESPACE = "--pid --fork --kill-child"
# The unshare flags tried, in order: root needs no user namespace; a non-root user needs
# one, keeping its own uid and gid where util-linux can map them (2.36+), else mapped to
# root inside (which only the worker's `id` notices).  The probe runs exactly the nesting
# a step uses (the agent's namespace, a step's inside it, behind ``sandbox._INIT``), so
# what it finds works.
_PROBE_CONTAINMENT = (
    "for tool in bwrap timeout head tar find grep unshare python3; do command -v $tool; done;"
    ' for user in "" "--user --map-user=$(id -u) --map-group=$(id -g)" "--user --map-root-user";'
    f' do flags="${{user:+$user }}{PID_NAMESPACE}";'
    ' if unshare $flags sh -c \'unshare $1 -- /bin/sh -c "$2" fanout-init "" true\' sh "$flags"'
    f" {shlex.quote(_INIT)} </dev/null >/dev/null 2>&1;"
    ' then echo "unshare $flags"; break; fi; done;'
    ' printf "uid %s\\n" "$(id -u)"; printf "home %s\\n" "$HOME";'
    ' [ -d "$HOME/.ssh" ] && printf "keys %s\\n" "$HOME/.ssh"; printf "path %s\\n" "$PATH"'
)
# execvp's lookup, in builtins (sets $where): a name with a slash is that file, any
# other the first executable regular file in an absolute PATH entry.  Not ``command -v``,
# which also answers a builtin's name and a path that is not executable.
_FOUND = (
    'found() { case $1 in */*) where=$1; [ -f "$where" ] && [ -x "$where" ]; return ;; esac;'
    " set -f; saved=$IFS; IFS=:; for dir in $PATH; do case $dir in /*) ;; *) continue ;; esac;"
    ' where=$dir/$1; if [ -f "$where" ] && [ -x "$where" ]; then IFS=$saved; set +f; return 0;'
    " fi; done; IFS=$saved; set +f; return 1; }"
)
_UNSHARE_FLAGS = re.compile(
    r"(--user (--map-user=[0-9]+ --map-group=[0-9]+|--map-root-user) )?" + re.escape(PID_NAMESPACE)
)
TOOLS = ("timeout", "head", "tar", "find", "grep")
GROUP_ONLY = "process group only: a process that calls setsid can outlive its unit"


@dataclass(frozen=True, kw_only=True, slots=True)
class Facilities:
    """What a host offers fanout's agent: its tools, how units can be contained, and
    the facts a sandbox's commands are built from (``transport.Place``)."""

    bwrap: bool
    missing: tuple[str, ...]
    unshare: str | None  # the unshare flags that work there, None: no PID namespace
    # The job's commands (argv[0]s) the host cannot start, and the PATH looked on.
    lacking: tuple[str, ...] = ()
    path: str = ""
    unshare_path: str = "unshare"
    root: bool = False  # the login is root there
    home: str = ""
    keys: str | None = None  # the login's ~/.ssh, when it is a directory
    root_path: str | None = None  # the sandbox root asked about, resolved; None: missing
    python: str | None = None  # python3's path (network "apis" runs its forwarder)

    def containment(self, sandbox: str) -> str:
        """What keeps a unit's processes from outliving it, for units run under ``sandbox``."""
        if sandbox == "bwrap":
            return "pid namespace (bwrap)"
        if self.unshare is not None:
            return "pid namespace (unshare)"
        return GROUP_ONLY

    def lacking_problem(self) -> str:
        """The commands of ``lacking`` as a problem ("" for none)."""
        if not self.lacking:
            return ""
        return f"cannot start {', '.join(self.lacking)}: not found on its PATH ({self.path})"

    def step_namespace(self) -> tuple[str, ...]:
        """The unshare prefix that gives a step its own PID namespace there, or ()."""
        if self.unshare is None:
            return ()
        return (self.unshare_path, *self.unshare.split())


async def facilities(
    conn: asyncssh.SSHClientConnection, commands: Sequence[str] = (), root: str | None = None
) -> Facilities:
    """Ask a host (one command) for the agent's tools, which containment works, the
    login's facts, which of ``commands`` (the job's argv[0]s) it cannot start, and
    where the sandbox root ``root`` really is (its physical path, if it exists)."""
    script = _PROBE_CONTAINMENT
    if root is not None:
        # The path the kernel reports as a process's cwd: the agent finds a sandbox's
        # escapees by comparing with it.
        script += f'; cd -- {shlex.quote(root)} 2>/dev/null && printf "root %s\\n" "$(pwd -P)"'
    if commands:
        # The PATH a login's non-interactive shell has is the one the agent keeps.
        script += (
            f"; {_FOUND}; for cmd in {shlex.join(commands)};"
            ' do found "$cmd" || printf "lacks %s\\n" "$cmd"; done'
        )
    lines = await _ask(conn, script)
    found = {line.rsplit("/", 1)[-1]: line for line in lines if line.startswith("/")}
    flags = [line.removeprefix("unshare ") for line in lines if line.startswith("unshare ")]

    def fact(name: str) -> str | None:
        return next((line[len(name) + 1 :] for line in lines if line.startswith(f"{name} ")), None)

    return Facilities(
        bwrap="bwrap" in found,
        missing=tuple(t for t in TOOLS if t not in found),
        unshare=flags[0] if flags and _UNSHARE_FLAGS.fullmatch(flags[0]) else None,
        lacking=tuple(c for c in commands if f"lacks {c}" in lines),
        path=fact("path") or "",
        unshare_path=found.get("unshare", "unshare"),
        root=fact("uid") == "0",
        home=fact("home") or "",
        keys=fact("keys"),
        root_path=fact("root"),
        python=found.get("python3"),
    )


async def _ask(conn: asyncssh.SSHClientConnection, script: str) -> list[str]:
    """The lines a host's shell prints for ``script``."""
    try:
        answer = await conn.run(script, check=False)
    except (OSError, asyncssh.Error) as exc:
        raise Lost(describe(exc)) from None
    return str(answer.stdout or "").splitlines()


def chosen_sandbox(requested: str, offered: Facilities) -> str:
    """The sandbox ``auto`` and ``bwrap`` give on a host (the caller refuses the rest)."""
    return "bwrap" if requested != "none" and offered.bwrap else "none"


def host_place(name: str, sandbox_root: str, kind: str, offered: Facilities) -> tuple[str, Place]:
    """The host's sandbox root as the kernel names it (resolved on the host; a missing
    one made absolute against the login's home, as a login shell would read it) and
    the facts its sandboxes' commands are built from."""
    root = offered.root_path or sandbox_root
    if not root.startswith("/"):
        root = f"{offered.home.rstrip('/')}/{root}"
    root = posixpath.normpath(root)
    path = offered.path or "/usr/bin:/bin"
    if kind == "bwrap":
        containment = sandbox.Containment.BWRAP
    elif offered.unshare is not None:
        containment = sandbox.Containment.UNSHARE
    else:
        containment = sandbox.Containment.GROUP
    return root, Place(
        host=name,
        kind="bwrap" if kind == "bwrap" else "none",
        base="",  # each sandbox's own
        path=path,
        # Workers never see the login's keys (bwrap mounts an empty tmpfs on them).
        hidden=(f"{offered.keys}/",) if offered.keys else (),
        tools=tuple(str(tool) for tool in sandbox.tool_dirs(path)),
        namespace=offered.step_namespace() if kind == "none" else (),
        root=offered.root,
        containment=containment,
    )


async def unseen_commands(
    conn: asyncssh.SSHClientConnection, root: str, place: Place, commands: Sequence[str]
) -> tuple[str, ...]:
    """What keeps a unit's worker from starting on a bwrap host, each as "cannot start
    X: why": a sandbox is made in ``root`` as a unit's is (``place``, the argv of
    ``sandbox.command``) and each of ``commands`` is looked up inside it as well as
    outside, which says where it is and so why the sandbox hides it.  A bwrap that
    cannot make a sandbox at all is said too.  Nothing for a root that cannot hold a
    sandbox: the agent refuses that itself, with its own words, at the first attempt."""
    base = f"{root}/fanout-probe-{secrets.token_hex(8)}"
    inside = f'{_FOUND}; n=0; for cmd; do n=$((n + 1)); found "$cmd" || echo "unseen $n"; done'
    argv = sandbox.command(
        replace(place, base=base),
        ["/bin/sh", "-c", inside, "fanout-probe", *commands],
        network=False,
    )
    quoted = shlex.quote(base)
    script = (
        f"base={quoted}; trap 'rm -rf \"$base\"' EXIT; trap 'exit 129' HUP INT TERM;"
        ' mkdir -m 700 "$base" "$base/work" 2>/dev/null || { echo unmade; exit 0; };'
        f" {_FOUND}; n=0; for cmd in {shlex.join(commands)};"
        ' do n=$((n + 1)); found "$cmd" || continue; printf "at %s %s\\n" "$n" "$where";'
        ' printf "real %s %s\\n" "$n" "$(readlink -f -- "$where" 2>/dev/null)"; done;'
        f' {shlex.join(argv)} 2>"$base/stderr" ||'
        ' printf "failed %s\\n" "$(head -c 300 "$base/stderr" | tr "\\n" " ")"'
    )
    lines = await _ask(conn, script)
    if "unmade" in lines:
        return ()
    for line in lines:
        if line.startswith("failed "):
            said = line.removeprefix("failed ").strip() or "no message"
            return (f"bwrap cannot make a sandbox there ({said})",)

    def fact(name: str, index: str) -> str:
        prefix = f"{name} {index} "
        return next((line[len(prefix) :] for line in lines if line.startswith(prefix)), "")

    tools = [PurePosixPath(tool) for tool in place.tools]
    hidden = [PurePosixPath(entry.rstrip("/")) for entry in place.hidden]
    problems = []
    for index in (line.removeprefix("unseen ") for line in lines if line.startswith("unseen ")):
        if not index.isdigit() or not 0 < int(index) <= len(commands):
            continue
        command = commands[int(index) - 1]
        where, real = fact("at", index), fact("real", index)
        if not where:
            continue  # not found outside either: ``facilities`` says so
        hops = [PurePosixPath(where)] + ([PurePosixPath(real)] if real and real != where else [])
        why = sandbox.unseen_reason(command, hops, tools=tools, hidden=hidden)
        problems.append(
            f"cannot start {command}: "
            + (why or f"{command} resolves to {where}, which its bwrap sandboxes do not show")
        )
    return tuple(problems)


@dataclass(frozen=True, kw_only=True, slots=True)
class Probe:
    """What ``fanout hosts check`` learns about one host."""

    name: str
    address: str
    reachable: bool
    auth: bool
    shell: str
    bwrap: bool
    containment: str
    free_disk: str
    rtt_ms: float | None
    error: str
    # For a job with APIs: whether a gateway forward works there, and binds loopback
    # only ("ok (loopback)"), or why not; "" when not asked.
    gateway: str = ""


async def probe(
    connector: Connector,
    host: Host,
    sandbox: str = "auto",
    *,
    gateway: bool = False,
    network: bool | str = False,
    commands: Sequence[str] = (),
) -> Probe:
    """Reachability, authentication, shell, bwrap, containment (for units run under
    ``sandbox``), free disk in the sandbox root and round-trip time of one host, and
    (``gateway``: the job has APIs) whether a gateway forward works there: for
    ``network = "apis"`` a unix-socket forward, bwrap and python3 (its forwarder).
    ``commands`` (the job's argv[0]s) are looked up as a run's start does: inside a
    sandbox on a bwrap host (``unseen_commands``)."""
    base = {"name": host.name, "address": where(host)}
    empty = {"shell": "", "bwrap": False, "containment": "", "free_disk": "", "rtt_ms": None}
    try:
        connection = await connector.connect(host, asyncio.Semaphore(1), room=1)
    except Refused as exc:
        return Probe(**base, reachable=True, auth=False, error=str(exc), **empty)  # type: ignore[arg-type]
    except Unreachable as exc:
        return Probe(**base, reachable=False, auth=False, error=str(exc), **empty)  # type: ignore[arg-type]
    conn = connection.conn
    try:
        begin = time.monotonic()
        await conn.run("true", check=False)
        rtt = (time.monotonic() - begin) * 1000
        root = shlex.quote(host.sandbox_root)
        facts = await conn.run(
            f'echo "$SHELL"; command -v bwrap || echo -; df -Pk {root} | tail -1;'
            f" test -d {root} -a -w {root} && echo writable || echo read-only",
            check=False,
        )
        offered = await facilities(conn, commands, host.sandbox_root)
        kind = chosen_sandbox(sandbox, offered)
        problems = [offered.lacking_problem()]
        if kind == "bwrap" and not offered.lacking:
            root, place = host_place(host.name, host.sandbox_root, kind, offered)
            problems += await unseen_commands(conn, root, place, commands)
        forwarded = ""
        if gateway and network == "apis":
            forwarded = await gateway_socket(conn, host.name, kind)
            if forwarded == GATEWAY_SOCKET_OK and offered.python is None:
                forwarded = 'no python3 (runtime.network = "apis" runs a forwarder in each sandbox)'
        elif gateway:
            forwarded = await gateway_forward(conn, host.name)
        lines = [*str(facts.stdout or "").splitlines(), "", "", "", ""]
        fields = lines[2].split()
        free = f"{int(fields[3]) // 1024:,} MiB" if len(fields) > 3 and fields[3].isdigit() else "?"
        return Probe(
            **base,
            reachable=True,
            auth=True,
            shell=lines[0],
            bwrap=lines[1] != "-",
            containment=offered.containment(kind),
            free_disk=free,
            rtt_ms=rtt,
            error="; ".join(
                problem
                for problem in (
                    "" if lines[3] == "writable" else f"{host.sandbox_root} is not writable",
                    *problems,
                )
                if problem
            ),
            gateway=forwarded,
        )
    except Lost as exc:
        return Probe(**base, reachable=True, auth=True, error=str(exc), **empty)  # type: ignore[arg-type]
    finally:
        conn.close()


GATEWAY_OK = "ok (loopback)"
GATEWAY_SOCKET_OK = "ok (unix socket)"  # network "apis"
GATEWAY_FINE = (GATEWAY_OK, GATEWAY_SOCKET_OK)


async def gateway_socket(conn: asyncssh.SSHClientConnection, name: str, kind: str) -> str:
    """What a run with network "apis" would meet on this host: sandbox ``kind`` must be
    bwrap, and a unix-socket forward is made and closed again; GATEWAY_SOCKET_OK or
    the refusal."""
    refusal = network_refusal(kind)
    if refusal is not None:
        return refusal
    try:
        made = await forward.forward_path(conn, name, 9)  # never dialled, as below
    except Refused as exc:
        return str(exc).removeprefix(f"{name}: ")
    await made.close()
    return GATEWAY_SOCKET_OK


async def gateway_forward(conn: asyncssh.SSHClientConnection, name: str) -> str:
    """What a run with APIs would meet on this host: a forward made, its bound address
    checked and the forward closed again; GATEWAY_OK or the refusal."""
    try:
        # No gateway runs during a check: the forward's far end is never dialled (a
        # connection to it within these milliseconds would find port 9 closed here).
        made = await forward.forward(conn, name, 9)
    except Refused as exc:
        return str(exc).removeprefix(f"{name}: ")
    try:
        await forward.exposure(conn, name, made.port)
    except Refused as exc:
        return str(exc).removeprefix(f"{name}: ")
    finally:
        await made.close()
    return GATEWAY_OK
