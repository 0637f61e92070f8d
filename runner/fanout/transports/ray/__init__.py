"""Running attempts on a Ray cluster (``runtime.ray``; the optional extra
``fanout[ray]``): the only package that imports ray, and within it only ``rayapi``.

``transport`` is the transport on the coordinator (one Ray actor per running unit,
placed by Ray with the job's resources, serving attempt after attempt), ``node`` the
actor's side on a node (a local sandbox there, made by ``local``), ``rayapi`` Ray itself
(the actor class, the tasks pinned to a node, the error mapping), ``facts`` the values
the two sides exchange.  Importing this package does not import ray: a job without
runtime.ray never needs it, and one with it but without ray installed gets an error
naming the extra (``transport.load``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .transport import EXTRA, RayTransport

__all__ = ["EXTRA", "RayTransport"]


def __getattr__(name: str) -> Any:
    """``RayTransport`` and ``EXTRA``, imported on first use: a node's actor imports
    ``rayapi`` and ``node`` through this package and never the coordinator's side
    (the attempt driver and the job language: 0.1 s of each actor's start)."""
    if name in __all__:
        from . import transport

        return getattr(transport, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
