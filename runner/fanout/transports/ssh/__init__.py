"""Running attempts on a pool of SSH hosts: the only package that imports asyncssh.

Each host gets a few long-lived connections (one handshake serves many units); each
slot is one long-lived channel running the remote agent (``agent.sh``), a small
executor that serves one sandbox at a time.  What an attempt runs is decided on the
coordinator (``attempt``) and sent whole: the agent makes the sandbox directory,
extracts the staged tar (streamed, never built in memory), runs each step's argv (bwrap's
or unshare's, from ``sandbox.command``) with exactly the environment it is sent,
lists the work directory, hands over the files the coordinator picked, and removes the
sandbox (where the host has python3, through its ``keeper``: a process beside the
agent that makes and removes sandbox directories, so a unit costs no ``mkdir`` or
``rm``).  Secrets travel on the channel's stdin into shell memory, never in argv or on
disk; no pty is requested (a pty echoes stdin).  Each step runs in a PID namespace of
its own (bwrap's, or unshare's where the host allows one: ``probe.facilities`` finds
out once per host), and so does the agent, so a step's whole tree dies with the step
and with the agent.  The stdin stays open as a lifeline: when fanout stops, gives up on
a step (its deadline) or loses the connection, the agent sees EOF, kills what runs in
the sandbox, removes it and exits; it also kills a step by itself a little after
fanout's deadline (a backstop for a host fanout can no longer reach).

sshd's limits shape the pool: at most ``maxSessions - 2`` channels per connection (sshd
frees a slot late, and refuses channel opens near the limit: those are retried after a
short jittered delay), more connections per host for more slots, and at most eight
handshakes per host at once (MaxStartups drops unauthenticated connections beyond 10).

Keepalives are always on, so a frozen host is noticed in seconds.  A connection loss
makes the attempt ``lost`` (the unit is run again elsewhere, no rung used), the host
reconnects with backoff and is quarantined after repeated failures; when no host is
left, ``run`` raises HostsUnavailable and the run stops, resumable.

``pool`` is the pool (hosts, connections, reconnects and quarantine, placement, agent
channels), ``transport`` the transport on top of it (start, each host's sandbox, run),
``sandbox`` one attempt's sandbox spoken through an agent, ``wire`` the agent's wire
format, ``keeper`` the agent's keeper (run by the host's python3), ``agent`` one agent
channel and its retirement, ``connection`` how a connection
is made and how asyncssh's errors become fanout's, ``forward`` the remote port forward
each connection makes to the API gateway (a job with APIs), ``probe`` what a run's
start and ``fanout hosts check`` ask a host, ``hostkey`` what ``fanout hosts trust``
asks.
"""

import warnings

# asyncssh imports DSA's classes, and recent cryptography releases (51 here) warn about
# them on stderr: every fanout command that reached this package printed ten lines
# about a key type fanout never offers.  Said once here, before anything imports it.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh(\.|$)")

from .connection import KnownEntry  # noqa: E402 - after the filter
from .hostkey import HostKey, fetch_host_key  # noqa: E402
from .probe import Probe  # noqa: E402
from .transport import SshTransport  # noqa: E402

__all__ = ["HostKey", "KnownEntry", "Probe", "SshTransport", "fetch_host_key"]
