from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fanout.values.quantities import (
    duration_text,
    format_duration,
    parse_duration,
    parse_size,
    size_text,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("10m", 600), ("1h30m", 5400), ("250ms", 0.25), ("2d", 172800), ("1m1s", 61)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10 minutes", "'10 minutes' is not a duration; write it like '90s', '10m' or '1h30m'"),
        ("30s1m", "'30s1m' is not a duration; give each unit once, largest first, as in '1h30m'"),
        ("1m1m", "'1m1m' is not a duration; give each unit once, largest first, as in '1h30m'"),
        ("0s", "'0s' is zero; a duration must be positive"),
    ],
)
def test_bad_durations(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_duration(text)
    assert str(caught.value) == message


@given(st.integers(min_value=1, max_value=10**9))
def test_duration_text_reads_back(millis: int) -> None:
    assert parse_duration(duration_text(millis / 1000)) == pytest.approx(millis / 1000)


def test_sizes() -> None:
    assert parse_size("4KiB") == 4096
    assert parse_size("10MB") == 10_000_000
    assert size_text(10 * 2**20) == "10MiB"
    assert size_text(1000) == "1000B"
    with pytest.raises(ValueError, match="not a size"):
        parse_size("10 megs")


def test_format_duration_for_humans() -> None:
    assert format_duration(4.25) == "4.2s"
    assert format_duration(4800) == "1h 20m"
    assert format_duration(59) == "59s"
