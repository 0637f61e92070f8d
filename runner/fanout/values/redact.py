"""Replacing secret values with ``[secret]`` in a byte stream, across line and chunk
boundaries, and in a finished text.

What counts as an occurrence of a secret (decided here, once, for every output):

- the value itself, and the value without surrounding whitespace (an env value often
  ends in a newline a worker does not print);
- for a value that spans lines (a PEM key, a JSON credential), the same with every line
  break written LF and written CRLF (a worker on another system, or a terminal,
  re-ends the lines);
- each line of a multi-line value that is longer than ``LINE_MIN`` characters once its
  surrounding whitespace is stripped, as a secret on its own: a worker may print one line
  of a key, re-indent it or re-wrap it.  Shorter lines (``{``, ``}``, a blank line) say
  nothing about the key and would redact ordinary output.  A PEM key's BEGIN/END lines
  are redacted too: over-redaction there is harmless.

Overlapping occurrences resolve leftmost-longest, as one pass over the whole text would:
the whole value of a multi-line secret becomes one ``[secret]``, not one per line.  The
streaming ``Redactor`` gives exactly the output of ``redact_text`` on the concatenation
of its chunks, however the stream is split: it holds back the shortest tail of what it
was fed that could still begin an occurrence (never more than the longest pattern minus
one byte) until more bytes or the end of the stream decide it.  At the end the held
bytes are flushed as they are (a secret cut short by a killed worker is a fragment, and
each of its lines over ``LINE_MIN`` characters is redacted anyway).

Values are encoded the way ``os.environ`` decoded them (UTF-8 with surrogateescape), so
a secret holding bytes that are not UTF-8 still matches the worker's raw output.

Gateway tokens are redacted without being named: ``gateway/tokens.py`` makes each one
``TOKEN_PREFIX`` followed by ``TOKEN_LENGTH`` characters of the URL-safe base64
alphabet, so any token (this attempt's, another unit's a worker read where a sandbox
did not hide it, a revoked one quoted from an old log) is found by its shape, always,
whatever set of secrets a caller passes.  An occurrence is the prefix followed by one
to ``TOKEN_LENGTH`` such characters, as many as there are (a token cut short is still
redacted, and characters past a whole token are not part of it).  This is the same as
adding every such string to the literal patterns, so leftmost-longest, the streaming
guarantee and the bound on what is held back (a token counts as its whole length)
all hold unchanged.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from urllib.parse import quote

REDACTED = b"[secret]"
# Lines of a multi-line secret with more characters than this are secrets on their own.
LINE_MIN = 8
# A gateway token: this prefix, then TOKEN_LENGTH characters of _TOKEN_CHARS (what
# ``secrets.token_urlsafe(32)`` gives: 256 random bits).  The prefix says what the value
# is to a person reading a worker's environment, and is unlikely in ordinary output.
TOKEN_PREFIX = "fanout-token-"  # noqa: S105 (a marker, not a password)
TOKEN_LENGTH = 43
_PREFIX = TOKEN_PREFIX.encode()
_TOKEN_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
# The longest occurrence of a token.
TOKEN_SIZE = len(_PREFIX) + TOKEN_LENGTH


def patterns(secrets: Iterable[str]) -> tuple[bytes, ...]:
    """Every byte string that counts as an occurrence of one of ``secrets``, longest first."""
    found: set[bytes] = set()
    for secret in secrets:
        if not secret:
            continue
        value = secret.encode("utf-8", "surrogateescape")
        found.add(value)
        found.add(value.strip())
        lf = value.replace(b"\r\n", b"\n")
        if b"\n" in lf or b"\r" in lf:
            for variant in (lf, lf.replace(b"\n", b"\r\n")):
                found.update((variant, variant.strip()))
            for line in lf.replace(b"\r", b"\n").split(b"\n"):
                line = line.strip()
                if len(line.decode("utf-8", "surrogateescape")) > LINE_MIN:
                    found.add(line)
    found.discard(b"")
    return tuple(sorted(found, key=lambda p: (-len(p), p)))


class Redactor:
    """Redacts a byte stream fed in chunks of any size; ``feed`` and ``close`` return the
    bytes that are safe to pass on."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.patterns = patterns(secrets)
        self._held = b""

    @property
    def held(self) -> int:
        """How many bytes are held back, waiting to be decided."""
        return len(self._held)

    def feed(self, data: bytes) -> bytes:
        buffer = self._held + data
        out, done = _redact(self.patterns, buffer, final=False)
        self._held = buffer[done:]
        return out

    def close(self) -> bytes:
        """The held bytes, redacted as the end of the stream; the redactor can be reused."""
        buffer, self._held = self._held, b""
        if not buffer:
            return b""
        return _redact(self.patterns, buffer, final=True)[0]


