"""A unit's fingerprint: what decides its result, hashed, so that a recurring job runs
only the units whose inputs changed (``units.reuse``), never runs again in a later round
a unit that failed unchanged, and quarantines one that fails alike run after run.

It covers:

- the unit's id and records;
- the contents of the files its first attempt stages (each file's sha256, by path);
- its first attempt on the first rung, rendered: prompt, command, environment, verify,
  stage and collect paths (as round 1 renders them, with no last attempt: the same in
  every round, so a later round compares alike);
- the job's part, hashed once a run (``JobPart``): the retry ladder as written (each
  rung's name, attempts, timeout, memory, vars, command, environment and prompt
  suffix), the task's timeout, memory and budget, the sandbox, network and image, the
  agent preset and its CLI's version (``--version``, read once a run on this machine;
  "" where it cannot be read), and ``units.version``.

So a changed prompt template invalidates exactly the units whose rendered prompt
changed, and a changed staged file exactly the units that stage it.  It does not cover
the time, the run or the trigger, unless a template renders them, nor what a worker
reaches outside its sandbox (a service it calls): ``units.version`` is for that.

Computing it renders the first attempt and hashes staged files: blocking work, done in
the selection's worker thread, each staged file hashed once a run (by size and
modification time), so a tree that every unit stages is read once; an unchanged unit is
found by what its fingerprint is made of, without rendering it (``Fingerprints``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import __version__
from ..attempt import invocation, staging
from ..attempt.collecting import PathRefused
from ..backlog.units import Unit
from ..journal import Successes
from ..spec import Spec, presets
from ..spec.templates import RenderError

# A fingerprint's hex digits: 128 bits, as unlikely to collide as a run's id is not.
DIGITS = 32
# How long an agent CLI's ``--version`` may take.
VERSION_TIMEOUT_S = 10.0
# Keys sorted; a value JSON cannot hold, said as text.  Built once: ``json.dumps`` with
# options builds an encoder a call, a third of a unit's inputs digest.
_ENCODE = json.JSONEncoder(sort_keys=True, ensure_ascii=False, default=str).encode


def digest(value: Any) -> str:
    """The fingerprint of a JSON value (keys sorted; a value JSON cannot hold, said as
    text)."""
    text = _ENCODE(value)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:DIGITS]


def job_part(spec: Spec, agent_version: str) -> dict[str, Any]:
    """What every unit's fingerprint shares: the job's settings that decide a result
    (see the module docstring)."""

    def sources(templates: Any) -> Any:
        if templates is None:
            return None
        if isinstance(templates, Mapping):
            return {name: t.source for name, t in sorted(templates.items())}
        return [t.source for t in templates]

    task, runtime = spec.task, spec.runtime
    return {
        "version": spec.units.version,
        "agent": task.agent,
        "agentVersion": agent_version,
        "ladder": [
            {
                "name": rung.name,
                "attempts": rung.attempts,
                "timeout": rung.timeout,
                "memory": rung.memory,
                "vars": dict(rung.vars),
                "command": sources(rung.command),
                "env": sources(rung.env),
                "promptSuffix": rung.prompt_suffix.source if rung.prompt_suffix else None,
            }
            for rung in spec.retry.ladder
        ],
        "task": {"timeout": task.timeout, "memory": task.memory, "budget": task.budget_usd},
        "runtime": {
            "sandbox": runtime.sandbox,
            "network": runtime.network,
            "image": runtime.image,
        },
    }


def agent_version(spec: Spec, environ: Mapping[str, str]) -> str:
    """The first line ``<agent CLI> --version`` prints on this machine, "" when the task
    names no preset or the CLI cannot say (not installed here, only on the hosts)."""
    if spec.task.agent is None:
        return ""
    program = presets.PRESETS[spec.task.agent].argv[0]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            [program, "--version"],
            capture_output=True,
            timeout=VERSION_TIMEOUT_S,
            env={"PATH": environ.get("PATH", os.defpath), "HOME": environ.get("HOME", "/")},
            stdin=subprocess.DEVNULL,
            check=False,
        )
        if done.returncode == 0:
            lines = done.stdout.decode(errors="replace").strip().splitlines()
            return lines[0][:200] if lines else ""
    return ""


class Fingerprints:
    """The fingerprints of one run's units (blocking: see the module docstring).

    Rendering is most of a fingerprint's cost (35 µs of 45 on a short prompt), so a unit
    also has ``inputs``: the digest of all its fingerprint is made of before rendering
    (the job's part, its templates as written, fanout's version, the unit's template
    variables, the trigger, and the files it stages).  The journal keeps both with each
    success: a unit whose inputs match one is that success's fingerprint, found without
    rendering it (a run of 100,000 unchanged units renders none); only a unit whose
    inputs changed is rendered, and then matched by what it renders, so a change that
    renders alike (a record moved in the file) still matches."""

    def __init__(
        self, spec: Spec, *, trigger: Mapping[str, Any] | None, agent_version: str
    ) -> None:
        self._spec = spec
        self._trigger = trigger
        self._job = digest(job_part(spec, agent_version))
        self._templates = digest(_template_sources(spec, trigger))
        self._prefix = hashlib.sha256(f"{self._job}\n{self._templates}\n".encode())
        # Each staged file's sha256, by path, with the size and modification time it
        # had: hashed once a run however many units stage it.
        self._files: dict[Path, tuple[int, int, str]] = {}

    def inputs(self, unit: Unit) -> Unit:
        """``unit`` with its inputs (only ``units.stage`` is rendered, for the paths)."""
        return unit.printed(inputs=self.inputs_of(unit))

    def inputs_of(self, unit: Unit) -> str:
        """The digest of what ``unit``'s fingerprint is made of, before rendering."""
        paths = invocation.stage_paths(self._spec, unit, trigger=self._trigger)
        # What its ``unit`` variable holds (its record is its first item), not the
        # dict: a third of the digest's time.
        parts = [unit.id, unit.index, unit.group, unit.items, self._staged(paths)]
        text = _ENCODE(parts)
        hashed = self._prefix.copy()  # the job's part and its templates, hashed once
        hashed.update(text.encode("utf-8", "surrogatepass"))
        return hashed.hexdigest()[:DIGITS]

    def found(self, unit: Unit, known: Successes) -> Unit:
        """``unit`` with its inputs and fingerprint: the fingerprint of the success
        ``known`` keeps for its inputs (``Journal.all_successes``), else rendered."""
        inputs = self.inputs_of(unit)
        fingerprint = known.fingerprint_of(inputs)
        if fingerprint is None:
            return self.of(unit.printed(inputs=inputs))
        return unit.printed(fingerprint=fingerprint, inputs=inputs)

    def of(self, unit: Unit) -> Unit:
        """``unit`` with its fingerprint (and its inputs), rendering its first attempt."""
        if not unit.inputs:
            unit = self.inputs(unit)
        parts: dict[str, Any] = {"job": self._job, "id": unit.id, "items": list(unit.items)}
        try:
            task = invocation.render(self._spec, unit, trigger=self._trigger)
        except RenderError as exc:  # it fails without a worker: that is its result
            parts["renderError"] = str(exc)
        else:
            parts["attempt"] = {
                "prompt": task.prompt,
                "argv": list(task.argv),
                "env": dict(task.env),
                "verify": list(task.verify),
                "stage": list(task.stage),
                "collect": list(task.collect),
            }
            parts["staged"] = self._staged(task.stage)
        return unit.printed(fingerprint=digest(parts))

    def _staged(self, paths: Sequence[str]) -> Any:
        """The files ``paths`` stage, each with its sha256; or why they cannot be."""
        if not paths:
            return {}
        try:
            staged = staging.stage(self._spec.runtime.workspace, paths)
        except PathRefused as exc:
            return {"stageError": str(exc)}
        return {item.path: self._file(item.source) for item in staged}

    def _file(self, path: Path) -> str:
        try:
            stat = path.stat()
        except OSError as exc:
            return f"unreadable: {exc.strerror or exc}"
        known = self._files.get(path)
        if known is not None and known[:2] == (stat.st_size, stat.st_mtime_ns):
            return known[2]
        try:
            sha = staging.sha256_file(path) if path.is_file() else "not a file"
        except OSError as exc:
            sha = f"unreadable: {exc.strerror or exc}"
        self._files[path] = (stat.st_size, stat.st_mtime_ns, sha)
        return sha


def _template_sources(spec: Spec, trigger: Mapping[str, Any] | None) -> dict[str, Any]:
    """Everything a unit's first attempt renders from but the unit itself: the templates
    as written, the variables of the job, its first rung and the trigger, where the job
    and its workspace are (``relpath``), and fanout's version (its filters)."""
    task, units, rung = spec.task, spec.units, spec.retry.ladder[0]
    return {
        "fanout": __version__,
        "prompt": task.prompt.source if task.prompt else None,
        "command": [t.source for t in task.command],
        "env": {name: t.source for name, t in sorted(task.env.items())},
        "verify": [t.source for t in task.verify],
        "stage": [t.source for t in units.stage],
        "collect": [t.source for t in units.collect],
        "rung": invocation.rung_context(rung, 0, spec),
        "rungCommand": [t.source for t in rung.command] if rung.command else None,
        "rungEnv": {name: t.source for name, t in sorted(rung.env.items())},
        "promptSuffix": rung.prompt_suffix.source if rung.prompt_suffix else None,
        "job": {"name": spec.name, "description": spec.description, "file": str(spec.file)},
        "workspace": str(spec.runtime.workspace),
        "trigger": dict(trigger) if trigger else None,
    }
