from __future__ import annotations

import base64
import errno
import itertools
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from fanout.attempt.capture import OutputCapture
from fanout.attempt.verdict import Verdict
from fanout.outcome import Status
from fanout.values.redact import Redactor, encoded_forms, patterns, redact_text

from helpers import make_attempt

# A PEM-like key: its lines are long enough to be secrets on their own, "xy" is not.
KEY = (
    "-----BEGIN TEST KEY-----\n"
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n"
    "xy\n"
    "BKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n"
    "-----END TEST KEY-----\n"
)
KEY_LINES = [line for line in KEY.splitlines() if len(line) > 8]
TOKEN = "sk-test-hunter2"


def _capture(tmp_path: Path, **more: object) -> OutputCapture:
    options: dict[str, object] = {"log_limit": 1 << 20, "tail_limit": 1 << 20}
    options.update(more)
    return OutputCapture(tmp_path / "a.log", **options)  # type: ignore[arg-type]


def _leaks(text: str) -> list[str]:
    return [s for s in [KEY, KEY.strip(), TOKEN, *KEY_LINES] if s in text]


def test_tail_is_bounded_and_log_is_capped(tmp_path: Path) -> None:
    capture = OutputCapture(tmp_path / "a.log", log_limit=50, tail_limit=20)
    for n in range(100):
        capture.feed(f"line {n}\n".encode())
    capture.close()
    assert capture.tail == "".join(f"line {n}\n" for n in range(100))[-20:]
    assert (tmp_path / "a.log").read_text() == "".join(f"line {n}\n" for n in range(8))[:50] + (
        "\n[fanout: log truncated at 50 bytes]\n"
    )
    assert capture.total == sum(len(f"line {n}\n") for n in range(100))


def test_secrets_are_redacted_even_when_split_across_chunks(tmp_path: Path) -> None:
    seen: list[str] = []
    capture = OutputCapture(
        tmp_path / "a.log",
        log_limit=1000,
        tail_limit=1000,
        secrets=["hunter2"],
        on_line=seen.append,
    )
    for chunk in [b"token=hun", b"ter2 ok\nno newline at end: hunter", b"2"]:
        capture.feed(chunk)
    capture.close()
    text = (tmp_path / "a.log").read_text()
    assert "hunter2" not in text
    assert "hunter2" not in capture.tail
    assert seen == ["token=[secret] ok\n", "no newline at end: [secret]"]


def test_a_multi_line_secret_is_one_redaction_and_each_long_line_is_one_too(
    tmp_path: Path,
) -> None:
    seen: list[str] = []
    capture = _capture(tmp_path, secrets=[KEY, TOKEN], on_line=seen.append)
    output = (
        f"key:\n{KEY}"  # as it is
        f"crlf:\n{KEY.replace(chr(10), chr(13) + chr(10))}"  # re-ended by a terminal
        f"bare: {KEY.strip()} end\n"  # without its final newline
        f"one line: {KEY_LINES[1]} ok\n"
        "indented:\n" + "".join(f"    {line}\n" for line in KEY.splitlines()) + f"{TOKEN}\n"
    )
    capture.feed(output.encode())
    capture.close()
    expected = (
        "key:\n[secret]crlf:\n[secret]bare: [secret] end\none line: [secret] ok\n"
        "indented:\n    [secret]\n    [secret]\n    xy\n    [secret]\n    [secret]\n[secret]\n"
    )
    assert (tmp_path / "a.log").read_text() == expected
    assert capture.tail == expected
    assert "".join(seen) == expected
    assert seen[:3] == ["key:\n", "[secret]crlf:\n", "[secret]bare: [secret] end\n"]


def test_what_counts_as_an_occurrence() -> None:
    assert patterns(["a\r\nlong enough line\r\nb"]) == (
        b"a\r\nlong enough line\r\nb",
        b"a\nlong enough line\nb",
        b"long enough line",
    )
    assert patterns(["  tok\n", ""]) == (b"  tok\r\n", b"  tok\n", b"tok")
    # A value that is not UTF-8 (os.environ decodes it with surrogateescape) still matches.
    assert redact_text("x \udcff\udcfe y", ["\udcff\udcfe"]) == "x [secret] y"


