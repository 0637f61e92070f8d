"""The job file as frozen, typed values.  Field names mirror the schema's keys in
snake_case (a test holds them together); durations are seconds, sizes are bytes,
templates are compiled.

Each default is read from the schema (``_default``), where it is written once as a
user would write it; see ``schema`` for why the schema is the source.  A field
defaulting to None or to nothing (``()``) is a key the job file may leave out, with
no value assumed; a test holds these two kinds apart."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

from ..values import cron
from ..values.quantities import parse_duration, parse_size
from ..values.tomlpos import Positions
from . import schema
from .apis import Style
from .templates import Expression, Template, Templates


def _default(table: str, key: str) -> Any:
    """The schema's default for ``key`` of the table at JSON Pointer ``table``, in the
    model's units: chosen by the key's schema definition, as ``build`` converts the
    value a user writes."""
    written = schema.default(table, key)
    kind = schema.property_node(table, key).get("$ref")
    if kind == "#/definitions/duration":
        return parse_duration(written)
    if kind == "#/definitions/size":
        return parse_size(written)
    if isinstance(written, list):
        return tuple(written)
    return written


_INPUTS = "/definitions/inputs"
_UNITS = "/definitions/units"
_TASK = "/definitions/task"
_HOST = "/definitions/host"
_RAY = "/definitions/ray"
_RUNTIME = "/definitions/runtime"
_LIMIT = "/definitions/limit"
_BACKOFF = "/definitions/backoff"
_THROTTLE = "/definitions/retry/properties/throttle"
_RUNG = "/definitions/rung"
_TRIGGER = "/definitions/trigger"
_NOTIFY = "/properties/notify"
_PUBLISH = "/properties/publish"

JobValue = str | int | float | bool
SourceKind = Literal["files", "jsonl", "csv", "json", "items", "command"]
# What a unit with an unchanged fingerprint takes from an earlier run (``units.reuse``).
Reuse: TypeAlias = Literal["succeeded", "none"]
SOURCES: tuple[SourceKind, ...] = ("files", "jsonl", "csv", "json", "items", "command")


@dataclass(frozen=True, kw_only=True, slots=True)
class Inputs:
    files: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    gitignore: bool = _default(_INPUTS, "gitignore")
    jsonl: str | None = None
    csv: str | None = None
    json: str | None = None
    items: tuple[Any, ...] = ()
    command: tuple[Template, ...] = ()
    format: str | None = None
    pointer: str = _default(_INPUTS, "pointer")
    ok_exit_codes: tuple[int, ...] = _default(_INPUTS, "okExitCodes")
    timeout: float = _default(_INPUTS, "timeout")

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
    # Part of every unit's fingerprint (``run.fingerprints``).
    version: str = _default(_UNITS, "version")
    reuse: Reuse = _default(_UNITS, "reuse")  # noqa: RUF009 (a str: ruff sees no Literal)
    # Consecutive runs failing alike that quarantine a unit; 0: never.
    quarantine_after: int = _default(_UNITS, "quarantineAfter")


@dataclass(frozen=True, kw_only=True, slots=True)
class Task:
    # An agent CLI preset (``presets``); None: the command is any program.
    agent: str | None = None
    # Already part of ``command`` (the preset's argv, then these): kept to show the job.
    args: tuple[Template, ...] = ()
    prompt: Template | None = None
    # Resolved: the job's command, else the agent preset's argv and ``args``.
    command: tuple[Template, ...]
    verify: tuple[Template, ...] = ()
    timeout: float = _default(_TASK, "timeout")
    # Bytes one attempt is allocated: what the report bills (x active seconds); None:
    # not declared, the report shows active seconds only.
    memory: int | None = None
    # Resolved: the agent preset's environment, each key the job sets replacing it.
    env: Mapping[str, Template] = field(default_factory=lambda: MappingProxyType({}))
    secrets: tuple[str, ...] = ()
    limits: tuple[str, ...] | None = None
    throttle_patterns: tuple[re.Pattern[str], ...] = ()
    # Most one unit may spend in the run, summed over its attempts and APIs (per unit,
    # not per rung: the unit's money is one account for its whole life in the run).
    budget_usd: float | None = None
    # Not in the job file: what the agent preset filled in, for ``fanout plan``:
    # "command" and the names of the env variables the job did not set itself.
    from_agent: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True, slots=True)
class Host:
    name: str
    address: str
    port: int | None = None
    user: str | None = None
    identity: str | None = None
    slots: int = _default(_HOST, "slots")
    labels: tuple[str, ...] = ()
    sandbox_root: str = _default(_HOST, "sandboxRoot")
    max_sessions: int = _default(_HOST, "maxSessions")


@dataclass(frozen=True, kw_only=True, slots=True)
class Ray:
    """``runtime.ray``: the cluster, and what each running unit holds on its node."""

    address: str = _default(_RAY, "address")
    cpus: float = _default(_RAY, "cpus")
    resources: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    gateway_host: str = _default(_RAY, "gatewayHost")
    sandbox_root: str = _default(_RAY, "sandboxRoot")


@dataclass(frozen=True, kw_only=True, slots=True)
class Runtime:
    max_concurrent_tasks: int = _default(_RUNTIME, "maxConcurrentTasks")
    sandbox: Literal["auto", "bwrap", "podman", "none"] = _default(_RUNTIME, "sandbox")
    # "auto" or an absolute path: where local sandboxes are made (``isolation.roots``).
    sandbox_root: str = _default(_RUNTIME, "sandboxRoot")
    # True: workers may get tokens and secrets in sandboxes that do not hide the other
    # units from them (``exposure``).
    unsandboxed_secrets: bool = _default(_RUNTIME, "unsandboxedSecrets")
    image: str | None = None
    # True: the host's network; "apis": a network namespace of its own in which only the
    # API gateway is reachable (``sandbox``); False: no network at all.
    network: bool | Literal["apis"] = _default(_RUNTIME, "network")
    hosts: tuple[Host, ...] = ()
    ray: Ray | None = None
    # Resolved against the job file and the workspace (``build``), so no default here.
    workspace: Path
    state_dir: Path
    log_limit: int = _default(_RUNTIME, "logLimit")
    output_tail: int = _default(_RUNTIME, "outputTail")
    # Where the hosts came from (a hosts file, or None when inline or absent).
    hosts_file: Path | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Limit:
    name: str
    requests: int
    per: float
    requests_per_task: int = _default(_LIMIT, "requestsPerTask")
    max_in_flight: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Window:
    """At most ``limit`` (requests, or tokens) in any ``per`` seconds."""

    limit: int
    per: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Price:
    """USD per million tokens of one model (or a glob of models).  Cached tokens cost
    the input price unless the job says otherwise: a budget then stops early, never
    late."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Api:
    """An external API the workers call through the coordinator's gateway."""

    name: str
    upstream: str  # scheme://host[:port][/path]; a worker's path is appended
    style: Style
    base_url_env: str  # the worker's variable for the gateway's URL
    token_env: str  # the worker's variable for its per-attempt token
    key_secret: str | None = None  # the coordinator's variable with the real key
    requests: Window | None = None
    input_tokens: Window | None = None
    output_tokens: Window | None = None
    max_in_flight: int | None = None
    # (model glob, price), in file order: the first glob that matches prices a request.
    prices: tuple[tuple[str, Price], ...] = ()
    budget_usd: float | None = None  # per run


