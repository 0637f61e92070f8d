"""Publishing a run's changes (``[publish]``): the ``Publisher`` that refuses a work tree
with changes the run would not have made (``refuse``, before the run is recorded) and,
once the run has ended (``Runner.ended``), commits the files it applied to a branch,
pushes it and opens or updates the pull request.

Decisions, and why:

- Only a finished run publishes (one that stopped, parked or was interrupted is
  continued later, and publishes then).  It publishes whatever its units applied, even
  if some units failed: the report, the pull request's body, says which.
- The checkout is left as it is: commits are made on a temporary index (``git``), so
  HEAD, the index and the work tree keep the applied files.  The next run counts a
  change the publish branch holds already as published, not as someone's own work.
- A re-run adds its commits on top of the branch, found on the remote (fetched) or
  locally (a push that failed), so the push fast-forwards; a new branch starts from
  HEAD.  Nothing is rebased or forced.
- The pull request exists when the branch was on the remote before this push and no
  ``pr`` of it is pending: then ``update`` runs, else ``pr``.  A ``pr`` is pending
  from just before it runs until it succeeds (a file in the state directory,
  ``publish/<digest of remote and branch>.pr-pending``), so a ``pr`` that failed
  after its push (a token without the scope, a forge that was down) runs again next
  time instead of an ``update`` of a pull request nobody opened.  No forge API is
  asked: the commands are the user's.
- Nothing changed (the run applied nothing, or the branch holds it all, pushed): no
  commit, no push, no command.
- Any failure is one ``publish.failed`` (or ``publish.refused``) event, which the
  console shows, and ``publish.json`` beside the report; never the run's exit code:
  the run's results (journal, report, applied files) stand, and a re-run retries.
- Secrets: the templates see no secret; every rendered message and argument, and the
  command's output, is still redacted of task.secrets and the [[apis]] keys; and the
  body (report.md, redacted as it was written) is checked to hold none.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..backlog.units import base_context
from ..errors import EnvironmentProblem
from ..events import Events
from ..journal import Journal
from ..outcome import RunState, Summary
from ..spec import PublishCommits, Spec
from ..spec.templates import RenderError, Template, render_off_loop
from ..values.redact import redact_bytes, redact_text
from . import changes
from .git import GitFailed, Repository
from .process import CommandFailed, run

__all__ = ["Published", "Publisher"]


class Published(StrEnum):
    """What publishing a run came to: the event's name is ``publish.<value>``."""

    PUBLISHED = "published"  # pushed, and the pr or update command succeeded
    SKIPPED = "skipped"  # nothing changed, or the run did not finish
    REFUSED = "refused"  # changes the run did not make (named)
    FAILED = "failed"  # git, the push or the command failed


class _Stop(Exception):
    """Publishing ends here with ``outcome`` and ``reason``."""

    def __init__(self, outcome: Published, reason: str, **facts: Any) -> None:
        super().__init__(reason)
        self.outcome, self.reason, self.facts = outcome, reason, facts


