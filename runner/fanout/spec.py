"""The job file as frozen, typed values, and the one function that builds them: ``load``.

``load`` parses the TOML, validates it against the JSON Schema, runs the checks the
schema cannot express (``checks``), and only when everything passes builds the
dataclasses below.  Field names mirror the schema's keys in snake_case (a test holds
them together); durations are seconds, sizes are bytes, templates are compiled.
Below this module nothing sees the raw TOML dictionaries.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from . import checks, cron, schema, tomlpos
from .errors import JobError, Problem
from .quantities import parse_duration, parse_size
from .templates import Template, Templates

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

    @property
    def tasks_per_second(self) -> float:
        return self.requests / self.per / self.requests_per_task


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


def load(path: Path | str, *, hosts_file: Path | None = None, require_hosts: bool = True) -> Spec:
    """Read, validate and freeze the job file at ``path``.

    Raises JobError carrying every problem found.  ``hosts_file`` replaces the job's
    ``runtime.hosts``.  With ``require_hosts=False`` a missing hosts file is not an
    error (``fanout validate`` runs where per-environment inventories are absent).
    """
    path = Path(path)
    shown = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobError(
            [Problem(file=shown, line=1, col=1, key="", message=_os_reason(exc))]
        ) from None
    except UnicodeDecodeError as exc:
        raise JobError(
            [Problem(file=shown, line=1, col=1, key="", message=f"not UTF-8 text ({exc.reason})")]
        ) from None
    document = parse_toml(text, shown)
    positions = tomlpos.scan(text)
    workspace = (path.parent / str(document.get("runtime", {}).get("workspace", "."))).resolve()
    templates = Templates(workspace)
    problems = schema.check(document, schema=schema.job_schema(), file=shown, positions=positions)
    context = checks.Context(file=shown, positions=positions, templates=templates, text=text)
    problems += checks.check_job(document, context)
    if problems:
        raise JobError(problems)
    hosts, found_hosts_file, host_problems = _hosts(document, path, hosts_file, require_hosts)
    if host_problems:
        raise JobError(host_problems)
    return _build(document, path, templates, workspace, hosts, found_hosts_file)


def parse_toml(text: str, shown: str) -> dict[str, Any]:
    """tomllib.loads, with its syntax errors turned into a located Problem."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise JobError([_syntax_problem(str(exc), text, shown)]) from None


def _syntax_problem(message: str, text: str, shown: str) -> Problem:
    match = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if match:
        line, col = int(match.group(1)), int(match.group(2))
        message = message[: match.start()]
    else:
        message = re.sub(r"\s*\(at end of document\)$", "", message)
        line = text.count("\n") + 1
        col = len(text) - (text.rfind("\n") + 1) + 1
    reason = message[:1].lower() + message[1:]
    return Problem(file=shown, line=line, col=col, key="", message=f"invalid TOML: {reason}")


def _os_reason(exc: OSError) -> str:
    return f"cannot read the job file: {exc.strerror or exc}"


def _hosts(
    document: Mapping[str, Any], path: Path, override: Path | None, require: bool
) -> tuple[tuple[Host, ...], Path | None, list[Problem]]:
    raw = document.get("runtime", {}).get("hosts")
    if override is not None:
        raw = str(override.resolve())
    if isinstance(raw, list):
        return tuple(host_from(entry) for entry in raw if isinstance(entry, dict)), None, []
    if not isinstance(raw, str):
        return (), None, []
    hosts_path = path.parent / raw
    if not hosts_path.is_file():
        if not require:
            return (), hosts_path, []
        line, col = tomlpos.scan(path.read_text(encoding="utf-8")).value(("runtime", "hosts"))
        message = f"hosts file {str(hosts_path)!r} does not exist"
        return (
            (),
            hosts_path,
            [Problem(file=str(path), line=line, col=col, key="runtime.hosts", message=message)],
        )
    try:
        return load_hosts_file(hosts_path), hosts_path, []
    except JobError as exc:
        return (), hosts_path, exc.problems


