"""The job file as frozen, typed values.  Field names mirror the schema's keys in
snake_case (a test holds them together); durations are seconds, sizes are bytes,
templates are compiled."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from .. import cron
from ..templates import Expression, Template, Templates

JobValue = str | int | float | bool
SourceKind = Literal["files", "jsonl", "csv", "json", "items", "command"]
SOURCES: tuple[SourceKind, ...] = ("files", "jsonl", "csv", "json", "items", "command")


@dataclass(frozen=True, kw_only=True, slots=True)
class Inputs:
    files: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    gitignore: bool = True
    jsonl: str | None = None
    csv: str | None = None
    json: str | None = None
    items: tuple[Any, ...] = ()
    command: tuple[Template, ...] = ()
    format: str | None = None
    pointer: str = ""
    ok_exit_codes: tuple[int, ...] = (0, 1)
    timeout: float = 600.0

    @property
    def source(self) -> SourceKind:
        for kind in SOURCES:
            if getattr(self, kind):
                return kind
        raise AssertionError("validated inputs always have a source")


@dataclass(frozen=True, kw_only=True, slots=True)
class Units:
    # Keeps a record when true; evaluated on each record before grouping (see units).
    where: Expression | None = None
    group_by: str | None = None
    id: Template | None = None
    limit: int | None = None
    stage: tuple[Template, ...] = ()
    collect: tuple[Template, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Task:
    prompt: Template | None = None
    command: tuple[Template, ...]
    verify: tuple[Template, ...] = ()
    timeout: float = 600.0
    env: Mapping[str, Template] = field(default_factory=lambda: MappingProxyType({}))
    secrets: tuple[str, ...] = ()
    limits: tuple[str, ...] | None = None
    throttle_patterns: tuple[re.Pattern[str], ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Host:
    name: str
    address: str
    port: int | None = None
    user: str | None = None
    identity: str | None = None
    slots: int = 4
    labels: tuple[str, ...] = ()
    sandbox_root: str = "/tmp"
    max_sessions: int = 10


@dataclass(frozen=True, kw_only=True, slots=True)
class Runtime:
    max_concurrent_tasks: int = 4
    sandbox: Literal["auto", "bwrap", "podman", "none"] = "auto"
    image: str | None = None
    network: bool = False
    hosts: tuple[Host, ...] = ()
    workspace: Path
    state_dir: Path
    log_limit: int = 10 * 2**20
    output_tail: int = 4096
    # Where the hosts came from (a hosts file, or None when inline or absent).
    hosts_file: Path | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Limit:
    name: str
    requests: int
    per: float
    requests_per_task: int = 1
    max_in_flight: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Backoff:
    initial: float = 10.0
    max: float = 600.0
    jitter: Literal["full", "equal", "none"] = "full"


@dataclass(frozen=True, kw_only=True, slots=True)
class Throttle:
    initial: float = 5.0
    max: float = 600.0
    jitter: float = 0.5
    # Caps on one unit's throttled attempts in a row (see ladder): then it is failed.
    max_attempts: int = 10
    max_wait: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Rung:
    name: str
    attempts: int = 1
    vars: Mapping[str, JobValue] = field(default_factory=lambda: MappingProxyType({}))
    timeout: float | None = None
    prompt_suffix: Template | None = None
    command: tuple[Template, ...] | None = None
    env: Mapping[str, Template] = field(default_factory=lambda: MappingProxyType({}))


DEFAULT_LADDER = (Rung(name="default"),)


@dataclass(frozen=True, kw_only=True, slots=True)
class Retry:
    backoff: Backoff = Backoff()
    throttle: Throttle = Throttle()
    ladder: tuple[Rung, ...] = DEFAULT_LADDER


@dataclass(frozen=True, kw_only=True, slots=True)
class Rounds:
    max: int = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Collect:
    apply: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Aggregate:
    command: tuple[Template, ...]
    timeout: float = 600.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Trigger:
    type: Literal["cron"] = "cron"
    name: str
    schedule: cron.CronExpr
    timezone: str = "UTC"
    overlap: Literal["skip", "queue", "replace"] = "skip"
    catch_up: Literal["none", "latest"] = "none"
    starting_deadline: float = 3600.0
    vars: Mapping[str, JobValue] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, kw_only=True, slots=True)
class Spec:
    version: int = 1
    name: str
    description: str = ""
    inputs: Inputs
    units: Units = Units()
    task: Task
    runtime: Runtime
    limits: tuple[Limit, ...] = ()
    retry: Retry = Retry()
    rounds: Rounds = Rounds()
    collect: Collect = Collect()
    aggregate: Aggregate | None = None
    triggers: tuple[Trigger, ...] = ()
    # Not in the job file: where it was read from, and its compiled templates' home.
    file: Path
    templates: Templates

    def task_limits(self) -> tuple[Limit, ...]:
        """The limits a task takes capacity from: those it names, or all of them."""
        if self.task.limits is None:
            return self.limits
        return tuple(limit for limit in self.limits if limit.name in self.task.limits)