@dataclass(frozen=True, kw_only=True, slots=True)
class Backoff:
    initial: float = _default(_BACKOFF, "initial")
    max: float = _default(_BACKOFF, "max")
    jitter: Literal["full", "equal", "none"] = _default(_BACKOFF, "jitter")


@dataclass(frozen=True, kw_only=True, slots=True)
class Throttle:
    initial: float = _default(_THROTTLE, "initial")
    max: float = _default(_THROTTLE, "max")
    jitter: float = _default(_THROTTLE, "jitter")
    learn: bool = _default(_THROTTLE, "learn")
    # Caps on one unit's throttled attempts in a row (see ladder): then it is failed.
    max_attempts: int = _default(_THROTTLE, "maxAttempts")
    max_wait: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Rung:
    name: str
    attempts: int = _default(_RUNG, "attempts")
    vars: Mapping[str, JobValue] = field(default_factory=lambda: MappingProxyType({}))
    timeout: float | None = None
    memory: int | None = None
    prompt_suffix: Template | None = None
    command: tuple[Template, ...] | None = None
    env: Mapping[str, Template] = field(default_factory=lambda: MappingProxyType({}))


DEFAULT_LADDER = tuple(Rung(name=raw["name"]) for raw in _default("/definitions/retry", "ladder"))


