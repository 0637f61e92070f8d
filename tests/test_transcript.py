"""fanout.agents.transcript on what the real CLIs wrote: claude's stream-json (the
preset's format) and json, codex's exec --json events, gemini's stream-json and json,
each captured against tests/mockapi.py's tool mode (a shell command with output, then
"All done.": tests/transcriptrun.py, tests/data/agents/*/success.out); logs cut short,
garbage, and the bounds.  A live test captures each CLI again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import transcriptrun

from fanout.agents import transcript
from fanout.agents.turns import MAX_CHARS, MAX_TURNS, ToolCall, Turn

DATA = Path(__file__).parent / "data"
CLAUDE_STREAM = DATA / "transcripts" / "claude-stream-json.out"
CODEX = DATA / "transcripts" / "codex-exec-json.out"
GEMINI_STREAM = DATA / "transcripts" / "gemini-stream-json.out"
# The mock bills 30 uncached input and 7 output tokens a request, two requests; claude
# prices it (modelUsage's costUSD), codex and gemini do not.
CLAUDE_COST = 0.0006789999999999999


def _turn(role: str, text: str, *calls: ToolCall, **tokens: Any) -> dict[str, Any]:
    return Turn(role=role, text=text, tool_calls=calls, **tokens).as_dict()


def _parsed(agent: str, output: bytes) -> list[dict[str, Any]]:
    return [turn.as_dict() for turn in transcript.parse(agent, output)]


BASH = ToolCall(
    name="Bash",
    input='{"command": "echo done | tee out.txt", "description": "Run the scripted command"}',
    result="done",
)
CLAUDE_TURNS = [
    # Output tokens per response are unknown: the CLI writes the stream's first count.
    _turn("assistant", "", BASH, input_tokens=30),
    _turn("assistant", "All done.", input_tokens=30),
    _turn("result", "All done.", input_tokens=60, output_tokens=14, cost_usd=CLAUDE_COST),
]
CODEX_TURNS = [
    _turn(
        "assistant",
        "",
        ToolCall(
            name="command_execution",
            input='{"command": "/bin/bash -lc \'echo done | tee out.txt\'"}',
            result="done\n",
        ),
    ),
    _turn("assistant", "All done."),
    # Codex's 68 input tokens hold 8 cached ones; the report counts the uncached.
    _turn("result", "", input_tokens=60, output_tokens=14),
]
SHELL = ToolCall(
    name="run_shell_command", input='{"command": "echo done | tee out.txt"}', result="done"
)
GEMINI_TURNS = [
    _turn("assistant", "", SHELL),
    # Two deltas, "All" and " done.", one message.
    _turn("assistant", "All done."),
    _turn("result", "", input_tokens=60, output_tokens=14),
]
GOLDENS = {
    "claude-stream-json": ("claude", CLAUDE_STREAM, CLAUDE_TURNS),
    "codex-exec-json": ("codex", CODEX, CODEX_TURNS),
    "gemini-stream-json": ("gemini", GEMINI_STREAM, GEMINI_TURNS),
}


@pytest.mark.parametrize("case", sorted(GOLDENS))
def test_each_clis_tool_loop_reads_as_its_turns(case: str) -> None:
    agent, path, turns = GOLDENS[case]
    assert _parsed(agent, path.read_bytes()) == turns


def test_claudes_json_is_its_last_turn_with_the_attempts_totals_and_cost() -> None:
    output = (DATA / "agents" / "claude" / "success.out").read_bytes()
    assert _parsed("claude", output) == [
        _turn("result", "All done.", input_tokens=60, output_tokens=14, cost_usd=CLAUDE_COST)
    ]


def test_geminis_json_names_the_tools_it_called_but_not_their_input() -> None:
    output = (DATA / "agents" / "gemini" / "success.out").read_bytes()
    counted = ToolCall(
        name="run_shell_command", input="", result="1 call(s): 1 succeeded, 0 failed"
    )
    assert _parsed("gemini", output) == [
        _turn("result", "All done.", counted, input_tokens=60, output_tokens=14)
    ]


@pytest.mark.parametrize(
    ("agent", "path", "said"),
    [
        (
            "claude",
            DATA / "agents" / "claude" / "rate_limit_429.out",
            "API Error: Request rejected (429) · mock limit",
        ),
        (
            "codex",
            DATA / "agents" / "codex" / "rate-limit.out",
            "exceeded retry limit, last status: 429 Too Many Requests",
        ),
        (
            "gemini",
            DATA / "agents" / "gemini" / "stream-json" / "overloaded.out",
            "[API Error: The model is overloaded. Please try again later.]",
        ),
        (
            "gemini",
            DATA / "agents" / "gemini" / "stream-json" / "false_success.out",
            "The model returned an empty response with no text or thoughts. This may be a"
            " transient API issue; please try again.",
        ),
    ],
)
def test_a_failed_attempt_ends_in_the_clis_error(agent: str, path: Path, said: str) -> None:
    assert [turn.text for turn in transcript.parse(agent, path.read_bytes())] == [said]


def _cut(output: bytes, line: int, keep: int) -> bytes:
    """`output` cut `keep` bytes into its `line`th line (from 0), as capture.py cuts a
    log at logLimit: with its marker after."""
    lines = output.splitlines(keepends=True)
    return b"".join(lines[:line]) + lines[line][:keep] + b"\n[fanout: log truncated at 9 bytes]\n"


@pytest.mark.parametrize(
    ("case", "line", "turns"),
    [
        # In the result: both responses, the tool's result read; no totals.
        ("claude-stream-json", 4, CLAUDE_TURNS[:2]),
        # In the tool's result: the call without it.
        (
            "claude-stream-json",
            2,
            [
                _turn(
                    "assistant",
                    "",
                    BASH.__class__(name=BASH.name, input=BASH.input, result=""),
                    input_tokens=30,
                )
            ],
        ),
        # In turn.completed: the turns, no totals.
        ("codex-exec-json", 6, CODEX_TURNS[:2]),
        # In the first delta of the answer.
        ("gemini-stream-json", 4, GEMINI_TURNS[:1]),
        # In the init event: nothing whole.
        ("gemini-stream-json", 0, []),
    ],
)
def test_a_log_cut_short_gives_its_whole_events_turns(
    case: str, line: int, turns: list[dict[str, Any]]
) -> None:
    agent, path, _ = GOLDENS[case]
    assert _parsed(agent, _cut(path.read_bytes(), line, 40)) == turns


def test_a_cut_json_object_gives_no_transcript() -> None:
    claude = (DATA / "agents" / "claude" / "success.out").read_bytes()
    gemini = (DATA / "agents" / "gemini" / "success.out").read_bytes()
    assert transcript.parse("claude", claude[: len(claude) // 2]) == ()
    assert transcript.parse("gemini", gemini[: len(gemini) // 2]) == ()


GARBAGE = [
    b"",
    b"\xff\xfe\x00garbage\x80",
    b"hello\nworld\n",
    b"[1, 2, 3]\n",
    b'{"no": "type"}\n',
    b'{"type": 5}\n',
    b'{"type": "assistant", "message": 5}\n{"type": "user", "message": [1]}\n',
    b'{"type": "item.completed", "item": "x"}\n{"type": "tool_result", "tool_id": 1}\n',
    b"{" * 100_000 + b"\n",
]


@pytest.mark.parametrize("agent", ["claude", "codex", "gemini"])
@pytest.mark.parametrize("garbage", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_gives_no_transcript(agent: str, garbage: bytes) -> None:
    assert transcript.parse(agent, garbage) == ()


@pytest.mark.parametrize("agent", ["aider", "llm", "nobody"])
def test_an_agent_without_a_machine_readable_format_has_no_transcript(agent: str) -> None:
    assert transcript.parse(agent, CLAUDE_STREAM.read_bytes()) == ()


def _assistant(number: int, text: str, command: str = "ls", result: str = "") -> bytes:
    message = {
        "id": f"msg_{number}",
        "content": [
            {"type": "text", "text": text},
            {
                "type": "tool_use",
                "id": f"toolu_{number}",
                "name": "Bash",
                "input": {"command": command},
            },
        ],
        "usage": {"input_tokens": number},
    }
    answer = {
        "type": "tool_result",
        "tool_use_id": f"toolu_{number}",
        "content": [{"type": "text", "text": result}],
    }
    lines = [
        {"type": "assistant", "message": message},
        {"type": "user", "message": {"content": [answer]}},
    ]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_texts_inputs_and_results_are_cut_with_a_marker() -> None:
    big = "x" * (MAX_CHARS + 5)
    (turn,) = transcript.parse("claude", _assistant(1, big, command=big, result=big))
    marker = "\n[fanout: 5 more characters not shown]"
    assert turn.text == "x" * MAX_CHARS + marker
    (call,) = turn.tool_calls
    assert call.result == "x" * MAX_CHARS + marker
    # The input is JSON text: {"command": "xxx..."} is 15 characters longer than big.
    assert (
        call.input
        == ('{"command": "' + big + '"}')[:MAX_CHARS] + "\n[fanout: 20 more characters not shown]"
    )


def test_turns_past_the_cap_are_left_out_with_a_marker_and_the_result_kept() -> None:
    output = b"".join(_assistant(n, f"turn {n}") for n in range(MAX_TURNS + 10))
    output += (DATA / "agents" / "claude" / "success.out").read_bytes()
    turns = transcript.parse("claude", output)
    assert len(turns) == MAX_TURNS
    assert [t.text for t in turns[-3:]] == [
        f"turn {MAX_TURNS - 3}",
        "[fanout: 12 turns not shown]",
        "All done.",
    ]
    assert (turns[-2].role, turns[-1].role, turns[-1].cost_usd) == ("fanout", "result", CLAUDE_COST)


def test_a_response_split_over_events_is_one_turn_and_results_find_their_calls() -> None:
    # Claude Code writes one assistant event per content block, each with the
    # response's id; two calls answered in the other order.
    first: dict[str, object] = {
        "id": "msg_a",
        "content": [{"type": "text", "text": "Two things."}],
        "usage": {"input_tokens": 9},
    }
    second = {
        "id": "msg_a",
        "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "a"}}],
    }
    third = {
        "id": "msg_a",
        "content": [{"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "ls"}}],
    }
    results: list[dict[str, object]] = [
        {"type": "tool_result", "tool_use_id": "t2", "content": "a\nb", "is_error": True},
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "A"}]},
    ]
    lines: list[dict[str, object]] = [
        {"type": "assistant", "message": m} for m in (first, second, third)
    ]
    lines.append({"type": "user", "message": {"content": results}})
    output = "\n".join(json.dumps(line) for line in lines).encode()
    assert _parsed("claude", output) == [
        _turn(
            "assistant",
            "Two things.",
            ToolCall(name="Read", input='{"file_path": "a"}', result="A"),
            ToolCall(name="Bash", input='{"command": "ls"}', result="[error] a\nb"),
            input_tokens=9,
        )
    ]


@pytest.mark.slow
def test_the_installed_clis_still_write_what_the_goldens_hold(
    claude_cli: Path, codex_cli: Path, gemini_cli: Path, tmp_path: Path
) -> None:
    for agent, program in (("claude", claude_cli), ("codex", codex_cli), ("gemini", gemini_cli)):
        code, output = transcriptrun.capture(agent, program.parent, tmp_path / agent)
        name = transcriptrun.FILES[agent].removesuffix(".out")
        assert (agent, code, _parsed(agent, output.encode())) == (agent, 0, GOLDENS[name][2])