def test_a_secret_straddling_any_chunk_boundary_is_redacted(tmp_path: Path) -> None:
    output = f"a{TOKEN}b\n{KEY}c{KEY_LINES[2]}".encode()
    whole = redact_text(output.decode(), [KEY, TOKEN])
    assert whole == "a[secret]b\n[secret]c[secret]"
    for cut in range(len(output) + 1):
        capture = _capture(tmp_path, secrets=[KEY, TOKEN])
        capture.feed(output[:cut])
        capture.feed(output[cut:])
        capture.close()
        assert capture.tail == whole, cut
    capture = _capture(tmp_path, secrets=[KEY, TOKEN])
    for byte in output:
        capture.feed(bytes([byte]))
    capture.close()
    assert capture.tail == whole
    assert (tmp_path / "a.log").read_text() == whole


def test_a_secret_straddling_the_forced_split_of_a_long_line(tmp_path: Path) -> None:
    seen: list[str] = []
    capture = _capture(tmp_path, secrets=[TOKEN], on_line=seen.append)
    long_line = b"x" * 65600 + TOKEN.encode() + b"y" * 10 + b"\n"
    # The first chunk ends inside the secret, past the 64 KiB a line may grow to.
    capture.feed(long_line[:65603])
    capture.feed(long_line[65603:])
    capture.close()
    expected = "x" * 65600 + "[secret]" + "y" * 10 + "\n"
    assert (tmp_path / "a.log").read_text() == expected
    assert capture.tail == expected
    assert seen == ["x" * 65600, "[secret]" + "y" * 10 + "\n"]


# Characters secrets and output are made of: few, so occurrences and near-misses are
# frequent, and none of "[secret]" (a secret inside the marker is not a leak).
_ALPHABET = "AB\n\r -"


