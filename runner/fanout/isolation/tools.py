"""Local sandboxes: which tool isolates a worker, how its processes are contained, and
the argv that wraps it.

A sandbox is one directory: the unit's staged files, the worker's cwd, and the
throttle control file (never collected).  Under bwrap the whole system is
read-only, /tmp is private, only the sandbox directory is writable, the network is cut
unless the job asks for it, fanout's state, configuration and keys are hidden (see
``hidden``), and the worker runs without capabilities.

Every step (the worker, then verify) runs in a PID namespace of its own wherever this
machine allows one: bwrap's, or for ``sandbox = "none"`` util-linux's ``unshare``.
When the namespace's first process exits, the kernel kills every other process in it,
so nothing a step started outlives the step, whatever it did with setsid or its file
descriptors; and a SIGKILLed fanout takes the namespace down through the parent-death
signal chain.  Where neither works (a non-root user without user namespaces) a step
has only its process group, and ``containment`` says so.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Literal

from ..errors import EnvironmentProblem

# Read here as ``tools.Kind`` and ``tools.Containment`` by what chooses a tool.
from .place import Containment as Containment
from .place import Kind as Kind
from .place import Place

# Found once and started by its absolute path: a PATH search would run in the vfork
# child while fanout waits for it.
SETPRIV = shutil.which("setpriv")
UNSHARE = shutil.which("unshare")

# A worker must never outlive fanout: the resumed run would run its unit a second time
# beside it.  The parent-death signal (setpriv --pdeathsig, bwrap --die-with-parent)
# fires only if fanout dies after the signal was set; fanout SIGKILLed while a worker
# was being spawned would leave that worker running.  So the guard first sets the
# signal, then checks that its parent is still fanout, and only then execs the worker.
# It costs an exec of setpriv and of sh per step (docs/performance.md, "Local sandboxes").
_GUARD = (
    '[ "$PPID" = "$1" ] || exit 137; command -v "$2" > /dev/null'
    ' || { echo "fanout: cannot start $2: command not found" >&2; exit 127; };'
    ' shift 2; exec "$@"'
)
_PR_SET_PDEATHSIG = 1
# The first process of an unshare'd namespace.  unshare arms --kill-child in its child
# after the fork, so a fanout SIGKILLed in between (taking unshare with it) leaves the
# child orphaned with nothing armed: like the guard, the init first checks that its
# parent is still unshare (by the host's /proc, which is why the namespace keeps it:
# no --mount-proc) and gives up otherwise.  Given a lifeline (its first argument: on this
# machine fanout's PID, empty on a host, whose agent has a lifeline of its own), it also
# checks that unshare's parent is still that process: the guard's check, so that on this
# machine setpriv execs unshare directly and a step costs one exec of sh fewer
# (``guarded``).  It then checks the worker exists, and runs it as a child rather than
# exec'ing it, so the worker is not PID 1 (which ignores signals it has no handler for,
# and inherits every orphan to reap), as under bwrap, whose own init plays this part.
# Builtins only: no process.  dash, the init, reports a worker killed by a signal on the
# step's output ("Killed"): keeping that off the output costs a fork per step (a
# subshell: 0.5 ms, measured, a sixth of a no-op unit here), so it stays, and says truly
# what happened.
_INIT = (
    'read -r _ _ _ parent _ < /proc/self/stat && read -r name < "/proc/$parent/comm"'
    ' && [ "$name" = unshare ] || exit 137; [ -z "$1" ] || {'
    ' read -r _ _ _ lifeline _ < "/proc/$parent/stat" && [ "$lifeline" = "$1" ]; }'
    ' || exit 137; shift; command -v "$1" > /dev/null'
    ' || { echo "fanout: cannot start $1: command not found" >&2; exit 127; };'
    ' "$@"; exit $?'
)


# runtime.network = "apis": the sandbox has a network namespace of its own (bwrap
# --unshare-net: only a loopback, which bwrap brings up), and the gateway's unix socket
# (on the coordinator, or an SSH forward's on a host) is bound in at GATEWAY_SOCKET.
# A forwarder, the step's first process inside the sandbox, listens on the sandbox's
# 127.0.0.1:GATEWAY_PORT and relays each connection to the socket, then runs the step
# as its child (signals passed on) and exits with its status: the way Anthropic's
# sandbox-runtime bridges its proxy.  Threads, not asyncio, whose import alone doubled
# the forwarder's cost per step.  Python (stdlib only, -I -S: no site, no PYTHON*
# variables) rather than socat, which few hosts have; python3 is checked for where the
# worker runs.  Any port is free in a namespace of one's own; this one is unlikely to
# be a worker's own server's.  Nothing else is reachable: no other address exists.
GATEWAY_PORT = 29170
GATEWAY_SOCKET = "/tmp/fanout-gateway.sock"  # /tmp is the sandbox's private tmpfs
_FORWARDER = """
import os, signal, socket, sys, threading
port, path, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
server = socket.create_server(("127.0.0.1", port), backlog=128)
def pump(source, sink):
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def relay(client):
    with client, socket.socket(socket.AF_UNIX) as upstream:
        try:
            upstream.connect(path)
        except OSError:
            return
        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        back.join()