def load_hosts_file(path: Path) -> tuple[Host, ...]:
    """The hosts of a separate hosts file (``[[hosts]]`` tables); JobError if invalid."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        message = f"cannot read the hosts file: {exc.strerror or exc}"
        raise JobError([Problem(file=str(path), line=1, col=1, key="", message=message)]) from None
    document = parse_toml(text, str(path))
    problems = schema.check(
        document,
        schema=schema.subschema("hostsFile"),
        file=str(path),
        positions=tomlpos.scan(text),
    )
    if problems:
        raise JobError(problems)
    return tuple(host_from(entry) for entry in document["hosts"])


def host_from(raw: Mapping[str, Any]) -> Host:
    """A Host from one validated inventory table."""
    values = _snake(raw)
    values.setdefault("name", raw["address"])
    values["labels"] = tuple(raw.get("labels", ()))
    return Host(**values)


def _snake(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {snake_case(key): value for key, value in raw.items()}


def snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def camel_case(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _build(
    doc: Mapping[str, Any],
    path: Path,
    templates: Templates,
    workspace: Path,
    hosts: tuple[Host, ...],
    hosts_file: Path | None,
) -> Spec:
    def tpl(source: str) -> Template:
        return templates.compile(source)

    def argv(values: list[str] | None) -> tuple[Template, ...]:
        return tuple(tpl(v) for v in values or ())

    def env(values: Mapping[str, str] | None) -> Mapping[str, Template]:
        return MappingProxyType({k: tpl(v) for k, v in (values or {}).items()})

    def dur(value: str | None, default: float) -> float:
        return default if value is None else parse_duration(value)

    raw_inputs = doc["inputs"]
    inputs = Inputs(
        files=tuple(raw_inputs.get("files", ())),
        exclude=tuple(raw_inputs.get("exclude", ())),
        gitignore=raw_inputs.get("gitignore", True),
        jsonl=raw_inputs.get("jsonl"),
        csv=raw_inputs.get("csv"),
        json=raw_inputs.get("json"),
        items=tuple(freeze(item) for item in raw_inputs.get("items", ())),
        command=argv(raw_inputs.get("command")),
        format=raw_inputs.get("format"),
        pointer=raw_inputs.get("pointer", ""),
        ok_exit_codes=tuple(raw_inputs.get("okExitCodes", (0, 1))),
        timeout=dur(raw_inputs.get("timeout"), 600.0),
    )
    raw_units = doc.get("units", {})
    units = Units(
        group_by=raw_units.get("groupBy"),
        id=tpl(raw_units["id"]) if "id" in raw_units else None,
        limit=raw_units.get("limit"),
        stage=argv(raw_units.get("stage")),
        collect=argv(raw_units.get("collect")),
    )
    raw_task = doc["task"]
    task = Task(
        prompt=tpl(raw_task["prompt"]) if "prompt" in raw_task else None,
        command=argv(raw_task["command"]),
        verify=argv(raw_task.get("verify")),
        timeout=dur(raw_task.get("timeout"), 600.0),
        env=env(raw_task.get("env")),
        secrets=tuple(raw_task.get("secrets", ())),
        limits=tuple(raw_task["limits"]) if "limits" in raw_task else None,
        throttle_patterns=tuple(re.compile(p) for p in raw_task.get("throttlePatterns", ())),
    )
    raw_runtime = doc.get("runtime", {})
    runtime = Runtime(
        max_concurrent_tasks=raw_runtime.get("maxConcurrentTasks", 4),
        sandbox=raw_runtime.get("sandbox", "auto"),
        image=raw_runtime.get("image"),
        network=raw_runtime.get("network", False),
        hosts=hosts,
        workspace=workspace,
        state_dir=(workspace / raw_runtime.get("stateDir", ".fanout")).resolve(),
        log_limit=parse_size(raw_runtime.get("logLimit", "10MiB")),
        output_tail=parse_size(raw_runtime.get("outputTail", "4KiB")),
        hosts_file=hosts_file,
    )
    limits = tuple(
        Limit(
            name=raw["name"],
            requests=raw["requests"],
            per=parse_duration(raw["per"]),
            requests_per_task=raw.get("requestsPerTask", 1),
            max_in_flight=raw.get("maxInFlight"),
        )
        for raw in doc.get("limits", ())
    )
    raw_retry = doc.get("retry", {})
    raw_backoff = raw_retry.get("backoff", {})
    raw_throttle = raw_retry.get("throttle", {})
    retry = Retry(
        backoff=Backoff(
            initial=dur(raw_backoff.get("initial"), 10.0),
            max=dur(raw_backoff.get("max"), 600.0),
            jitter=raw_backoff.get("jitter", "full"),
        ),
        throttle=Throttle(
            initial=dur(raw_throttle.get("initial"), 5.0),
            max=dur(raw_throttle.get("max"), 600.0),
            jitter=float(raw_throttle.get("jitter", 0.5)),
        ),
        ladder=tuple(
            Rung(
                name=raw["name"],
                attempts=raw.get("attempts", 1),
                vars=MappingProxyType(dict(raw.get("vars", {}))),
                timeout=parse_duration(raw["timeout"]) if "timeout" in raw else None,
                prompt_suffix=tpl(raw["promptSuffix"]) if "promptSuffix" in raw else None,
                command=argv(raw["command"]) if "command" in raw else None,
                env=env(raw.get("env")),
            )
            for raw in raw_retry.get("ladder", ())
        )
        or DEFAULT_LADDER,
    )
    raw_aggregate = doc.get("aggregate")
    aggregate = (
        Aggregate(
            command=argv(raw_aggregate["command"]),
            timeout=dur(raw_aggregate.get("timeout"), 600.0),
        )
        if raw_aggregate
        else None
    )
    triggers = tuple(
        Trigger(
            name=raw.get("name", raw["schedule"]),
            schedule=cron.parse(raw["schedule"], raw.get("timezone", "UTC")),
            timezone=raw.get("timezone", "UTC"),
            overlap=raw.get("overlap", "skip"),
            catch_up=raw.get("catchUp", "none"),
            starting_deadline=dur(raw.get("startingDeadline"), 3600.0),
            vars=MappingProxyType(dict(raw.get("vars", {}))),
        )
        for raw in doc.get("triggers", ())
    )
    return Spec(
        version=doc["version"],
        name=doc["name"],
        description=doc.get("description", ""),
        inputs=inputs,
        units=units,
        task=task,
        runtime=runtime,
        limits=limits,
        retry=retry,
        rounds=Rounds(max=doc.get("rounds", {}).get("max", 1)),
        collect=Collect(apply=doc.get("collect", {}).get("apply", False)),
        aggregate=aggregate,
        triggers=triggers,
        file=path,
        templates=templates,
    )


def freeze(value: Any) -> Any:
    """A deeply read-only copy of a TOML value (tables become mapping proxies)."""
    if isinstance(value, dict):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """A plain, mutable copy of a frozen value, as templates and JSON expect."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def dataclass_fields(cls: type) -> list[str]:
    """Names of a spec dataclass's fields (used by the schema agreement test)."""
    assert is_dataclass(cls)
    return [f.name for f in fields(cls)]
