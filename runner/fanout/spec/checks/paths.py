"""Stage and collect paths that can never work, said before a run rather than by every
unit's attempts: ``validate`` checks the literal ones, ``plan`` the first unit's rendered
ones.  The rules are the glob compiler's (``staging`` and ``collecting`` refuse the same
paths at run time); what this adds is the way out, above all ``| relpath`` for linters'
absolute paths."""

from __future__ import annotations

import re
from pathlib import Path

from ...values import globs

# ``{{ expr }}`` and nothing else: the hint can then show the same template with the
# filter applied.
_ONE_EXPRESSION = re.compile(r"\{\{-?\s*(?P<expr>(?:(?!\}\}).)+?)\s*-?\}\}", re.DOTALL)
_WHERE = {
    "stage": "stage paths are relative to the workspace",
    "collect": "collect paths are relative to the unit's sandbox, laid out as the workspace",
}


def refusal(kind: str, path: str, source: str, workspace: Path) -> str | None:
    """Why ``path`` (rendered from ``source``, the job file's text) cannot be a ``kind``
    path ("stage" or "collect"), with what to write instead; None if it can."""
    try:
        globs.compile_glob(path)
    except ValueError as exc:
        if not path.startswith("/"):
            return str(exc)
    else:
        return None
    inside = _inside(Path(path), workspace)
    where = f"{path!r} is absolute; {_WHERE[kind]}"
    if inside is None:
        # Not even ``| relpath`` can help: only workspace files travel.
        return f"{path!r} is absolute and outside the workspace; {_WHERE[kind]}"
    single = _ONE_EXPRESSION.fullmatch(source.strip())
    if single is not None:
        return f'{where}: write "{{{{ {single["expr"]} | relpath }}}}"'
    if "{{" in source or "{%" in source:
        return f'{where}: apply the relpath filter, e.g. "{{{{ unit.record.path | relpath }}}}"'
    return f"{where}: write {inside!r}"


def _inside(path: Path, workspace: Path) -> str | None:
    """``path`` relative to the workspace, or None when it is outside it."""
    for base in (workspace, workspace.resolve()):
        try:
            return path.relative_to(base).as_posix() or "."
        except ValueError:
            continue
    try:
        return path.resolve().relative_to(workspace.resolve()).as_posix() or "."
    except (OSError, ValueError):
        return None
