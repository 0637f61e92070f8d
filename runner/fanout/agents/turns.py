"""An agent attempt's transcript as a value: turns, their tool calls, tokens and cost,
and the bounds that keep any transcript small enough for a page (`agents.transcript`
reads them from what each CLI wrote)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# The page holds every attempt's transcript: a runaway agent's 10 MiB log must not make
# it unopenable.  A cut text ends in a marker saying how much was left out.
MAX_TURNS = 200
MAX_CALLS = 50
MAX_CHARS = 20_000


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCall:
    name: str
    # The call's arguments as JSON text (a command line is `{"command": "..."}`).
    input: str
    result: str

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "input": self.input, "result": self.result}


@dataclass(frozen=True, kw_only=True, slots=True)
class Turn:
    # "assistant" (a response of the model), "result" (the CLI's last word, with the
    # attempt's totals), "fanout" (a marker: turns left out).
    role: str
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    # Uncached input, as the report counts it; None where the CLI does not say.
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "text": self.text,
            "tool_calls": [call.as_dict() for call in self.tool_calls],
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
        }


@dataclass(kw_only=True, slots=True)
class Draft:
    """A turn being read: its calls by id, so a later result finds its call."""

    role: str = "assistant"
    key: str | None = None
    texts: list[str] = field(default_factory=list)
    calls: dict[str, list[str]] = field(default_factory=dict)  # id -> [name, input, result]
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None

    def call(self, call_id: str, name: str, arguments: object) -> None:
        if len(self.calls) < MAX_CALLS:
            self.calls[call_id] = [name, json_text(arguments), ""]

    def turn(self) -> Turn:
        calls = tuple(ToolCall(name=n, input=i, result=r) for n, i, r in self.calls.values())
        return Turn(
            role=self.role,
            text="\n\n".join(t for t in self.texts if t),
            tool_calls=calls,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cost_usd=self.cost_usd,
        )


def json_text(value: object) -> str:
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False)


def _cut(text: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    return text[:MAX_CHARS] + f"\n[fanout: {len(text) - MAX_CHARS} more characters not shown]"


def bounded(turn: Turn) -> Turn:
    calls = tuple(
        ToolCall(name=_cut(c.name), input=_cut(c.input), result=_cut(c.result))
        for c in turn.tool_calls
    )
    return Turn(
        role=turn.role,
        text=_cut(turn.text),
        tool_calls=calls,
        input_tokens=turn.input_tokens,
        output_tokens=turn.output_tokens,
        cost_usd=turn.cost_usd,
    )
