"""git, the one place fanout runs it: each operation publishing needs, as argv (never a
shell) to a deadline, in the repository that holds the workspace.  Whatever goes wrong
(git missing, a refusal, a timeout) is a GitFailed with one line, mapped here.

Commits are made without touching the user's checkout: a temporary index
(``GIT_INDEX_FILE``) read from the parent commit takes the changed files from the work
tree, ``write-tree`` and ``commit-tree`` make the commit, and ``update-ref`` moves the
branch.  HEAD, the real index and the work tree stay as they were."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..values.safetext import one_line
from .process import SAID_CHARS, CommandFailed, Finished, run

# Variables of the caller's environment git must not see: publishing names the index
# itself, and a credential prompt would wait for a terminal nobody watches.
_UNSET = ("GIT_INDEX_FILE", "GIT_DIR", "GIT_WORK_TREE")
_SET = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", "SSH_ASKPASS": "", "LC_ALL": "C"}


class GitFailed(Exception):
    """A git command that failed: "git push: ! [rejected] ... (fetch first)"."""


def _reason(finished: Finished) -> str:
    """Why git failed, in its own words: a rejected ref ("! [rejected] ... (fetch
    first)"), else its first fatal or error line (what follows is advice)."""
    lines = finished.stderr.decode("utf-8", "replace").splitlines()
    for starts in (("!",), ("fatal:", "error:")):
        for line in lines:
            if line.strip().startswith(starts):
                return one_line(line, SAID_CHARS)
    return finished.said() or f"exited {finished.code}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Repository:
    """The git repository holding the workspace: its top directory, and how git runs."""

    top: Path
    env: Mapping[str, str]
    deadline_s: float

    @classmethod
    async def holding(
        cls, workspace: Path, env: Mapping[str, str], deadline_s: float
    ) -> Repository:
        """The repository ``workspace`` is in.  GitFailed if none."""
        env = {k: v for k, v in env.items() if k not in _UNSET} | _SET
        found = await cls(top=workspace, env=env, deadline_s=deadline_s)._git(
            "rev-parse", "--show-toplevel"
        )
        return cls(top=Path(found.stdout.decode().strip()), env=env, deadline_s=deadline_s)

    async def _git(
        self, *args: str, stdin: bytes = b"", index: Path | None = None, ok: Iterable[int] = (0,)
    ) -> Finished:
        # Literal pathspecs: a file named "*.py" or ":(glob)x" is that file.
        argv = ["git", "--literal-pathspecs", *args]
        env = {**self.env, "GIT_INDEX_FILE": str(index)} if index is not None else self.env
        try:
            finished = await run(
                argv, cwd=self.top, env=env, deadline_s=self.deadline_s, stdin=stdin
            )
        except CommandFailed as exc:
            raise GitFailed(f"git {args[0]}: {exc}") from None
        if finished.code not in ok:
            raise GitFailed(f"git {args[0]}: {_reason(finished)}")
        return finished

    async def checked_out(self) -> str | None:
        """The branch checked out, or None for a detached HEAD."""
        found = await self._git("symbolic-ref", "--quiet", "--short", "HEAD", ok=(0, 1))
        return found.stdout.decode().strip() or None

    async def commit_of(self, revision: str) -> str | None:
        """The commit ``revision`` names, or None if it names none."""
        found = await self._git(
            "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}", ok=(0, 1)
        )
        return found.stdout.decode().strip() or None

    async def changed(self) -> set[str]:
        """Every path (from the top) that differs from HEAD in the index or the work
        tree, untracked files each by name; ignored files are not changes."""
        found = await self._git(
            "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames"
        )
        entries = found.stdout.decode("utf-8", "surrogateescape").split("\0")
        return {entry[3:] for entry in entries if entry}

    async def is_branch_name(self, name: str) -> bool:
        found = await self._git("check-ref-format", "--branch", name, ok=(0, 1, 128))
        return found.code == 0

    async def remote_tip(self, remote: str, branch: str) -> str | None:
        """The commit ``branch`` is at on ``remote``, fetched here; None if it has none."""
        found = await self._git("ls-remote", "--heads", remote, f"refs/heads/{branch}")
        listed = found.stdout.decode().split()
        if not listed:
            return None
        await self._git("fetch", "--quiet", "--no-tags", remote, f"refs/heads/{branch}")
        return listed[0]

    async def is_ancestor(self, older: str, newer: str) -> bool:
        found = await self._git("merge-base", "--is-ancestor", older, newer, ok=(0, 1))
        return found.code == 0

    async def blobs(self, commit: str, paths: Sequence[str]) -> dict[str, str]:
        """The blob of each of ``paths`` in ``commit`` (a path it lacks is left out)."""
        if not paths:
            return {}
        found = await self._git("ls-tree", "-r", "-z", commit, "--", *paths)
        blobs = {}
        for entry in found.stdout.decode("utf-8", "surrogateescape").split("\0"):
            if entry:
                meta, path = entry.split("\t", 1)
                blobs[path] = meta.split()[2]
        return blobs

    async def hashes(self, paths: Sequence[str]) -> dict[str, str]:
        """The blob each of ``paths`` would be committed as (git's filters applied); a
        path that is missing, or whose name holds a newline, is left out."""
        present = [p for p in paths if "\n" not in p and (self.top / p).is_file()]
        if not present:
            return {}
        given = "".join(f"{p}\n" for p in present).encode("utf-8", "surrogateescape")
        found = await self._git("hash-object", "--stdin-paths", stdin=given)
        return dict(zip(present, found.stdout.decode().split(), strict=True))

    async def commits(self, parent: str, groups: Sequence[tuple[Sequence[str], str]]) -> list[str]:
        """One commit per (paths, message) group, each on the last, from ``parent``:
        the paths' contents taken from the work tree.  A group that would change
        nothing makes no commit.  The new commits, oldest first."""
        made: list[str] = []
        with tempfile.TemporaryDirectory(prefix="fanout-publish-") as scratch:
            index = Path(scratch) / "index"
            await self._git("read-tree", parent, index=index)
            tree = await self._tree(parent)
            for paths, message in groups:
                listed = "".join(f"{p}\0" for p in paths).encode("utf-8", "surrogateescape")
                await self._git(
                    "add", "--all", "--pathspec-from-file=-", "--pathspec-file-nul",
                    stdin=listed, index=index,
                )  # fmt: skip
                written = (await self._git("write-tree", index=index)).stdout.decode().strip()
                if written == tree:
                    continue
                on = made[-1] if made else parent
                found = await self._git(
                    "commit-tree", written, "-p", on, "-F", "-", stdin=message.encode()
                )
                made.append(found.stdout.decode().strip())
                tree = written
        return made

    async def _tree(self, commit: str) -> str:
        return (await self._git("rev-parse", f"{commit}^{{tree}}")).stdout.decode().strip()

    async def move_branch(self, branch: str, to: str) -> None:
        """Point the local ``branch`` at ``to`` (fanout's branch: it follows what is
        published, wherever it was)."""
        await self._git("update-ref", "-m", "fanout publish", f"refs/heads/{branch}", to)

    async def push(self, remote: str, branch: str) -> None:
        """Push ``branch`` to ``remote``: a fast-forward, never forced."""
        await self._git("push", "--quiet", remote, f"refs/heads/{branch}:refs/heads/{branch}")