@settings(max_examples=300, deadline=None)
@given(
    secrets=st.lists(st.text(_ALPHABET, min_size=1, max_size=12), min_size=1, max_size=3),
    pieces=st.lists(st.text(_ALPHABET, max_size=30), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_any_split_of_the_stream_redacts_as_the_whole_text_does(
    secrets: list[str], pieces: list[str], cuts: list[int]
) -> None:
    # The output mixes secrets with noise, so occurrences straddle every kind of cut.
    text = "".join(p + secrets[n % len(secrets)] for n, p in enumerate(pieces))
    data = text.encode()
    redactor = Redactor(secrets)
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    out = b"".join(redactor.feed(data[a:b]) for a, b in itertools.pairwise(bounds))
    out += redactor.close()
    assert out.decode() == redact_text(text, secrets)
    assert redactor.held == 0
    # A held-back stretch is never longer than the longest pattern minus one byte.
    longest = max(len(p) for p in patterns(secrets))
    redactor.feed(data)
    assert redactor.held <= longest - 1
    for pattern in patterns(secrets):
        assert pattern not in out, (pattern, out)


def test_log_limit_and_tail_limit_count_redacted_bytes(tmp_path: Path) -> None:
    capture = _capture(tmp_path, secrets=[KEY], log_limit=30, tail_limit=12)
    capture.feed(f"0123456789{KEY}abcdefghij{KEY}".encode())
    capture.close()
    # The stream is "0123456789[secret]abcdefghij[secret]": 36 bytes.
    assert (tmp_path / "a.log").read_text() == (
        "0123456789[secret]abcdefghij[s\n[fanout: log truncated at 30 bytes]\n"
    )
    assert capture.logged == 30
    assert capture.tail == "ghij[secret]"
    assert capture.total == 20 + 2 * len(KEY)


def test_a_full_disk_stops_the_log_but_not_the_capture(tmp_path: Path) -> None:
    seen: list[str] = []
    # /dev/full: every write reaching the device fails with ENOSPC, as on a full disk.
    capture = OutputCapture(
        Path("/dev/full"), log_limit=1 << 20, tail_limit=16, on_line=seen.append
    )
    capture.feed(b"small\n")  # buffered: the error comes at the first flush
    errors = [capture.storage_error]
    capture.feed(b"x" * 20000 + b"\n")
    first = capture.storage_error
    assert errors == [None]
    assert first is not None
    assert first.errno == errno.ENOSPC
    capture.feed(b"more output\n")
    capture.close()
    assert capture.storage_error is first
    assert capture.tail == "xxx\nmore output\n"
    assert seen == ["small\n", "x" * 20000 + "\n", "more output\n"]


def test_a_log_error_at_close_is_kept_not_raised() -> None:
    capture = OutputCapture(Path("/dev/full"), log_limit=1 << 20, tail_limit=100)
    capture.feed(b"fits in the buffer\n")
    capture.close()
    assert capture.storage_error is not None
    assert capture.storage_error.errno == errno.ENOSPC
    assert capture.tail == "fits in the buffer\n"


def test_a_log_that_cannot_be_created_is_a_storage_error(tmp_path: Path) -> None:
    (tmp_path / "logs").write_text("a file where the log folder should be")
    capture = OutputCapture(tmp_path / "logs" / "a.log", log_limit=100, tail_limit=100)
    capture.feed(b"output\n")
    capture.close()
    assert isinstance(capture.storage_error, FileExistsError | NotADirectoryError)
    assert capture.tail == "output\n"


def test_output_after_close_is_ignored(tmp_path: Path) -> None:
    capture = _capture(tmp_path)
    capture.feed(b"kept\n")
    capture.close()
    capture.feed(b"late\n")
    capture.close()
    assert (tmp_path / "a.log").read_text() == "kept\n"
    assert capture.tail == "kept\n"


def test_the_result_tail_holds_what_redaction_held_back(tmp_path: Path) -> None:
    # "-----" could begin the key: the redactor holds it until the stream ends.
    verdict = Verdict(make_attempt(tmp_path, ["true"], secrets={"KEY": KEY}))
    verdict.capture.feed(b"failed at -----")
    result = verdict.result(Status.FAILED, "worker exited with status 1")
    verdict.close()
    assert result.output_tail == "failed at -----"
    assert _leaks(result.output_tail) == []


def test_a_result_reason_quoting_the_worker_is_redacted(tmp_path: Path) -> None:
    verdict = Verdict(make_attempt(tmp_path, ["true"], secrets={"TOKEN": TOKEN}))
    result = verdict.result(Status.FAILED, f"collect: cannot read {TOKEN}.txt")
    assert result.reason == "collect: cannot read [secret].txt"


async def test_a_last_line_without_newline_is_scanned_before_the_verdict(
    tmp_path: Path,
) -> None:
    verdict = Verdict(make_attempt(tmp_path, ["true"], secrets={"TOKEN": TOKEN}))
    verdict.capture.feed(f"{TOKEN}\nRetry-After: 7".encode())

    async def nothing() -> tuple[()]:
        return ()

    result = await verdict.decide(code=1, stage="worker", control=None, collect=nothing)
    assert (result.status, result.retry_after) == (Status.THROTTLED, 7.0)
    assert result.output_tail == "[secret]\nRetry-After: 7"


@settings(max_examples=200, deadline=None)
@given(
    before=st.binary(max_size=5),
    after=st.binary(max_size=5),
    urlsafe=st.booleans(),
)
def test_an_encoded_secret_is_found_inside_any_longer_base64_or_hex(
    before: bytes, after: bytes, urlsafe: bool
) -> None:
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    secret = "sk-ant-api03-Zm9v+/bar_0123456789"
    forms = encoded_forms(secret)
    for text in (
        encode(before + secret.encode() + after).decode(),
        (before + secret.encode()).hex(),
    ):
        redacted = redact_text(text, forms)
        assert "[secret]" in redacted
        # What is left of the encoding is its neighbours' few characters, no more.
        assert len(redacted) - len("[secret]") <= 4 * (len(before) + len(after)) // 3 + 8


def test_the_encoded_forms_of_a_secret() -> None:
    assert encoded_forms("") == ()
    # Hex both ways, percent-encoded, and base64 at offsets 0, 1 and 2 (of "YSBiL2M=",
    # the "M" holds two bits of whatever follows the secret).
    assert encoded_forms("a b/c") == (
        "6120622F63",
        "6120622f63",
        "a%20b%2Fc",
        "EgYi9j",
        "YSBiL2",
        "hIGIvY",
    )
    assert encoded_forms("key+?") == (
        "6B65792B3F",
        "6b65792b3f",
        "key%2B%3F",
        "a2V5Kz",
        "rZXkrP",
        "tleSs/",
        "tleSs_",
    )
