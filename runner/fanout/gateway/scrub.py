"""The real key out of everything an upstream answers, before a worker sees it.

An upstream may echo the key it was sent: in an error ("invalid x-api-key sk-..."), in a
200 body or a header (an echo service, a debugging proxy), base64- or hex-encoded, or
in a stream, where a chunk may end in the middle of it.  Every form ``redact`` knows
of the key (``redact.patterns``, and ``redact.encoded_forms``) is replaced with
``[secret]`` on every answer: each header (one whose name holds the key is dropped),
each body read whole, and each streamed body through a ``redact.Redactor``, which holds
back the few bytes that could begin the key until the next chunk decides them.  A key
shorter than ``KEY_MIN`` characters (a test's, a local server's) is left alone: its
forms would be ordinary text.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..values.redact import Redactor, encoded_forms, redact_bytes, redact_text

KEY_MIN = 8


class Scrub:
    def __init__(self, key: str) -> None:
        self._forms = (key, *encoded_forms(key)) if len(key) >= KEY_MIN else ()

    def headers(self, items: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        return [(name, self.text(value)) for name, value in items if self.text(name) == name]

    def text(self, value: str) -> str:
        return redact_text(value, self._forms) if self._forms else value

    def body(self, data: bytes) -> bytes:
        return redact_bytes(data, self._forms) if self._forms else data

    def stream(self) -> Redactor:
        """A redactor for one streamed answer (``feed`` each chunk, then ``close``)."""
        return Redactor(self._forms)