class Publisher:
    """``spec.publish`` for one run.  ``environ``: what git and the commands run with
    (the coordinator's, less keys and secrets); ``redacted``: every secret value."""

    def __init__(
        self,
        spec: Spec,
        *,
        environ: Mapping[str, str],
        redacted: Sequence[str],
        journal: Journal,
        events: Events,
    ) -> None:
        assert spec.publish is not None
        self.spec = spec
        self.publish = spec.publish
        self.environ = environ
        self.redacted = tuple(redacted)
        self.journal = journal
        self.events = events

    async def _repository(self) -> Repository:
        workspace = self.spec.runtime.workspace
        return await Repository.holding(workspace, self.environ, self.publish.timeout)

    async def _render(self, template: Template, context: Mapping[str, Any]) -> str:
        rendered = await render_off_loop(lambda: template.render(context))
        return redact_text(rendered, self.redacted)

    async def _published_already(self, repo: Repository, branch: str, paths: set[str]) -> set[str]:
        """Of ``paths``, those whose work-tree content the local publish branch holds."""
        tip = await repo.commit_of(f"refs/heads/{branch}")
        if tip is None or not paths:
            return set()
        listed = sorted(paths)
        held, now = await repo.blobs(tip, listed), await repo.hashes(listed)
        return {p for p in listed if held.get(p) == now.get(p)}

    async def refuse(self, trigger: Mapping[str, Any] | None) -> None:
        """Before the run is recorded: EnvironmentProblem if the workspace is in no git
        repository, or its work tree has changes that are neither the job's unfinished
        run's (which this run may continue) nor published already."""
        try:
            repo = await self._repository()
            changed = await repo.changed()
            prefix = changes.prefix_of(self.spec.runtime.workspace, repo.top)
            unfinished = self.journal.last_unfinished(self.spec.name)
            if unfinished is not None:
                changed -= {f.path for f in changes.applied(self.journal, unfinished.id, prefix)}
            branch = await self._render(self.publish.branch, base_context(self.spec, trigger))
            foreign = changed - await self._published_already(repo, branch, changed)
        except (GitFailed, RenderError) as exc:
            raise EnvironmentProblem(f"publish: {exc}") from None
        if foreign:
            raise EnvironmentProblem(
                f"publish: the work tree has changes fanout did not make:"
                f" {changes.foreign_text(foreign)}; commit or stash them, so that what is"
                " published is the run's alone"
            )

    async def __call__(self, summary: Summary) -> None:
        """Publish what ``summary``'s run applied.  Raises only CancelledError."""
        try:
            facts = await self._publish(summary)
            outcome, reason = Published.PUBLISHED, ""
        except _Stop as stop:
            outcome, reason, facts = stop.outcome, stop.reason, stop.facts
        except (GitFailed, CommandFailed, RenderError) as exc:
            outcome, reason, facts = Published.FAILED, str(exc), {}
        except Exception as exc:  # a bug here must not cost the run its result
            outcome, reason = Published.FAILED, f"fanout internal error: {type(exc).__name__}"
            facts = {}
        said = {"reason": redact_text(reason, self.redacted)} if reason else {}
        self.events.emit(f"publish.{outcome}", **said, **facts)
        record = {"outcome": str(outcome), **said, **facts}
        # The event said it; a full disk was told by the report already.
        with contextlib.suppress(OSError):
            (summary.report_dir / "publish.json").write_text(json.dumps(record, indent=2) + "\n")

    async def _publish(self, summary: Summary) -> dict[str, Any]:
        if summary.state is not RunState.FINISHED:
            raise _Stop(
                Published.SKIPPED, f"the run {summary.state}: it publishes once it finishes"
            )
        repo = await self._repository()
        prefix = changes.prefix_of(self.spec.runtime.workspace, repo.top)
        applied = changes.applied(self.journal, summary.run_id, prefix)
        changed = await repo.changed()
        ours = {f.path for f in applied}
        context = base_context(self.spec, summary.trigger)
        branch = await self._render(self.publish.branch, context)
        if not await repo.is_branch_name(branch):
            raise _Stop(Published.FAILED, f"publish.branch renders {branch!r}: not a branch name")
        foreign = changed - ours
        foreign -= await self._published_already(repo, branch, foreign)
        if foreign:
            raise _Stop(
                Published.REFUSED,
                f"the work tree has changes the run did not make: {changes.foreign_text(foreign)}",
                files=sorted(foreign),
            )
        files = [f for f in applied if f.path in changed]
        if not files:
            raise _Stop(Published.SKIPPED, "nothing changed: no commit, no push, no pull request")
        base = self.publish.base or await repo.checked_out()
        if base is None:
            raise _Stop(Published.FAILED, "HEAD is detached: set publish.base")
        if base == branch or branch == await repo.checked_out():
            raise _Stop(
                Published.FAILED,
                f"{branch!r} is checked out or is the base: publish.branch must be a branch"
                " of its own",
            )
        remote = self.publish.remote
        remote_tip = await repo.remote_tip(remote, branch)
        local_tip = await repo.commit_of(f"refs/heads/{branch}")
        parent = await self._parent(repo, remote_tip, local_tip)
        run = {
            "id": summary.run_id,
            "units": len({f.unit for f in files}),
            "files": len(files),
            "counts": dict(summary.counts),
        }
        made = await repo.commits(parent, await self._groups(files, context | {"run": run}))
        tip = made[-1] if made else parent
        if tip == remote_tip:
            raise _Stop(Published.SKIPPED, f"nothing changed: {branch} on {remote} holds it all")
        await repo.move_branch(branch, tip)
        await repo.push(remote, branch)
        facts = {"branch": branch, "remote": remote, "commits": len(made), "files": len(files)}
        pending = self._pending(remote, branch)
        exists = remote_tip is not None and not pending.exists()
        await self._pull_request(repo, summary, context | {"run": run}, facts, base, exists)
        return facts

    def _pending(self, remote: str, branch: str) -> Path:
        """The file that says a ``pr`` of ``branch`` on ``remote`` has not succeeded."""
        name = hashlib.sha256(f"{remote}\n{branch}".encode()).hexdigest()[:32]
        return self.spec.runtime.state_dir / "publish" / f"{name}.pr-pending"

    async def _parent(self, repo: Repository, remote_tip: str | None, local_tip: str | None) -> str:
        """What the new commits go on: the branch as pushed, or ahead of it locally
        (a push that failed), else the commit checked out."""
        if local_tip is not None and (
            remote_tip is None or await repo.is_ancestor(remote_tip, local_tip)
        ):
            return local_tip
        if remote_tip is not None:
            return remote_tip
        head = await repo.commit_of("HEAD")
        if head is None:
            raise _Stop(Published.FAILED, "the repository has no commit yet to publish on")
        return head

    async def _groups(
        self, files: Sequence[changes.Applied], context: Mapping[str, Any]
    ) -> list[tuple[list[str], str]]:
        if self.publish.commits is PublishCommits.RUN:
            return [([f.path for f in files], await self._render(self.publish.message, context))]
        groups = []
        for unit, paths in changes.by_unit(files):
            given = {**context, "unit": {"id": unit, "files": paths}}
            groups.append((paths, await self._render(self.publish.unit_message, given)))
        return groups

    async def _pull_request(
        self,
        repo: Repository,
        summary: Summary,
        context: dict[str, Any],
        facts: dict[str, Any],
        base: str,
        exists: bool,
    ) -> None:
        """Run ``update`` if the pull request exists (its branch was pushed before),
        else ``pr``; the body is the run's report.md."""
        body = summary.report_dir / "report.md"
        text = body.read_bytes()
        if redact_bytes(text, self.redacted) != text:
            raise _Stop(
                Published.FAILED, "report.md holds a secret value: no pull request", **facts
            )
        facts["pr"] = "updated" if exists else "opened"
        context |= {"branch": facts["branch"], "base": base}
        title = await self._render(self.publish.title, context)
        context |= {"remote": facts["remote"], "title": title, "body_file": str(body)}
        command = self.publish.update if exists else self.publish.pr
        argv = [await self._render(part, context) for part in command]
        pending = self._pending(facts["remote"], facts["branch"])
        if not exists:
            pending.parent.mkdir(parents=True, exist_ok=True)
            pending.write_text(f"{facts['remote']} {facts['branch']}\n")
        finished = await run(argv, cwd=repo.top, env=self.environ, deadline_s=self.publish.timeout)
        if finished.code == 0 and not exists:
            pending.unlink(missing_ok=True)
        output = redact_bytes(finished.stdout + finished.stderr, self.redacted)
        (summary.report_dir / "publish.out").write_bytes(output)
        if finished.code != 0:
            said = finished.said()
            key = "publish.update" if exists else "publish.pr"
            raise _Stop(
                Published.FAILED,
                f"{key} {argv[0]} exited {finished.code}" + (f": {said}" if said else ""),
                **facts,
            )
