"""The agent's keeper (``agent.sh``): a python3 process beside the agent on hosts that
have one, which makes and removes the agent's sandbox directories, so that a unit costs
the host no ``mkdir`` and no ``rm`` process (each a fork and an exec: about 1 ms of the
host's CPU, a sixth of a no-op unit's).

This file is sent as it is and run by the host's python3 (``-I -S``: no site, no
PYTHON* variables; the standard library of Python 3.6 and later only).  It talks to the
agent on two FIFOs the agent made (stdin, stdout), unlinks them at once, and reads one
request a line, each answered ``ok`` or ``no``:

    mk TOKEN DIR...     make ROOT/fanout-TOKEN and its DIRs, mode 700 (never one there)
    rm TOKEN            remove ROOT/fanout-TOKEN, never through a symlink

``no`` leaves the work to the agent's own ``mkdir`` and ``rm`` (and what follows them
for a tree a worker made hard to remove: ``agent.sh``'s ``remove``), which then do what
they did before there was a keeper, so a keeper that fails, or dies, costs only time.
It exits at EOF: when the agent has exited.
"""

import os
import shutil
import sys
from typing import BinaryIO

# Annotations are strings: the host's python3 may be older than subscripted builtins.


def serve(root: str, requests: BinaryIO, answers: BinaryIO) -> None:
    for line in requests:
        words = line.decode("utf-8", "surrogateescape").split()
        try:
            done = handle(root, words)
        except Exception:  # any failure: the agent does it itself
            done = False
        answers.write(b"ok\n" if done else b"no\n")
        answers.flush()


def handle(root: str, words: "list[str]") -> bool:
    if len(words) < 2 or not words[1].isalnum():
        return False
    base = os.path.join(root, "fanout-" + words[1])
    if words[0] == "mk":
        names = words[2:]
        if any(name in ("", ".", "..") or "/" in name for name in names):
            return False
        os.mkdir(base, 0o700)
        try:
            for name in names:
                os.mkdir(os.path.join(base, name), 0o700)
        except OSError:
            os.rmdir(base)  # what it made, so that the agent's mkdir finds the path free
            raise
        return True
    if words[0] == "rm" and len(words) == 2:
        # rmtree never follows a symlink (it refuses one as the tree), and it works by
        # descriptors where the platform allows.  A folder the worker shut, a flag, a
        # tree deeper than the recursion limit: an exception, and the agent's turn.
        shutil.rmtree(base)
        return not os.path.lexists(base)
    return False


def main() -> None:
    root, fifos = sys.argv[1], sys.argv[2:]
    for fifo in fifos:
        os.unlink(fifo)
    os.chdir("/")
    serve(root, sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
