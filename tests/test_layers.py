"""Imports point down the pipeline: every module under runner/fanout sits in one layer of
``LAYERS`` and imports only from its own layer or a lower one.  And the module map of
docs/design.md names exactly the modules in the tree, so neither can drift.

The import graph is read with ``ast`` from the source (relative and absolute imports,
including those inside functions and under ``TYPE_CHECKING``: a local import is still a
dependency, only a later one)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "runner" / "fanout"

# The pipeline, lowest layer first (module names relative to the package: ``spec`` is
# spec/__init__.py, ``spec.build`` spec/build.py, ``__init__`` the package's own).  A
# module may import from its own layer or one below, never from one above.  A new module
# gets a place here (the test fails until it has one).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundations",
        (
            "errors",
            "__init__",
            # Packages whose __init__ only says what the folder owns.
            "values",
            "isolation",
            "backlog",
            "pacing",
            "attempt",
            "transports",
            "run",
            "report",
            "schedule",
        ),
    ),
    (
        "values and text",
        (
            "values.quantities",
            "values.safetext",
            "values.redact",
            "values.globs",
            "values.tomlpos",
            "values.cron",
            "backlog.lint",
            "backlog.child",
            "backlog.feed",
            # Which sandboxes hide the other units; checks, spec and transports read it.
            "isolation.hidden",
            "isolation.exposure",
            "isolation.place",
            "isolation.roots",
            "pacing.slots",
            "pacing.backoff",
            "pacing.signals",
            "events",
            "spec.apis",
            # What task.agent fills in; checks and spec both read it.
            "spec.presets",
        ),
    ),
    ("fates", ("outcome",)),
    (
        "job language",
        (
            "spec.templates.bounds",
            "spec.templates.rendering",
            "spec.templates.analysis",
            "spec.templates",
            "spec.conformance",
            "spec.schema",
        ),
    ),
    (
        "checks",
        (
            "spec.checks.context",
            "spec.checks.leaks",
            "spec.checks.paths",
            "spec.checks.apis",
            "spec.checks.agents",
            "spec.checks.notify",
            "spec.checks.publish",
            "spec.checks",
        ),
    ),
    ("spec", ("spec.model", "spec.build", "spec", "spec.apikeys")),
    # How fast: a limit's ceiling learned from throttles, the rate gate over it.
    ("pacing", ("pacing.ceiling", "pacing.limits")),
    ("selection", ("backlog.command", "backlog.sources", "backlog.units")),
    # What an attempt is, decided on the coordinator, and the pieces every transport uses.
    (
        "attempt",
        (
            "attempt.invocation",
            "attempt.capture",
            "isolation.tools",
            "attempt.collecting",
            "attempt.sandbox",
            "attempt.staging",
            # A tree a unit made, removed whatever it did to it (every transport's).
            "isolation.inodes",
            "isolation.removal",
            # What an agent CLI's attempt came to (read by verdict).
            "agents.jsonlines",
            "agents.taxonomy",
            "agents.usagewindows",
            "agents.providers",
            "agents.claude",
            "agents.codex",
            "agents.gemini",
            "agents.aider",
            "agents.llm",
            "agents.turns",
            "agents.transcript",
            "agents",
            "attempt.model",
            "attempt.verdict",
            "attempt.seam",
            "attempt.driver",
        ),
    ),
    # Transports only move bytes and run steps.
    (
        "transports",
        (
            "isolation.escapees",
            # Builds (once a machine) the one-exec spawner of a local step.
            "isolation.spawner",
            "transports.steps",
            "transports.local",
            "transports.ssh.knownhosts",
            "transports.ssh.failures",
            "transports.ssh.wire",
            # Run by a host's python3 beside each agent, never imported by fanout.
            "transports.ssh.keeper",
            "transports.ssh.connection",
            "transports.ssh.forward",
            "transports.ssh.probe",
            "transports.ssh.hostkey",
            "transports.ssh.agent",
            "transports.ssh.pool",
            "transports.ssh.sandbox",
            "transports.ssh.transport",
            "transports.ssh",
            # The Ray transport: rayapi alone imports ray.
            "transports.ray.facts",
            "transports.ray.node",
            "transports.ray.rayapi",
            "transports.ray.transport",
            "transports.ray",
        ),
    ),
    # The API gateway in the coordinator: pacing per request, keys swapped, usage read.
    (
        "gateway",
        (
            "gateway.windows",
            "gateway.limiter",
            "gateway.styles",
            "gateway.answers",
            "gateway.ratelimits",
            "gateway.books",
            "gateway.usage",
            "gateway.tokens",
            "gateway.forwarding",
            "gateway.complaints",
            "gateway.connections",
            "gateway.admission",
            "gateway.scrub",
            "gateway.proxy",
            # Jobs that call an API with the same key share its limit (a per-user ledger).
            "gateway.shares",
            "gateway",
        ),
    ),
    (
        "bookkeeping",
        (
            "run.ladder",
            "journal.tables",
            "journal.store",
            "journal.runs",
            "journal.attempts",
            "journal.queries",
            "journal.usage",
            "journal.worktime",
            "journal.ceilings",
            "journal.reuse",
            "journal.history",
            # What a job's units took in its earlier runs (the next run's estimate).
            "journal.past",
            # A run's latest stretch read back, for the spans traces exports.
            "journal.stretches",
            "journal.pages",
            "journal",
            "transports.preflight",
        ),
    ),
    ("round", ("run.round",)),
    ("selection of a round", ("run.fingerprints", "run.reusing", "run.selection")),
    ("dispatch", ("run.preparing", "run.spending", "run.dispatch")),
    (
        "report",
        (
            # report.md's size: GitHub's limit, the budget, the guard that cuts.
            "report.budget",
            "report.fleet",
            "report.accounting",
            # The next run's estimate: the model the report and fanout plan share.
            "report.estimate",
            "report.compute",
            # What needs a person (quarantined, failed units), what a run skipped,
            # and a job's runs over time: the report and status read the first two.
            "report.attention",
            "report.failures",
            "report.skipped",
            "report.history",
            "report.status",
            "report.document",
            "report.aggregate",
            # report.html: the run's data, the page under its CSP, the server following it.
            "view.timeline",
            "view.detail",
            "view.data",
            "view.page",
            "view.serve",
            "view",
        ),
    ),
    # Telling someone how a run ended: launch hands the run a Notifier (``Runner.ended``),
    # which reads the run's Summary (``outcome``) and failed units (``journal``).
    ("notify", ("notify.message", "notify.webhook", "notify.command", "notify")),
    # Publishing a run's changes: launch hands the run a Publisher (``Runner.ended``,
    # ``Runner.refuse``), which reads the run's applied files (``journal``) and runs git.
    ("publish", ("publish.process", "publish.git", "publish.changes", "publish")),
    # Spans of a run for an OpenTelemetry collector: launch hands the run a Tracer
    # (``Runner.ended``), which reads the stretch that ended (``journal``); otlp alone
    # imports opentelemetry.
    ("traces", ("traces.otlp", "traces")),
    ("run", ("run.applying", "run.kept", "run.lock", "run.job")),
    # The scheduler knows when to fire, not how a run starts: the CLI hands it
    # ``launch.run_fire`` as a callback, and launch reads the scheduler's ``Fire``.
    ("scheduler", ("schedule.scheduler",)),
    # Where a job's units run picks its transport; launch wires it into the run.
    ("launch", ("run.where", "run.launch")),
    (
        "front ends",
        (
            "plan.apis",
            "plan.document",
            "plan.estimate",
            "plan.nextrun",
            "plan.output",
            "plan",
            "plan.revision",
            "plan.approval",
            "plan.diff",
            "plan.diffview",
            "cli.starter",
            "cli.validating",
            "progress.counts",
            "progress.live",
            "progress",
            "cli.console",
            "cli.app",
            "cli.hosts",
            "cli.jobs",
            "cli.runs",
            "cli.viewing",
            "cli.recurring",
            "cli.scheduling",
            "cli",
            "__main__",
        ),
    ),
)

# Modules another change adds: listed above, not in the tree yet.
COMING: frozenset[str] = frozenset()


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _package_of(name: str, path: Path) -> list[str]:
    """The package a module's relative imports start from (as name parts)."""
    if name == "__init__":
        return []
    parts = name.split(".")
    return parts if path.name == "__init__.py" else parts[:-1]


