"""Gateway tokens are redacted by their shape, whoever's they are, in every output: the
streaming Redactor gives what one pass over the whole text gives however the stream is
split, and that pass matches a plain reference (leftmost-longest over the secrets' own
patterns and every token-shaped string)."""

from __future__ import annotations

import itertools
import re
import secrets as random_secrets

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fanout.gateway.tokens import Grants
from fanout.values.redact import TOKEN_LENGTH, TOKEN_PREFIX, Redactor, patterns, redact_text

_TOKEN = re.compile(re.escape(TOKEN_PREFIX).encode() + rb"[A-Za-z0-9_-]{1,%d}" % TOKEN_LENGTH)


def _reference(data: bytes, secrets: list[str]) -> bytes:
    """Leftmost-longest, the slow obvious way: at each position the longest of the
    secrets' patterns and the token shape that starts there, else one byte."""
    found = patterns(secrets)
    out, position = [], 0
    while position < len(data):
        lengths = [len(p) for p in found if data.startswith(p, position)]
        token = _TOKEN.match(data, position)
        if token:
            lengths.append(token.end() - position)
        if lengths:
            out.append(b"[secret]")
            position += max(lengths)
        else:
            out.append(data[position : position + 1])
            position += 1
    return b"".join(out)


def _token() -> str:
    return Grants(["a"]).grant(unit="u", attempt=1, deadline=1.0)


def test_any_token_is_redacted_without_being_named() -> None:
    mine, theirs = _token(), _token()
    assert mine.startswith(TOKEN_PREFIX)
    assert len(mine) == len(TOKEN_PREFIX) + TOKEN_LENGTH
    text = f"mine={mine}\ntheirs: '{theirs}' and cut {theirs[:20]}.\n"
    assert redact_text(text, []) == "mine=[secret]\ntheirs: '[secret]' and cut [secret].\n"
    # Past a whole token, characters are the output's again; a bare prefix is no token.
    assert redact_text(f"{mine}xyz {TOKEN_PREFIX} {TOKEN_PREFIX}!", []) == (
        f"[secret]xyz {TOKEN_PREFIX} {TOKEN_PREFIX}!"
    )


def test_a_token_split_across_every_chunk_boundary_is_redacted() -> None:
    token = _token()
    data = f"a {token} b {token}".encode()
    for cut in range(len(data) + 1):
        redactor = Redactor(["unrelated-secret"])
        out = redactor.feed(data[:cut]) + redactor.feed(data[cut:]) + redactor.close()
        assert out == b"a [secret] b [secret]", cut
    redactor = Redactor([])
    out = b"".join(redactor.feed(bytes([byte])) for byte in data) + redactor.close()
    assert out == b"a [secret] b [secret]"


def test_a_token_at_the_end_of_what_was_fed_is_held_until_decided() -> None:
    token = _token()
    redactor = Redactor([])
    assert redactor.feed(b"ok " + token[:30].encode()) == b"ok "
    assert redactor.held == 30
    assert redactor.feed(token[30:].encode()) == b"[secret]"  # whole: decided at once
    assert redactor.held == 0
    assert redactor.feed(b"x fanout-tok") == b"x "
    assert redactor.close() == b"fanout-tok"  # a prefix cut short is no token


def test_a_secret_and_a_token_overlapping_resolve_leftmost_longest() -> None:
    token = _token()
    # The secret ends inside the token: the secret starts first and wins, and what is
    # left of the token is no longer a token.
    secret = "key:" + token[:20]
    assert redact_text(f"{secret}{token[20:]}", [secret]) == "[secret]" + token[20:]
    # Both start at once: the longer wins, the token here, the secret beyond it there.
    assert redact_text(f"{token}!", [token[:20]]) == "[secret]!"
    assert redact_text(f"{token}!!", [f"{token}!"]) == "[secret]!"
    # A secret inside a token: the token starts first and covers it.
    assert redact_text(f"{token} end", [token[15:30]]) == "[secret] end"


# Few characters, so prefixes, near-misses and runs of token characters are frequent.
_ALPHABET = "fanout-ke_A \n"


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(
    secrets=st.lists(st.text("AB-_ \n", min_size=1, max_size=10), max_size=2),
    pieces=st.lists(
        st.one_of(
            st.text(_ALPHABET, max_size=20),
            st.integers(min_value=0, max_value=TOKEN_LENGTH + 5).map(
                lambda n: TOKEN_PREFIX[: n + 1] if n < len(TOKEN_PREFIX) else TOKEN_PREFIX
            ),
            st.integers(min_value=1, max_value=TOKEN_LENGTH + 5).map(
                lambda n: TOKEN_PREFIX + random_secrets.token_urlsafe(48)[:n]
            ),
        ),
        max_size=10,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=12),
)
def test_any_split_redacts_tokens_and_secrets_as_the_reference_does(
    secrets: list[str], pieces: list[str], cuts: list[int]
) -> None:
    text = "".join(p + (secrets[n % len(secrets)] if secrets else "") for n, p in enumerate(pieces))
    data = text.encode()
    expected = _reference(data, secrets)
    assert redact_text(text, secrets).encode() == expected
    redactor = Redactor(secrets)
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    out = b"".join(redactor.feed(data[a:b]) for a, b in itertools.pairwise(bounds))
    assert out + redactor.close() == expected
    # What is held back never exceeds the longest occurrence there can be, less a byte.
    longest = max([len(TOKEN_PREFIX) + TOKEN_LENGTH, *(len(p) for p in patterns(secrets))])
    redactor.feed(data)
    assert redactor.held <= longest - 1
    assert _TOKEN.search(out) is None
