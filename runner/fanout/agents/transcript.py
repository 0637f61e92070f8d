"""An agent attempt's transcript: its turns, tool calls with their inputs and results,
and tokens and cost per turn, read from what the CLI wrote (the attempt's log).

What each CLI writes, and what is read from it (the formats the presets ask for, and
the other one each CLI has):
- claude `--output-format stream-json --verbose`: an `assistant` event per content
  block (text, tool_use) with the API response's id and usage, a `user` event per
  tool_result, and the final `result` event.  Each API response is one turn (its blocks
  joined by that id), with its input tokens; its output tokens are not known (the CLI
  writes the event before the response's last count) and the CLI prices only the whole
  attempt, in the `result`.
  `--output-format json` is the `result` event alone: only the last turn's words.
- codex `exec --json`: `item.completed` events (agent_message, reasoning,
  command_execution, file_change, mcp_tool_call, web_search) and `turn.completed` with
  the usage of the whole exec.  Codex does not say where one API response ends: a turn
  here is a message (and the reasoning before it) with the tool calls after it.
- gemini `--output-format stream-json` (the preset's): `message` deltas, `tool_use`,
  `tool_result`, an `error` event for an empty or blocked answer, and a `result` with
  the totals (and the error, if any); `--output-format json` is one object with the
  response and statistics, whose tools are counted by name only.
Every transcript ends in a `result` turn holding the CLI's last word and the attempt's
totals (tokens, and cost where the CLI prices it), so it is not a turn of its own to sum.

The log is the worker's redacted output, cut at `runtime.logLimit`: what is not a whole
JSON line (or, for gemini's json, a whole object) is skipped, never raised on, and the
transcript is bounded whatever the log holds (`MAX_TURNS`, `MAX_CHARS` per text).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from . import jsonlines
from .turns import MAX_TURNS, Draft, ToolCall, Turn, bounded, json_text

__all__ = ["ToolCall", "Turn", "parse"]


def parse(agent: str, output: bytes) -> tuple[Turn, ...]:
    """The transcript in `agent`'s captured output; () when it holds none (an agent
    without a machine-readable format, a log cut before the first whole event)."""
    text = output.decode("utf-8", "replace")
    reader = {"claude": _claude, "codex": _codex, "gemini": _gemini}.get(agent)
    if reader is None:
        return ()
    try:
        turns = [bounded(turn) for turn in reader(text)]
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        # A shape no CLI writes (a hand-edited log): no transcript rather than no page.
        return ()
    if len(turns) > MAX_TURNS:
        left_out = len(turns) - (MAX_TURNS - 1)
        marker = Turn(role="fanout", text=f"[fanout: {left_out} turns not shown]")
        turns = [*turns[: MAX_TURNS - 2], marker, turns[-1]]
    return tuple(turns)


def _claude(output: str) -> Iterator[Turn]:
    drafts: list[Draft] = []
    calls: dict[str, Draft] = {}
    for event in _events(output):
        kind = event.get("type")
        message = event.get("message")
        if kind == "assistant" and isinstance(message, dict):
            key = str(message.get("id") or len(drafts))
            if not drafts or drafts[-1].key != key:
                usage = _object(message.get("usage"))
                # Its output_tokens is not read: the CLI writes the event before the
                # response's last usage, with the count the stream began with (1).
                drafts.append(Draft(key=key, input_tokens=_int(usage.get("input_tokens"))))
            draft = drafts[-1]
            for block in _blocks(message.get("content")):
                if block.get("type") == "text":
                    draft.texts.append(str(block.get("text") or ""))
                elif block.get("type") == "tool_use":
                    call_id = str(block.get("id"))
                    draft.call(call_id, str(block.get("name")), block.get("input"))
                    calls[call_id] = draft
        elif kind == "user" and isinstance(message, dict):
            for block in _blocks(message.get("content")):
                owner = calls.get(str(block.get("tool_use_id")))
                if block.get("type") == "tool_result" and owner is not None:
                    entry = owner.calls.get(str(block.get("tool_use_id")))
                    if entry is not None:
                        entry[2] = _result_text(block.get("content"), block.get("is_error"))
        elif kind == "result":
            drafts.append(_claude_result(event))
    for draft in drafts:
        yield draft.turn()


def _claude_result(event: dict[str, Any]) -> Draft:
    said = event.get("result")
    if not isinstance(said, str):
        said = "; ".join(map(str, event.get("errors") or [])) or str(event.get("subtype") or "")
    draft = Draft(role="result", texts=[said], cost_usd=_float(event.get("total_cost_usd")))
    models = event.get("modelUsage")
    usage = event.get("usage")
    # modelUsage sums every model the attempt used (agents.claude says why it is the one).
    if isinstance(models, dict) and models:
        entries = [m for m in models.values() if isinstance(m, dict)]
        draft.input_tokens = sum(_int(m.get("inputTokens")) or 0 for m in entries)
        draft.output_tokens = sum(_int(m.get("outputTokens")) or 0 for m in entries)
    elif isinstance(usage, dict):
        draft.input_tokens = _int(usage.get("input_tokens"))
        draft.output_tokens = _int(usage.get("output_tokens"))
    return draft


# Codex items that are tool calls, and the fields that make their input.
_CODEX_CALLS = {
    "command_execution": ("command",),
    "file_change": ("changes",),
    "mcp_tool_call": ("server", "tool", "arguments"),
    "web_search": ("query",),
}


def _codex(output: str) -> Iterator[Turn]:
    drafts: list[Draft] = []
    for event in _events(output):
        kind = event.get("type")
        item = event.get("item")
        if kind == "item.completed" and isinstance(item, dict):
            item_type = str(item.get("type"))
            last = drafts[-1] if drafts and drafts[-1].role == "assistant" else None
            if item_type in ("agent_message", "reasoning"):
                # Words start a turn, the calls after them belong to it (a response is
                # its text, then its calls), and reasoning goes with the words after it.
                if last is None or last.calls or last.key == "said":
                    drafts.append(Draft())
                text = str(item.get("text") or "")
                drafts[-1].texts.append(text if item_type == "agent_message" else f"({text})")
                if item_type == "agent_message":
                    drafts[-1].key = "said"
            elif item_type in _CODEX_CALLS and last is None:
                drafts.append(Draft())
            if item_type in _CODEX_CALLS:
                fields = {k: item.get(k) for k in _CODEX_CALLS[item_type] if k in item}
                draft = drafts[-1]
                call_id = str(item.get("id") or len(draft.calls))
                draft.call(call_id, item_type, fields)
                if call_id in draft.calls:
                    draft.calls[call_id][2] = _codex_result(item)
        elif kind in ("turn.completed", "turn.failed"):
            drafts.append(_codex_end(event))
    for draft in drafts:
        yield draft.turn()


def _codex_result(item: dict[str, Any]) -> str:
    said = item.get("aggregated_output")
    if said is None:
        said = item.get("result") or item.get("error") or item.get("status") or ""
    text = said if isinstance(said, str) else json_text(said)
    code = item.get("exit_code")
    if isinstance(code, int) and code != 0:
        text += f"\n[exit code {code}]"
    return text


def _codex_end(event: dict[str, Any]) -> Draft:
    error = event.get("error")
    said = error.get("message") if isinstance(error, dict) else None
    draft = Draft(role="result", texts=[said if isinstance(said, str) else ""])
    usage = event.get("usage")
    if isinstance(usage, dict):
        # Codex's input includes the cached input (OpenAI's count): uncached, as above.
        total = _int(usage.get("input_tokens"))
        cached = _int(usage.get("cached_input_tokens")) or 0
        draft.input_tokens = None if total is None else total - cached
        draft.output_tokens = _int(usage.get("output_tokens"))
    return draft


def _gemini(output: str) -> Iterator[Turn]:
    events = [e for e in _events(output) if e.get("type") in _GEMINI_EVENTS]
    if not events:
        yield from _gemini_json(output)
        return
    drafts: list[Draft] = []
    calls: dict[str, list[str]] = {}
    failed = ""
    for event in events:
        kind = event["type"]
        if kind == "message" and event.get("role") == "assistant":
            if not drafts or drafts[-1].role != "assistant" or drafts[-1].key == "answered":
                drafts.append(Draft())
            # Deltas of one message: joined without a separator.
            chunk = str(event.get("content") or "")
            draft = drafts[-1]
            draft.texts[-1:] = [(draft.texts[-1] if draft.texts else "") + chunk]
        elif kind == "tool_use":
            if not drafts or drafts[-1].role != "assistant" or drafts[-1].key == "answered":
                drafts.append(Draft())
            call_id = str(event.get("tool_id"))
            drafts[-1].call(call_id, str(event.get("tool_name")), event.get("parameters"))
            if call_id in drafts[-1].calls:
                calls[call_id] = drafts[-1].calls[call_id]
        elif kind == "tool_result":
            entry = calls.get(str(event.get("tool_id")))
            if entry is not None:
                said = event.get("output")
                if said is None:
                    said = event.get("error")
                entry[2] = said if isinstance(said, str) else json_text(said or "")
            # The next words are the model's answer to the results: a turn of their own.
            if drafts:
                drafts[-1].key = "answered"
        elif kind == "error" and event.get("severity") == "error":
            # An empty or blocked answer: said here, the result after it says only "error".
            failed = str(event.get("message") or "")
        elif kind == "result":
            drafts.append(_gemini_result(event, failed))
    for draft in drafts:
        yield draft.turn()


def _gemini_result(event: dict[str, Any], failed: str) -> Draft:
    error = event.get("error")
    said = _object(error).get("message") if error is not None else None
    if said is None and event.get("status") == "error":
        said = failed
    draft = Draft(role="result", texts=[said if isinstance(said, str) else json_text(said)])
    stats = _object(event.get("stats"))
    # `input` is the uncached input; `input_tokens` counts the cached too.
    draft.input_tokens = _int(stats.get("input"))
    if draft.input_tokens is None and _int(stats.get("input_tokens")) is not None:
        cached = _int(stats.get("cached")) or 0
        draft.input_tokens = (_int(stats.get("input_tokens")) or 0) - cached
    draft.output_tokens = _int(stats.get("output_tokens"))
    total, prompt = _int(stats.get("total_tokens")), _int(stats.get("input_tokens"))
    if draft.output_tokens is not None and total is not None and prompt is not None:
        # output_tokens leaves the thoughts out (billed as output, as agents.gemini counts).
        draft.output_tokens = max(draft.output_tokens, total - prompt)
    return draft


_GEMINI_TRIES = 20
_GEMINI_EVENTS = frozenset({"init", "message", "tool_use", "tool_result", "error", "result"})


def _gemini_json(output: str) -> Iterator[Turn]:
    """gemini's one JSON object (pretty-printed, so a line is not an object): the
    response and the totals; its statistics name the tools called, not their inputs."""
    decoder = json.JSONDecoder()
    # The object is the last one on stdout (stderr's lines come after): a bounded number
    # of tries from the end, as a line opening an endless string costs a scan each.
    starts = [match.start() for match in re.finditer(r"^\{", output, re.MULTILINE)]
    for start in reversed(starts[-_GEMINI_TRIES:]):
        try:
            value, _ = decoder.raw_decode(output, start)
        except ValueError:
            continue
        if not isinstance(value, dict) or not ({"response", "error"} & value.keys()):
            continue
        error = value.get("error")
        said = value.get("response")
        text = said if isinstance(said, str) else ""
        if isinstance(error, dict):
            text = str(error.get("message") or error.get("type") or "")
        draft = Draft(role="result", texts=[text])
        stats = _object(value.get("stats"))
        models = _object(stats.get("models"))
        tokens = [_object(_object(m).get("tokens")) for m in models.values()]
        if tokens:
            draft.input_tokens = sum(_int(t.get("input")) or 0 for t in tokens)
            # Thinking tokens are billed as output (agents.gemini counts them so too).
            draft.output_tokens = sum(
                (_int(t.get("candidates")) or 0) + (_int(t.get("thoughts")) or 0) for t in tokens
            )
        tools = _object(stats.get("tools"))
        named = _object(tools.get("byName"))
        for name, counts in named.items():
            if isinstance(counts, dict):
                result = f"{counts.get('count')} call(s): {counts.get('success')} succeeded"
                draft.call(name, name, None)
                draft.calls[name][2] = f"{result}, {counts.get('fail')} failed"
        yield draft.turn()
        return


def _events(output: str) -> Iterator[dict[str, Any]]:
    """Each line of `output` that is a whole JSON object with a string `type`."""
    return (value for value in jsonlines.objects(output) if isinstance(value.get("type"), str))


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _blocks(content: object) -> Iterator[dict[str, Any]]:
    if isinstance(content, list):
        yield from (block for block in content if isinstance(block, dict))


def _result_text(content: object, is_error: object) -> str:
    if isinstance(content, list):
        content = "\n".join(str(b.get("text") or "") for b in _blocks(content))
    text = content if isinstance(content, str) else json_text(content)
    return f"[error] {text}" if is_error is True else text


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None