def _with_packages(target: str) -> list[str]:
    """Importing ``a.b`` runs ``a`` first: a module depends on the packages above its target."""
    parts = target.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts) + 1)]


@functools.cache
def _parsed(path: Path) -> ast.Module:
    """A module's tree, parsed once for the four tests that walk every module."""
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports, anywhere in its source."""
    package = _package_of(name, path)
    found: set[str] = set()
    for node in ast.walk(_parsed(path)):
        bases: list[tuple[list[str], list[str]]] = []  # (module parts, imported names)
        if isinstance(node, ast.ImportFrom):
            module = node.module.split(".") if node.module else []
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                bases.append((base + module, [a.name for a in node.names]))
            elif module[:1] == ["fanout"]:
                bases.append((module[1:], [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "fanout":
                    bases.append((parts[1:], []))
        for parts, names in bases:
            target = ".".join(parts) or "__init__"
            targets = [f"{target}.{n}" if parts else n for n in names]
            for candidate in [t for t in targets if t in known] or [target]:
                found.update(_with_packages(candidate) if candidate != "__init__" else [])
                if candidate == "__init__":
                    found.add("__init__")
    own = set(_with_packages(name)) if name != "__init__" else {"__init__"}
    return {m for m in found if m in known or m == "__init__"} - own


def violations(root: Path = PACKAGE) -> list[str]:
    layer_of = {m: n for n, (_, members) in enumerate(LAYERS) for m in members}
    found = modules(root)
    problems = [
        f"{m}: in no layer of tests/test_layers.py (give it one)"
        for m in sorted(found)
        if m not in layer_of
    ]
    for name, path in found.items():
        if name not in layer_of:
            continue
        for target in sorted(imports(name, path, set(found))):
            if layer_of.get(target, -1) > layer_of[name]:
                problems.append(
                    f"{name} ({LAYERS[layer_of[name]][0]}) imports {target}"
                    f" ({LAYERS[layer_of[target]][0]}), a layer above it"
                )
    return problems


def test_every_layer_member_is_listed_once() -> None:
    members = [m for _, layer in LAYERS for m in layer]
    assert sorted(m for m in set(members) if members.count(m) > 1) == []
    # A name that left the tree (renamed, removed) leaves the list too.
    assert sorted(set(members) - set(modules()) - COMING) == []


def test_no_module_imports_from_a_layer_above_it() -> None:
    assert violations() == []


def package_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Which top-level packages (and top-level modules) each imports from."""
    found = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        top = name.split(".")[0]
        targets = {t.split(".")[0] for t in imports(name, path, set(found))}
        graph.setdefault(top, set()).update(targets - {top, "__init__"})
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more nodes (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_two_modules_import_each_other_even_through_others() -> None:
    found = modules()
    graph = {n: imports(n, p, set(found)) - {n} for n, p in found.items()}
    # A package's __init__ runs before its modules: that is containment, not an arrow.
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    assert circles(graph) == []


def test_the_packages_import_each_other_one_way() -> None:
    assert circles(package_graph()) == []


def test_circles_are_found() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_every_import_form(tmp_path: Path) -> None:
    # A package shaped like fanout, each import form pointing up once.
    root = tmp_path / "fanout"
    (root / "spec").mkdir(parents=True)
    (root / "cli").mkdir()
    for name in ("__init__.py", "spec/__init__.py", "cli/__init__.py"):
        (root / name).write_text("")
    (root / "errors.py").write_text("def f():\n    from .dispatch import Round\n")
    (root / "backlog.py").write_text("from . import dispatch\n")
    (root / "quantities.py").write_text("import fanout.run\n")
    (root / "outcome.py").write_text("from fanout.spec import model\n")
    (root / "spec" / "model.py").write_text("from ..cli import app\n")
    (root / "globs.py").write_text("from .ladder import x\n")
    for name in ("dispatch.py", "run.py", "cli/app.py", "ladder.py"):
        (root / name).write_text("")
    graph = {n: imports(n, p, set(modules(root))) for n, p in modules(root).items()}
    assert graph["errors"] == {"dispatch"}  # local, ``from .x import name``
    assert graph["backlog"] == {"dispatch"}  # ``from . import module``
    assert graph["quantities"] == {"run"}  # absolute ``import fanout.x``
    assert graph["outcome"] == {"spec", "spec.model"}  # a package runs before its module
    assert graph["spec.model"] == {"cli", "cli.app"}  # ``from .. import``
    assert graph["globs"] == {"ladder"}


def _readme_map() -> set[str]:
    """The files docs/design.md's module map names, relative to the package: a row
    labelled ``folder/`` names the files in that folder, its continuation lines too."""
    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    block = re.search(r"\nModule map\b.*?```text\n(.*?)```", design, re.S)
    assert block is not None, "docs/design.md has no module map"
    named: set[str] = set()
    folder = ""
    for line in block.group(1).splitlines():
        text = line
        if line and not line[0].isspace():
            label, _, text = line.partition("  ")
            folder = label if label.endswith("/") else ""
        named.update(folder + name for name in re.findall(r"[\w/]+\.(?:py|sh)\b", text))
    return named


def test_the_module_map_names_exactly_the_modules_in_the_tree() -> None:
    tree = {
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*")
        if p.suffix in (".py", ".sh") and "__pycache__" not in p.parts
    }
    named = _readme_map()
    assert (sorted(tree - named), sorted(named - tree)) == ([], [])
