"""How an SSH host fails us, as fanout's own exceptions (asyncssh's are translated at
this boundary): a connection lost under an attempt, a host that refuses us for good,
one that could not be reached this time, and the words for each."""

from __future__ import annotations

import asyncssh


class Lost(Exception):
    """The connection under an attempt went away."""


class Refused(Exception):
    """The host refused us for a reason retrying will not fix (host key, auth, tools)."""


class Unreachable(Exception):
    """The host could not be reached this time."""


def describe(exc: BaseException) -> str:
    if isinstance(exc, asyncssh.DisconnectError):
        return f"disconnected: {exc.reason}"
    if isinstance(exc, asyncssh.ConnectionLost):
        return f"connection lost: {exc.reason}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return str(text)
