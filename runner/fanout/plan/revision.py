"""A job file as it was at a git revision, for ``fanout plan --base REV``: read with
``git show REV:path`` from the repository that holds the file, never checked out.

Only this module runs git for a plan.  Git is called as argv (a revision is never read
by a shell), with a deadline, and its failures become a ``UsageError`` that says
what to do.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..errors import UsageError

# A revision's job file is a few kilobytes; a repository on a slow disk still answers
# in well under this.
GIT_TIMEOUT_S = 30.0
# What git may print before fanout gives up reading (a job file is refused over 16 MiB).
_MAX_BYTES = 16 * 2**20


def _git(directory: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            ["git", "-C", str(directory), *args],
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except FileNotFoundError:
        raise UsageError(
            "--base reads the job at a git revision, and git is not installed"
        ) from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"git did not answer within {GIT_TIMEOUT_S:g}s in {directory}") from None


def _said(done: subprocess.CompletedProcess[bytes]) -> str:
    """git's last line of complaint."""
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"git exited {done.returncode}"


def at_revision(path: Path, revision: str) -> tuple[str | None, str]:
    """The text of the job file ``path`` at ``revision`` (None: the file did not exist
    there, a job the change adds), and how to name it ("jobs/sweep.toml@HEAD~1")."""
    if revision.startswith("-"):
        # git would read it as an option.
        raise UsageError(f"--base {revision!r} is not a git revision")
    path = path.resolve()
    directory = path.parent
    top = _git(directory, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        raise UsageError(f"--base needs a git repository: {directory} is not in one")
    root = Path(top.stdout.decode().strip())
    relative = path.relative_to(root.resolve()).as_posix()
    shown = f"{relative}@{revision}"
    commit = _git(root, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    if commit.returncode != 0:
        raise UsageError(f"--base {revision!r}: no such revision in {root}")
    sha = commit.stdout.decode().strip()
    exists = _git(root, "cat-file", "-e", f"{sha}:{relative}")
    if exists.returncode != 0:
        return None, shown
    shown_file = _git(root, "show", f"{sha}:{relative}")
    if shown_file.returncode != 0:
        raise UsageError(f"cannot read {shown}: {_said(shown_file)}")
    if len(shown_file.stdout) > _MAX_BYTES:
        raise UsageError(f"{shown} is larger than {_MAX_BYTES // 2**20} MiB")
    try:
        return shown_file.stdout.decode("utf-8").removeprefix("\ufeff"), shown
    except UnicodeDecodeError:
        raise UsageError(f"{shown} is not UTF-8 text") from None