@dataclass(frozen=True, kw_only=True, slots=True)
class Retry:
    backoff: Backoff = Backoff()
    throttle: Throttle = Throttle()
    ladder: tuple[Rung, ...] = DEFAULT_LADDER


@dataclass(frozen=True, kw_only=True, slots=True)
class Rounds:
    max: int = _default("/properties/rounds", "max")


@dataclass(frozen=True, kw_only=True, slots=True)
class Collect:
    apply: bool = _default("/properties/collect", "apply")


@dataclass(frozen=True, kw_only=True, slots=True)
class Aggregate:
    command: tuple[Template, ...]
    timeout: float = _default("/properties/aggregate", "timeout")


# What a run does while the job's previous run still goes (trigger.overlap, and
# `fanout run --overlap`); tests/test_schema.py holds it to the schema's enum.
Overlap: TypeAlias = Literal["skip", "queue", "replace"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Trigger:
    type: Literal["cron"]
    name: str
    schedule: cron.CronExpr
    timezone: str = _default(_TRIGGER, "timezone")
    overlap: Overlap = _default(_TRIGGER, "overlap")  # noqa: RUF009 (a str: ruff sees no Literal)
    catch_up: Literal["none", "latest"] = _default(_TRIGGER, "catchUp")
    starting_deadline: float = _default(_TRIGGER, "startingDeadline")
    vars: Mapping[str, JobValue] = field(default_factory=lambda: MappingProxyType({}))


class NotifyEvent(StrEnum):
    """An ending of a run that ``[notify]`` can be told of (``on``); the schema's enum,
    which tests/test_schema.py holds it to, says what each one means."""

    FINISHED = "finished"
    FAILED = "failed"
    PARKED = "parked"
    SPEND = "spend"
    QUARANTINED = "quarantined"


@dataclass(frozen=True, kw_only=True, slots=True)
class Notify:
    """``[notify]``: where a run's ending is told (a webhook, a command, or both)."""

    # A URL written in the job file (no secret), or the coordinator's variable that
    # holds one: at most one of the two (``checks``).
    webhook: str | None = None
    webhook_secret: str | None = None
    command: tuple[Template, ...] = ()
    # The coordinator's variables the command gets (never task.secrets by default).
    secrets: tuple[str, ...] = ()
    on: tuple[NotifyEvent, ...] = tuple(NotifyEvent(e) for e in _default(_NOTIFY, "on"))
    timeout: float = _default(_NOTIFY, "timeout")


class PublishCommits(StrEnum):
    """How ``[publish]`` splits the run's changes into commits (``commits``)."""

    RUN = "run"  # one commit for the run, with ``message``
    UNIT = "unit"  # one per unit that changed files, each with ``unitMessage``


@dataclass(frozen=True, kw_only=True, slots=True)
class Publish:
    """``[publish]``: the run's applied changes committed to a branch, pushed, and a
    pull request opened or updated by a command.  The templates have no model default:
    the schema's are compiled when the job is built."""

    branch: Template
    remote: str = _default(_PUBLISH, "remote")
    # None: the branch checked out when the run ends.
    base: str | None = None
    commits: PublishCommits = PublishCommits(_default(_PUBLISH, "commits"))  # noqa: RUF009 (an enum member: immutable)
    message: Template
    unit_message: Template
    title: Template
    pr: tuple[Template, ...]
    update: tuple[Template, ...]
    timeout: float = _default(_PUBLISH, "timeout")


@dataclass(frozen=True, kw_only=True, slots=True)
class Spec:
    version: int
    name: str
    description: str = _default("", "description")
    inputs: Inputs
    units: Units = Units()
    task: Task
    runtime: Runtime
    limits: tuple[Limit, ...] = ()
    apis: tuple[Api, ...] = ()
    retry: Retry = Retry()
    rounds: Rounds = Rounds()
    collect: Collect = Collect()
    aggregate: Aggregate | None = None
    notify: Notify | None = None
    publish: Publish | None = None
    triggers: tuple[Trigger, ...] = ()
    # Not in the job file: where it was read from, its compiled templates' home, and
    # where each key and value is in the text that was loaded (messages located at run
    # time use these, not the file, which may have changed since).
    file: Path
    templates: Templates
    positions: Positions = field(compare=False, repr=False)

    def task_limits(self) -> tuple[Limit, ...]:
        """The limits a task takes capacity from: those it names, or all of them."""
        if self.task.limits is None:
            return self.limits
        return tuple(limit for limit in self.limits if limit.name in self.task.limits)
