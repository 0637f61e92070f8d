"""Finding processes by a marker in their command line (for no-orphan assertions)."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path


def marker() -> str:
    """A unique sleep duration: ``sleep <marker>`` is findable in /proc."""
    return f"{random.randint(1000, 9999)}.{random.randint(100000, 999999)}"


_GONE = (FileNotFoundError, ProcessLookupError, PermissionError)


def _running() -> Iterator[tuple[Path, list[str]]]:
    """Each process that is not a zombie (a zombie runs nothing: a killed orphan stays
    one until init reaps it, and this machine's init reaps late, seconds), with the
    fields of its /proc stat after the command name (state, ppid, pgrp, ...)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except _GONE:
            continue
        if fields[0] != "Z":
            yield entry, fields


def pids_with(text: str) -> list[int]:
    found = []
    for entry, _ in _running():
        if int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except _GONE:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def group_running(group: int) -> bool:
    """Whether a process of the process group ``group`` still runs (not a zombie)."""
    return any(int(fields[2]) == group for _, fields in _running())


def wait_until_gone(text: str, timeout: float = 5.0) -> list[int]:
    """PIDs still running ``text`` after waiting up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (left := pids_with(text)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def wait_until_present(text: str, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while not (found := pids_with(text)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


def short_marker() -> str:
    """A unique sleep of about a second, for processes that should finish on their own."""
    return f"1.{random.randint(100000, 999999)}"


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members
