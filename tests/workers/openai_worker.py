"""A small worker of the kind users run against an OpenAI-style API: the official
`openai` SDK streaming one chat completion.

The SDK itself reads OPENAI_BASE_URL and OPENAI_API_KEY (what fanout's gateway sets
for an `openai`-style API).  The prompt is stdin, the model OPENAI_MODEL (default
gpt-4o-mini).  It prints the answer, writes it to answer.txt in its cwd (a file for the
unit to collect), and exits 1 with the status and message on an API error.  With
--include-usage it asks for the stream's usage chunk itself and prints the usage to
stderr; without, it sends the request as most clients do (the gateway adds the option).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import openai


def main(argv: list[str]) -> int:
    prompt = sys.stdin.read().strip() or "Say hello."
    include_usage = "--include-usage" in argv
    # The SDK's default of 2 retries, as users have it; a test can set it to 0.
    client = openai.OpenAI(max_retries=int(os.environ.get("OPENAI_MAX_RETRIES", "2")))
    try:
        stream = client.chat.completions.create(
            model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
            messages=[{"role": "user", "content": prompt}],
            stream=True,
            stream_options={"include_usage": True} if include_usage else openai.omit,
        )
        parts: list[str] = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
                print(
                    f"usage: {usage.prompt_tokens} in, {usage.completion_tokens} out",
                    file=sys.stderr,
                )
    except openai.APIStatusError as error:
        print(f"API error {error.status_code}: {error.message}", file=sys.stderr)
        return 1
    except openai.APIConnectionError as error:
        print(f"API connection error: {error}", file=sys.stderr)
        return 1
    answer = "".join(parts)
    print(answer)
    Path("answer.txt").write_text(answer + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