def redact_bytes(data: bytes, secrets: Iterable[str]) -> bytes:
    """``data`` with every occurrence of ``secrets`` replaced."""
    return _redact(patterns(secrets), data, final=True)[0] if data else data


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of ``secrets`` replaced (the same rules as bytes)."""
    data = text.encode("utf-8", "surrogateescape")
    return redact_bytes(data, secrets).decode("utf-8", "surrogateescape")


def _redact(found: tuple[bytes, ...], buffer: bytes, *, final: bool) -> tuple[bytes, int]:
    """Redact ``buffer`` up to where an occurrence could still be cut off by its end
    (all of it if ``final``): the redacted bytes, and how many bytes of ``buffer`` they
    stand for.

    A sweep from left to right: at each step the leftmost next occurrence of any pattern
    (the longest of those that start there) is replaced.  ``hold`` is the first position
    from which the rest of the buffer is a proper prefix of some pattern: an occurrence
    starting at or after it might be longer, or only begin to exist, with more bytes, so
    the sweep stops there.  One before it cannot change: anything starting earlier would
    have to reach past the buffer's end, which would put its start at or after ``hold``.
    """
    pieces: list[bytes] = []
    position = 0
    # The next occurrence of each pattern at or after ``position``, -1 if none; and of
    # a token, with its length.
    starts = [buffer.find(p) for p in found]
    token = _next_token(buffer, 0)
    hold = len(buffer) if final else _hold(found, buffer, 0)
    while True:
        best, size = -1, 0
        for index, start in enumerate(starts):
            if start != -1 and start < position:
                start = starts[index] = buffer.find(found[index], position)
            # Ties go to the earlier pattern: the longest (``found`` is longest first).
            if start != -1 and start < hold and (best == -1 or start < best):
                best, size = start, len(found[index])
        if token[0] != -1 and token[0] < position:
            token = _next_token(buffer, position)
        start, length = token
        if start != -1 and start < hold and (best == -1 or (start, -length) < (best, -size)):
            best, size = start, length
        if best == -1:
            pieces.append(buffer[position:hold])
            return b"".join(pieces), hold
        pieces += (buffer[position:best], REDACTED)
        position = best + size
        if hold < position:
            hold = _hold(found, buffer, position)


def _token_run(buffer: bytes, after: int) -> int:
    """How many token characters follow ``after`` in ``buffer``, at most TOKEN_LENGTH."""
    end = min(len(buffer), after + TOKEN_LENGTH)
    run = 0
    while after + run < end and buffer[after + run] in _TOKEN_CHARS:
        run += 1
    return run


def _next_token(buffer: bytes, position: int) -> tuple[int, int]:
    """The first token at or after ``position``: its start and length, (-1, 0) if none."""
    while (start := buffer.find(_PREFIX, position)) != -1:
        run = _token_run(buffer, start + len(_PREFIX))
        if run:
            return start, len(_PREFIX) + run
        position = start + 1
    return -1, 0


def _hold(found: tuple[bytes, ...], buffer: bytes, lowest: int) -> int:
    """The first position at or after ``lowest`` from which the rest of ``buffer`` is a
    proper prefix of a pattern (``len(buffer)`` if there is none)."""
    size = len(buffer)
    hold = _token_hold(buffer, lowest)
    for pattern in found:
        # Only the last len(pattern) - 1 bytes can begin a cut-off occurrence of it.
        start = max(lowest, size - len(pattern) + 1)
        first = pattern[:1]
        while start < hold:
            start = buffer.find(first, start, hold)
            if start == -1:
                break
            if pattern.startswith(buffer[start:]):
                hold = start
                break
            start += 1
    return hold


def encoded_forms(secret: str) -> tuple[str, ...]:
    """The forms ``secret`` takes encoded, as an upstream that echoes what it refused (or
    a program that prints it) may write it: base64, standard and URL-safe, at each of
    the three alignments the secret can have inside a longer encoded text (only the
    characters its own bytes decide, since its neighbours change the first and last);
    hex in lower and upper case; percent-encoded.  Redact them as secrets of their own:
    a secret of a few characters gives forms that ordinary text holds, so callers
    redact these for secrets long enough to be a key."""
    value = secret.encode("utf-8", "surrogateescape")
    if not value:
        return ()
    found: set[str] = {value.hex(), value.hex().upper()}
    for offset in range(3):
        text = base64.b64encode(bytes(offset) + value).decode().rstrip("=")
        # Character i holds bits [6i, 6i + 6) of the input: those wholly inside the secret.
        kept = text[-(-8 * offset // 6) : 8 * (offset + len(value)) // 6]
        found.update((kept, kept.translate(_URLSAFE)))
    found.add(quote(secret, safe="", errors="surrogateescape"))
    found.discard(secret)
    found.discard("")
    return tuple(sorted(found, key=lambda form: (-len(form), form)))


_URLSAFE = str.maketrans("+/", "-_")


def _token_hold(buffer: bytes, lowest: int) -> int:
    """The first position at or after ``lowest`` from which the rest of ``buffer`` could
    still grow into a longer token (``len(buffer)`` if there is none): a proper prefix of
    ``TOKEN_PREFIX``, or the prefix and fewer than TOKEN_LENGTH token characters."""
    size = len(buffer)
    start = max(lowest, size - TOKEN_SIZE + 1)
    while (start := buffer.find(_PREFIX[:1], start)) != -1:
        rest = buffer[start:]
        if len(rest) < len(_PREFIX):
            if _PREFIX.startswith(rest):
                return start
        elif rest.startswith(_PREFIX):
            run = _token_run(buffer, start + len(_PREFIX))
            if start + len(_PREFIX) + run == size and run < TOKEN_LENGTH:
                return start
        start += 1
    return size
