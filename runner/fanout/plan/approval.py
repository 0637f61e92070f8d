"""The approved plan: a digest of what a run of a job would do, that a reviewer records
(``fanout plan --hash``) and a scheduled run checks (``fanout run --expect-plan HASH``),
the way Atlantis applies only the plan a pull request approved.

The digest covers the resolved job (``document.to_document``: every key with its
default filled in, templates as written, the hosts a hosts file gives), which includes
the inputs' fingerprint policy (``units.reuse``, ``units.version``,
``units.quarantineAfter``).  It does not cover the backlog's data: the records and
files a run selects change every day, and a reviewed job must go on running over them;
what the units themselves hold is the fingerprint's business (``run.fingerprints``).

So it changes when the job file changes in any way that changes what it says (a
comment or a reordered table does not), when a default of fanout's changes under it,
or when a hosts file changes.  Paths are written relative to the job file's folder,
so the digest made in CI on a pull request's checkout is the one the server's checkout
gives.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..spec import Spec
from .document import to_document

# What the digest is of, so a later fanout that hashes differently says so by a change.
_FORMAT = "fanout-plan/1"
# Hex digits shown: 128 bits, as a unit's fingerprint.
DIGITS = 32


def resolved(spec: Spec) -> Any:
    """The resolved job with every path under the job file's folder made relative."""
    return _relative(to_document(spec), spec.file.resolve().parent)


def plan_hash(spec: Spec) -> str:
    """The approved-plan digest of ``spec`` (see the module docstring)."""
    text = json.dumps(
        {"format": _FORMAT, "job": resolved(spec)},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:DIGITS]


def _relative(value: Any, folder: Path) -> Any:
    if isinstance(value, dict):
        return {key: _relative(inner, folder) for key, inner in value.items()}
    if isinstance(value, list):
        return [_relative(inner, folder) for inner in value]
    if isinstance(value, str) and value.startswith("/"):
        path = Path(value)
        if path == folder or path.is_relative_to(folder):
            return path.relative_to(folder).as_posix()
    return value
