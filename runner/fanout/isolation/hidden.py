"""What a local sandbox never shows its worker, and how fanout knows it.

A worker sees the system read-only, its own sandbox directory, and nothing of fanout's
or of other jobs: no state directory of any job (journals, logs and collected files of
other units), no fanout configuration, no SSH keys, no secrets file of the service
recipes.  State directories can live anywhere a job file says, so each run records
its own in a registry (``${XDG_STATE_HOME:-~/.local/state}/fanout/state-dirs``, one
absolute path a line) and every later run, of any job, hides all of them.  The registry
is per user: a worker can only read another user's state through permissions that
user chose, and a root worker has no capabilities to override them (``sandbox``).

A state directory is made in one place (``make_state_dir``): private to its user, and
with ignore files that keep git and the tools that walk a tree (ruff, ripgrep, fd)
out of it, so an input command run over the workspace does not list fanout's own
copies of files.  It is told by its contents (``is_state_dir``), not its name.
"""

from __future__ import annotations

import fcntl
import os
import pwd
from collections.abc import Mapping
from pathlib import Path

# systemd's EnvironmentFile conventions for a service named fanout (the recipes of
# docs/guides/scheduling.md use /etc/fanout/secrets.env), and fanout's machine-wide
# configuration directory.
SYSTEM_SECRETS = (Path("/etc/fanout"), Path("/etc/default/fanout"), Path("/etc/sysconfig/fanout"))


def home(environ: Mapping[str, str]) -> Path:
    """``$HOME``, or the user's home from passwd: systemd sets no HOME for a system
    service without ``User=``, which is how the recipes of docs/guides/scheduling.md run."""
    if environ.get("HOME"):
        return Path(environ["HOME"])
    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        return Path("/nonexistent")


# ``*``: nothing in here is source.  git reads ``.gitignore`` (as virtualenv's, pytest's
# and ruff's own cache directories rely on); ripgrep, fd and ruff read it only inside a
# git repository, and ``.ignore`` (the ``ignore`` crate's own file) everywhere: measured
# with ruff 0.17 over a workspace that is not a repository (an unpacked sdist), which
# listed the collected copies with ``.gitignore`` alone and skipped them with ``.ignore``.
_IGNORE_FILES = (".gitignore", ".ignore")
_IGNORE_TEXT = b"# Created by fanout: its state directory (journal, logs, copies of files).\n*\n"


def make_state_dir(state_dir: Path) -> None:
    """Create ``state_dir`` (and its parents) if it is missing: 0700, since it holds the
    journal, worker logs and reports, which other users on the machine must not read,
    and with the ignore files above.  Only at creation, as pytest does for its cache: a
    user who removed them (to commit a journal) keeps it that way.  Raises OSError."""
    try:
        # Without exist_ok: of two runs starting at once, only the one that made it
        # writes the files.
        state_dir.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        return
    for name in _IGNORE_FILES:
        descriptor = os.open(state_dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(descriptor, _IGNORE_TEXT)
        finally:
            os.close(descriptor)


def is_state_dir(directory: Path) -> bool:
    """Whether ``directory`` is a fanout state directory: one holding a journal and a
    locks folder (``launch`` and ``lock`` create both before any unit runs).  Told by
    its contents, not its name: ``runtime.stateDir`` can be anything, and another
    job's state directory in the same workspace must be recognised too."""
    # os.path, not pathlib: a selection asks this of every unit's staged file.
    return os.path.isfile(os.path.join(directory, "journal.sqlite")) and os.path.isdir(
        os.path.join(directory, "locks")
    )


def state_dir_on_the_way(
    root: Path, relative: str, known: dict[str, bool] | None = None
) -> str | None:
    """The folder of ``relative`` (a plain path under ``root``, or ``root`` itself) that
    is a state directory, relative to ``root``; None if no folder on the way is one.
    ``known``: what earlier calls found, by folder (a selection asks of 100,000 paths in
    a few folders: one look at each folder, not one per path)."""
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    for depth in range(1, len(parts) + 1):
        folder = "/".join(parts[:depth])
        found = known.get(folder) if known is not None else None
        if found is None:
            found = is_state_dir(Path(os.path.join(root, folder)))
            if known is not None:
                known[folder] = found
        if found:
            return folder
    return None


def registry(environ: Mapping[str, str]) -> Path:
    """The file listing every state directory fanout has used as this user."""
    state = environ.get("XDG_STATE_HOME") or str(home(environ) / ".local" / "state")
    return Path(state) / "fanout" / "state-dirs"


def remember(state_dir: Path, environ: Mapping[str, str]) -> None:
    """Add ``state_dir`` to the registry, dropping directories that no longer exist (a
    job that still exists adds its own back at its next run).  Runs of other jobs may
    do the same at the same moment: a lock file serialises them, and the registry is
    replaced whole, so a reader never sees half of it.  Raises OSError if the registry
    cannot be written."""
    path = registry(environ)
    line = os.fsencode(state_dir.resolve())
    if b"\n" in line:
        raise OSError(f"a state directory with a newline in its name: {state_dir!r}")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = os.open(path.with_name("state-dirs.lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            lines = path.read_bytes().splitlines()
        except FileNotFoundError:
            lines = []
        kept = [known for known in dict.fromkeys(lines) if os.path.isdir(known)]
        if line not in kept:
            kept.append(line)
        if kept == lines:
            return
        fresh = path.with_name("state-dirs.new")
        descriptor = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(descriptor, b"".join(known + b"\n" for known in kept))
        finally:
            os.close(descriptor)
        os.replace(fresh, path)
    finally:
        os.close(lock)  # releases the lock


def state_dirs(environ: Mapping[str, str]) -> list[Path]:
    """Every state directory in the registry (an unreadable registry is empty)."""
    try:
        lines = registry(environ).read_bytes().splitlines()
    except OSError:
        return []
    return [Path(os.fsdecode(line)) for line in dict.fromkeys(lines) if line.startswith(b"/")]


def paths(environ: Mapping[str, str], state_dir: Path) -> list[Path]:
    """What a sandbox hides for a run whose state directory is ``state_dir``: every
    registered state dir and this one, the registry itself, fanout's configuration
    (``~/.config/fanout``, ``/etc/fanout``) and secrets files, ``~/.ssh``, and systemd's
    credentials directory when fanout runs as a service with ``LoadCredential=``."""
    user = home(environ)
    config = Path(environ.get("XDG_CONFIG_HOME") or user / ".config") / "fanout"
    found = [state_dir, *state_dirs(environ), registry(environ).parent, config, user / ".ssh"]
    found += SYSTEM_SECRETS
    if environ.get("CREDENTIALS_DIRECTORY"):
        found.append(Path(environ["CREDENTIALS_DIRECTORY"]))
    # A symlinked ~/.ssh (or state dir) is hidden where it leads, too: another path to
    # the same files must not show them.
    found += [path.resolve() for path in found]
    return list(dict.fromkeys(found))
