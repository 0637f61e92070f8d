"""Running attempts on a pool of SSH hosts: the only package that imports asyncssh.

Each host gets a few long-lived connections (one handshake serves many units); each
attempt is one channel running the POSIX sh wrapper (``wrapper.sh``), which creates the
sandbox, receives the staged files as a tar frame, runs the worker under bwrap (or
without a sandbox), runs verify, sends back the collected files, and always removes
the sandbox.  Secrets travel in frames on the channel's stdin, never in argv; no pty is
requested (a pty echoes stdin).  Each step runs in a PID namespace of its own (bwrap's,
or unshare's where the host allows one: ``probe.facilities`` finds out once per host),
and so does the agent, so a step's whole tree dies with the step and with the agent.
The stdin stays open as a lifeline: when fanout stops, times the attempt out or loses
the connection, the wrapper sees EOF and kills the unit's steps, and it enforces a hard
deadline of its own as well.

sshd's limits shape the pool: at most ``maxSessions - 2`` channels per connection (sshd
frees a slot late, and refuses channel opens near the limit: those are retried after a
short jittered delay), more connections per host for more slots, and at most eight
handshakes per host at once (MaxStartups drops unauthenticated connections beyond 10).

Keepalives are always on, so a frozen host is noticed in seconds.  A connection loss
makes the attempt ``lost`` (the unit is run again elsewhere, no rung used), the host
reconnects with backoff and is quarantined after repeated failures; when no host is
left, ``run`` raises HostsUnavailable and the run stops, resumable.

``transport`` is the pool (hosts, connections, placement, attempts), ``agent`` one
channel running the remote agent loop, ``connection`` how a connection is made and how
asyncssh's errors become fanout's, ``probe`` what ``fanout hosts check`` and ``fanout
hosts trust`` ask a host.
"""

from .connection import KnownEntry
from .probe import HostKey, Probe, fetch_host_key
from .transport import SshTransport

__all__ = ["HostKey", "KnownEntry", "Probe", "SshTransport", "fetch_host_key"]
