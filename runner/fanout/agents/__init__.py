"""Reading an agent CLI's attempt: `read(agent, ...)` hands the exit code and the captured
output to that agent's classifier, `fanout.agents.<agent>`, and returns its Reading.

Each classifier is a module with `read(*, exit_code, output, now) -> Reading`, imported
only when first asked for, so a module added for a new agent needs no edit here beyond
its name in AGENTS."""

from __future__ import annotations

import importlib
from datetime import datetime
from typing import Protocol, cast

from .taxonomy import Kind, Reading

__all__ = ["AGENTS", "Kind", "Reading", "read"]

AGENTS = ("claude", "codex", "gemini", "aider", "llm")


class _Classifier(Protocol):
    def read(self, *, exit_code: int, output: str, now: datetime) -> Reading: ...


def read(agent: str, *, exit_code: int, output: str, now: datetime) -> Reading:
    """What `agent`'s attempt came to.  `output` is the attempt's captured stdout and
    stderr, decoded; `now` (timezone-aware) anchors reset times given as a wall clock."""
    # Not a FanoutError: the schema admits only AGENTS and every one ships a module, so
    # either failure is a bug in fanout (the CLI's "internal error", exit 70).
    if agent not in AGENTS:
        raise LookupError(f"no classifier for agent {agent!r} (known: {', '.join(AGENTS)})")
    name = f"{__name__}.{agent}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != name:
            raise
        raise LookupError(f"no classifier for agent {agent!r}: no module {name}") from None
    return cast(_Classifier, module).read(exit_code=exit_code, output=output, now=now)
