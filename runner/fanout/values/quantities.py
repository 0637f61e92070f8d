"""Human-written quantities in job files: durations ("1h30m") and sizes ("10MiB")."""

from __future__ import annotations

import re

DURATION_PATTERN = r"^([0-9]+(ms|[dhms]))+$"
SIZE_PATTERN = r"^[0-9]+(B|KB|KiB|MB|MiB|GB|GiB)$"

_DURATION_PART = re.compile(r"([0-9]+)(ms|[dhms])")
_DURATION_ORDER = ("d", "h", "m", "s", "ms")
# Whole milliseconds, so a 400-digit number is an exact integer until the range check.
_MILLIS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}
# Ten years: longer than any timeout, backoff or window means anything, and far from
# where datetime and asyncio arithmetic overflow.
MAX_DURATION_S = 3650 * 86400
# A petabyte: more than any log or tail, and within a C integer everywhere sizes go.
MAX_SIZE = 2**50
_SIZE = re.compile(r"^([0-9]+)(B|KB|KiB|MB|MiB|GB|GiB)$")
_BYTES = {"B": 1, "KB": 1000, "KiB": 1024, "MB": 10**6, "MiB": 2**20, "GB": 10**9, "GiB": 2**30}


def parse_duration(text: str) -> float:
    """Seconds in ``text`` such as ``"90s"``, ``"10m"``, ``"1h30m"`` or ``"250ms"``.

    Units must appear largest first and at most once, so ``"30s1m"`` is rejected
    rather than silently read as 90 seconds.  Raises ValueError with a readable message.
    """
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{text!r} is not a duration; write it like '90s', '10m' or '1h30m'")
    total = 0
    last_rank = -1
    for number, unit in _DURATION_PART.findall(text):
        rank = _DURATION_ORDER.index(unit)
        if rank <= last_rank:
            raise ValueError(
                f"{text!r} is not a duration; give each unit once, largest first, as in '1h30m'"
            )
        last_rank = rank
        total += int(number) * _MILLIS[unit]
    if total <= 0:
        raise ValueError(f"{text!r} is zero; a duration must be positive")
    if total > MAX_DURATION_S * 1000:
        raise ValueError(
            f"{_shorten(text)} is longer than {duration_text(MAX_DURATION_S)}, "
            "the longest duration fanout accepts"
        )
    return total / 1000


def parse_size(text: str) -> int:
    """Bytes in ``text`` such as ``"512KiB"`` or ``"10MB"``."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size; write it like '512KiB' or '10MB'")
    size = int(match.group(1)) * _BYTES[match.group(2)]
    if size > MAX_SIZE:
        raise ValueError(f"{_shorten(text)} is larger than 1PiB, the largest size fanout accepts")
    return size


def _shorten(text: str) -> str:
    """``text`` quoted, with a 400-digit number shown by its length."""
    if len(text) <= 40:
        return repr(text)
    return repr(f"{text[:12]}...{text[-8:]}") + f" ({len(text)} characters)"


def format_duration(seconds: float) -> str:
    """A short human reading of ``seconds``: ``'1h 20m'``, ``'45s'``, ``'1.2s'``."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    shown = [f"{value}{unit}" for value, unit in parts if value]
    return " ".join(shown[:2]) or "0s"


def duration_text(seconds: float) -> str:
    """The job-file spelling of ``seconds``: 5400 -> ``'1h30m'``, 0.25 -> ``'250ms'``."""
    millis = round(seconds * 1000)
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, millis = divmod(millis, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def size_text(size: int) -> str:
    """The job-file spelling of ``size`` bytes: 10485760 -> ``'10MiB'``."""
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 1024)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size}B"


def usd_text(amount: float) -> str:
    """Dollars to the cent, or to a hundredth of a cent below one dollar (a unit's few
    requests cost fractions of a cent, and "$0.05 of $0.05" would hide an overrun)."""
    return f"${amount:,.4f}" if abs(amount) < 1 else f"${amount:,.2f}"
