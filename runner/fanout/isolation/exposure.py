"""Which sandboxes hide the coordinator and the other units from a worker, and the
refusal of a job that hands its workers API tokens or ``task.secrets`` in one that
does not.

Under bwrap each step has a PID namespace with a /proc of its own, and under podman a
container: a worker sees no process but its unit's.  Plain directories (sandbox
``none``, and ``auto`` where bwrap is missing or broken) hide nothing: a worker runs
as fanout's user, reads every other worker's ``/proc/PID/environ`` (each running
unit's gateway token, with which it could spend on that unit's account, and the job's
``task.secrets``), and can write them wherever that user writes, where they outlive
the unit.  The coordinator's own environment and memory, which hold the real keys,
stay unreadable to a worker that is not root either way: the CLI makes it
non-dumpable (``cli.app.sealed_environ``).

Decision: a job that hands its workers anything of the kind runs only in sandboxes
that hide, unless it says ``runtime.unsandboxedSecrets = true`` (a machine of one's
own, a throwaway VM), which accepts the above.  Refused when it can first be known,
always before a worker starts: by ``validate`` for sandbox ``none``; at the run's
start, before anything is recorded (exit 4), for ``auto`` on this machine; host by
host for SSH hosts and Ray nodes without bwrap, which are refused with the reason as
other unusable hosts are.
"""

from __future__ import annotations

from dataclasses import dataclass

OPT_IN = "runtime.unsandboxedSecrets"
# The sandboxes whose workers see no other unit's processes.
HIDING = frozenset({"bwrap", "podman"})


def hides(kind: str) -> bool:
    """Whether sandboxes of ``kind`` hide the coordinator and the other units."""
    return kind in HIDING


@dataclass(frozen=True, kw_only=True, slots=True)
class Handed:
    """What a job hands each worker that the other units must not read: gateway tokens
    (it has [[apis]]), ``task.secrets``.  False when it hands neither, or opted in."""

    tokens: bool = False
    secrets: bool = False

    def __bool__(self) -> bool:
        return self.tokens or self.secrets

    def refusal(self, where: str, fix: str) -> str:
        """Why the job cannot run ``where`` (a phrase ending in plain directories), and
        what to do about it, ``fix`` first."""
        read = [
            *(["the other running units' API tokens"] if self.tokens else []),
            *(["the job's task.secrets"] if self.secrets else []),
        ]
        return (
            f"{where}, which do not hide the coordinator, the other units or this user's"
            f" files from a worker: it could read {' and '.join(read)} in /proc and keep"
            f" them wherever its user can write; {fix}, or set {OPT_IN} = true to accept"
            " that"
        )


# A job that hands its workers nothing the other units must not see (or opted in).
NOTHING = Handed()


def network_refusal(kind: str, fix: str = "install bubblewrap") -> str | None:
    """Why sandboxes of ``kind`` cannot have network "apis", None if they can.  Plain
    directories share the host's network (an unshared one would need a user namespace
    with CAP_NET_ADMIN kept for the worker to bring its loopback up), and podman's
    network is its own business."""
    if kind == "bwrap":
        return None
    return (
        f'runtime.network = "apis" needs bwrap sandboxes (a network namespace of their own '
        f"in which only the gateway is reachable); sandbox {kind!r} cannot limit a worker's "
        f"network: {fix}, or set runtime.network = true"
    )
