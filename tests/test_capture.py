from __future__ import annotations

from pathlib import Path

from fanout.capture import OutputCapture


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