def serve():
    while True:
        client, _ = server.accept()
        threading.Thread(target=relay, args=(client,), daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
child = 0
def pass_on(signum, frame):
    if child:
        try:
            os.kill(child, signum)
        except OSError:
            pass
    else:
        os._exit(128 + signum)
for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(signum, pass_on)
try:
    child = os.posix_spawnp(argv[0], argv, os.environ)
except OSError as exc:
    sys.stderr.write(f"fanout: cannot start {argv[0]}: {exc.strerror or exc}\\n")
    sys.stderr.flush()
    os._exit(127)
code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
os._exit(code)
"""


GROUP_ONLY_WARNING = (
    "no PID namespace for workers here (unshare is missing or failed; a non-root user "
    "needs unprivileged user namespaces): a worker's processes that leave its process "
    "group can outlive their unit, and outlive fanout if it is killed"
)


@dataclass(frozen=True, slots=True)
class Choice:
    kind: Kind
    warning: str | None = None
    containment: Containment = Containment.GROUP


def choose(requested: str, image: str | None = None) -> Choice:
    """The sandbox to use on this machine for ``runtime.sandbox = requested``."""
    if requested == "none":
        return _plain(None)
    if requested == "podman":
        if shutil.which("podman") is None:
            raise EnvironmentProblem("runtime.sandbox is 'podman' but podman is not installed")
        return Choice("podman", containment=Containment.PODMAN)
    works = shutil.which("bwrap") is not None and _bwrap_works()
    if works:
        return Choice("bwrap", containment=Containment.BWRAP)
    if requested == "bwrap":
        raise EnvironmentProblem(
            "runtime.sandbox is 'bwrap' but bubblewrap is not installed or cannot create "
            "namespaces here (apt-get install bubblewrap)"
        )
    return _plain("bubblewrap (bwrap) not found: units run in plain directories without isolation")


def _plain(warning: str | None) -> Choice:
    contained = containment("none")
    if contained is Containment.GROUP:
        warning = f"{warning}; {GROUP_ONLY_WARNING}" if warning else GROUP_ONLY_WARNING
    return Choice("none", warning, contained)


def containment(kind: Kind = "none") -> Containment:
    """Which guarantee this machine gives that a step's processes die with the step and
    with fanout, for sandboxes of ``kind`` (``hosts check`` shows the same words)."""
    if kind == "bwrap":
        return Containment.BWRAP
    if kind == "podman":
        return Containment.PODMAN
    return Containment.UNSHARE if pid_namespace() else Containment.GROUP


@functools.cache
def pid_namespace() -> tuple[str, ...]:
    """The unshare argv prefix that gives a step its own PID namespace here, or ().

    Root unshares the PID namespace directly (not the mount namespace: ``_INIT`` reads
    the host's /proc to see its parent); anyone else needs a user namespace first,
    mapping their own uid (not root: some workers refuse to run as root, and files they
    create keep their owner).  The first
    prefix that runs ``true`` wins; the answer is kept for the process's lifetime.
    """
    if UNSHARE is None:
        return ()
    kill = ["--pid", "--fork", "--kill-child"]
    users = (
        [[]]
        if os.geteuid() == 0
        else [
            ["--user", "--map-current-user"],
            ["--user", "--map-root-user"],  # util-linux before 2.38 has no --map-current-user
        ]
    )
    for user in users:
        prefix = (UNSHARE, *user, *kill)
        if succeeds([*prefix, "--", "true"]):
            return prefix
    return ()


def _bwrap_works() -> bool:
    return succeeds(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"])


def succeeds(argv: Sequence[str]) -> bool:
    """Whether ``argv`` (a probe of what this machine allows) exits 0 within 10 s."""
    try:
        probe = subprocess.run(argv, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def command(
    place: Place,
    argv: Sequence[str],
    *,
    network: bool | Literal["apis"],
    env_names: Sequence[str] = (),
) -> list[str]:
    """The argv that runs a step's ``argv`` in the sandbox at ``place``, for every
    transport: the one place bwrap's, unshare's and podman's arguments are written.
    Environment values never appear here: they reach the step through the executor's
    environment (podman is given their names only).  ``network = "apis"`` needs a bwrap
    place with ``gateway_socket`` and ``python`` (the transports refuse the rest)."""
    base = place.base
    work = f"{base}/work"
    if place.kind == "none":
        if place.spawner is not None and place.lifeline is not None:
            return [place.spawner, str(place.lifeline), "--", *argv]
        if not place.namespace:
            return list(argv)
        lifeline = "" if place.lifeline is None else str(place.lifeline)
        return [*place.namespace, "--", "/bin/sh", "-c", _INIT, "fanout-init", lifeline, *argv]
    if place.kind == "podman":
        command = ["podman", "run", "--rm", "-i", "--network", "host" if network else "none"]
        command += ["-v", f"{base}:{base}", "-w", work]
        for name in env_names:
            command += ["-e", name]  # a bare name: podman copies the value from its own env
        return [*command, str(place.image), *argv]
    command = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    command += ["--tmpfs", "/tmp", "--tmpfs", "/var/tmp"]
    for path in place.tools:
        command += ["--ro-bind-try", path, path]
    # After the tools (a tool directory must not bring a hidden one back), before the
    # sandbox (which may itself lie below a hidden directory, as under a state dir).
    for hidden in place.hidden:
        if not _shown(hidden.rstrip("/"), place.tools):
            continue  # a mount on it would make its path, nothing else, show in /tmp
        if hidden.endswith("/"):
            command += ["--tmpfs", hidden.rstrip("/")]
        else:
            command += ["--ro-bind", "/dev/null", hidden]
    command += ["--bind", base, base, "--chdir", work]
    command += ["--unshare-all", "--die-with-parent", "--new-session"]
    if place.root:
        # Real root keeps its capabilities under bwrap: CAP_DAC_OVERRIDE would read every
        # user's 0600 files and CAP_SYS_PTRACE the coordinator's memory.  Without them a
        # root worker reads what root owns or what anyone may read, minus ``hidden``.
        command += ["--cap-drop", "ALL"]
    if network == "apis":
        if place.kind != "bwrap" or place.gateway_socket is None or place.python is None:
            raise AssertionError(f"host {place.host} cannot limit a sandbox to the gateway")
        # The network stays unshared (--unshare-all): only the sandbox's own loopback.
        command += ["--bind", place.gateway_socket, GATEWAY_SOCKET]
        forwarder = [place.python, "-I", "-S", "-c", _FORWARDER, str(GATEWAY_PORT)]
        return [*command, "--", *forwarder, GATEWAY_SOCKET, *argv]
    if network:
        command.append("--share-net")
    return [*command, "--", *argv]


def _shown(path: str, tools: Sequence[str]) -> bool:
    """Whether a sandbox would show ``path`` were it not hidden: not below the private
    /tmp or /var/tmp, unless in a tool directory bound back."""

    def below(directory: str) -> bool:
        return path == directory or path.startswith(directory.rstrip("/") + "/")

    return not any(below(str(private)) for private in PRIVATE) or any(map(below, tools))


def gateway_url() -> str:
    """The gateway as a worker in a sandbox with network "apis" reaches it."""
    return f"http://127.0.0.1:{GATEWAY_PORT}"


def hidden_entries(paths: Iterable[Path]) -> tuple[str, ...]:
    """``Place.hidden`` for ``paths`` on this machine: directories end in ``/`` (bwrap
    mounts an empty tmpfs on them), files do not (bwrap binds /dev/null on them), and
    what does not exist is left out (bwrap cannot mount on a missing path in a
    read-only root)."""
    found = []
    for path in paths:
        if path.is_dir():
            found.append(f"{path}/")
        elif path.exists():
            found.append(str(path))
    return tuple(found)


def guarded(argv: Sequence[str], program: str, place: Place) -> list[str]:
    """``argv`` (``command``'s for ``place``) behind the guard, on this machine (a
    remote executor has its lifeline instead: see ``ssh/agent.sh``).  The guard also
    checks that the step's ``program`` (its own argv[0], inside whatever ``command``
    wrapped it in) can start: a missing one is exit 127 with fanout's words under every
    sandbox kind, where bwrap would report it as its own exit 1 (what this machine's
    PATH has, the sandbox shows, but below the private /tmp, which the start check
    covers).  setpriv sets the signal without a preexec_fn (which would force a slow
    fork instead of vfork for every worker); without setpriv, ``preexec`` does the same
    in Python.  In a PID namespace of unshare's with a lifeline, the init makes both
    checks itself (``_INIT``), and setpriv execs unshare directly."""
    if SETPRIV is None or (place.kind == "none" and place.spawner is not None):
        return list(argv)  # the spawner makes both checks itself (``spawner.c``)
    if place.kind == "none" and place.namespace and place.lifeline is not None:
        return [SETPRIV, "--pdeathsig", "KILL", "--", *argv]
    return [
        SETPRIV,
        "--pdeathsig",
        "KILL",
        "--",
        "/bin/sh",
        "-c",
        _GUARD,
        "fanout",
        str(os.getpid()),
        program,
        *argv,
    ]


def preexec(place: Place) -> Callable[[], None] | None:
    """The preexec_fn that keeps a worker from outliving fanout where setpriv is missing."""
    if SETPRIV is not None or place.kind == "podman" or place.spawner is not None:
        return None
    coordinator = os.getpid()

    def die_with_fanout() -> None:  # pragma: no cover - runs in the child before exec
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != coordinator:
            os._exit(137)

    return die_with_fanout


# What bwrap replaces with an empty tmpfs.
PRIVATE = (Path("/tmp"), Path("/var/tmp"))
HIDDEN_WHY = "which the sandbox hides from workers (fanout's state, configuration and keys)"


def unseen(
    path: PurePath, *, tools: Sequence[PurePath], hidden: Sequence[PurePath]
) -> tuple[PurePath, str] | None:
    """The directory that keeps ``path`` out of a bwrap worker's sight, and why; None
    where the sandbox shows it.  ``command``'s mounts as a rule, for the start checks
    (locally they predict with it, an SSH host's probe explains what it found): what
    ``hidden`` names is masked, after the ``tools`` (PATH directories under the private
    /tmp, bound back), so hidden wins; the rest of /tmp and /var/tmp is a fresh tmpfs."""
    for masked in hidden:
        if path.is_relative_to(masked):
            return masked, HIDDEN_WHY
    if any(path.is_relative_to(tool) for tool in tools):
        return None
    for private in PRIVATE:
        if path.is_relative_to(private):
            return private, f"which bwrap replaces with a private {private}"
    return None


def unseen_reason(
    command: str,
    hops: Sequence[PurePath],
    *,
    tools: Sequence[PurePath],
    hidden: Sequence[PurePath],
) -> str | None:
    """Why a bwrap worker cannot start ``command``, found at ``hops[0]`` (then each
    symlink on the way, and where it finally leads), or None where each hop shows."""
    for path in hops:
        masked = unseen(path, tools=tools, hidden=hidden)
        if masked is None:
            continue
        directory, why = masked
        via = "" if path == hops[0] else f" (through {hops[0]})"
        return f"{command} resolves to {path}{via}, under {directory}, {why}"
    return None


def bound_tools(path: str) -> tuple[Path, ...]:
    """The directories a local bwrap sandbox binds back for workers whose PATH is
    ``path``: those of ``tool_dirs``, and fanout's own environment's (tests and jobs
    run its python).  One answer for the transport that binds them and for the start
    check that predicts what a worker finds."""
    return tuple(tool_dirs(f"{path}:{sys.prefix}/bin"))


def tool_dirs(path: str) -> list[Path]:
    """Directories of ``path`` (a PATH value) that a private /tmp would hide: a checkout
    and its virtualenv under /tmp must still run inside bwrap.  A ``.../bin`` entry
    brings its whole prefix (a virtualenv needs its ``lib``), read-only."""
    found: list[Path] = []
    for entry in path.split(":"):
        directory = Path(entry)
        if not directory.is_absolute() or not any(
            directory.is_relative_to(private) for private in PRIVATE
        ):
            continue
        root = directory.parent if directory.name == "bin" else directory
        if root not in found and root not in PRIVATE:
            found.append(root)
    return found
