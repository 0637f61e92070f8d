"""What a template's syntax tree says it reads, checked before any unit runs: the
variables it uses, the attribute chains rooted at them (past the guards ``| default``
and ``is defined``), and which of them the shapes of the template's context lack."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from jinja2 import meta, nodes

from ...errors import did_you_mean

# What each template variable offers; None means "any attribute" (record fields).
Shape = Mapping[str, "Shape | None"] | None

UNIT_SHAPE: dict[str, Shape] = {
    "id": None,
    "index": None,
    "group": None,
    "items": None,
    "record": None,
}
LAST_SHAPE: dict[str, Shape] = {
    "status": None,
    "reason": None,
    "exitCode": None,
    "outputTail": None,
    "rung": None,
    "attempt": None,
}
JOB_SHAPE: dict[str, Shape] = {"name": None, "description": None, "file": None}
TRIGGER_SHAPE: dict[str, Shape] = {"name": None, "schedule": None, "vars": None, "time": None}


class TemplateProblem(Exception):
    """A template that does not compile or refers to something that will not exist."""

    def __init__(self, message: str, lineno: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.lineno = lineno


@dataclass(frozen=True, slots=True)
class Analysis:
    undeclared: frozenset[str]
    lines: dict[str, int]
    local_names: frozenset[str]
    chains: tuple[tuple[tuple[str, ...], int], ...]


def analyse(tree: nodes.Template) -> Analysis:
    """What ``problems`` needs of a template's syntax tree."""
    undeclared = frozenset(meta.find_undeclared_variables(tree))
    return Analysis(
        undeclared=undeclared,
        lines={name: _line_of(tree, name) for name in undeclared},
        local_names=frozenset(
            n.name for n in tree.find_all(nodes.Name) if n.ctx in ("store", "param")
        ),
        chains=tuple(_chains(tree)),
    )


def problems(
    analysis: Analysis, shapes: Mapping[str, Shape], globals_: Iterable[str]
) -> list[TemplateProblem]:
    """Every variable or attribute chain in ``analysis`` that neither ``shapes`` nor the
    environment's globals provide."""
    found: list[TemplateProblem] = []
    known = set(shapes) | set(globals_)
    for name in sorted(analysis.undeclared - known):
        guess = did_you_mean(name, list(shapes))
        hint = f" (did you mean {guess!r}?)" if guess else f"; available: {', '.join(shapes)}"
        found.append(TemplateProblem(f"undefined variable {name!r}{hint}", analysis.lines[name]))
    for chain, lineno in analysis.chains:
        if chain[0] in analysis.local_names or chain[0] not in shapes:
            continue
        problem = _check_chain(chain, shapes)
        if problem:
            found.append(TemplateProblem(problem, lineno))
    return found


def _check_chain(chain: tuple[str, ...], shapes: Mapping[str, Shape]) -> str | None:
    shape: Shape = shapes[chain[0]]
    for depth, attribute in enumerate(chain[1:], start=1):
        if shape is None:
            return None
        if attribute not in shape:
            owner = ".".join(chain[:depth])
            guess = did_you_mean(attribute, list(shape))
            hint = f" (did you mean {guess!r}?)" if guess else f"; it has: {', '.join(shape)}"
            return f"{owner!r} has no attribute {attribute!r}{hint}"
        shape = shape[attribute]
    return None


def _chains(tree: nodes.Node) -> list[tuple[tuple[str, ...], int]]:
    found: list[tuple[tuple[str, ...], int]] = []

    def walk(node: nodes.Node) -> None:
        if _guarded(node):
            # `x | default(...)` and `x is defined` may name what does not exist.
            for child in node.iter_child_nodes(exclude=("node",)):
                walk(child)
            return
        if isinstance(node, nodes.Getattr | nodes.Getitem):
            parts: list[str] = []
            current: nodes.Node = node
            while True:
                if isinstance(current, nodes.Getattr):
                    parts.insert(0, current.attr)
                    current = current.node
                elif isinstance(current, nodes.Getitem) and isinstance(current.arg, nodes.Const):
                    parts.insert(0, str(current.arg.value))
                    current = current.node
                else:
                    break
            if isinstance(current, nodes.Name) and current.ctx == "load":
                found.append(((current.name, *parts), node.lineno))
            elif current is node:
                # ``x[1:]`` or ``x[i]``: the chain ends here; ``x`` may still be a chain.
                walk(node.node)
            else:
                walk(current)
            if isinstance(node, nodes.Getitem) and not isinstance(node.arg, nodes.Const):
                walk(node.arg)
            return
        for child in node.iter_child_nodes():
            walk(child)

    walk(tree)
    return found


def _guarded(node: nodes.Node) -> bool:
    if isinstance(node, nodes.Filter):
        return node.name in ("default", "d")
    if isinstance(node, nodes.Test):
        return node.name in ("defined", "undefined")
    return False


def _line_of(tree: nodes.Node, name: str) -> int:
    for node in tree.find_all(nodes.Name):
        if node.name == name:
            return int(node.lineno)
    return 1
