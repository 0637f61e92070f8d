"""The JSON objects an agent CLI wrote one a line (claude's stream-json and result
line, codex's and gemini's events), read from output that may be cut anywhere: a line
that is not a whole JSON object is skipped, never an error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def objects(output: str, *, from_end: bool = False) -> Iterator[dict[str, Any]]:
    """Each line of ``output`` that is a whole JSON object, first line first (or last
    first: the result an agent writes at its end is found without parsing the rest)."""
    lines = output.splitlines()
    for line in reversed(lines) if from_end else lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value
