"""The docs site: the generated pages are what the schema and the app make, the site
builds with ``mkdocs build --strict``, and every fanout command line in the docs is one
the app accepts."""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer.main

from fanout import errors
from fanout.cli import application
from fanout.errors import EXIT_CODES, ExitCode, ExitMeaning
from fanout.spec.schema import job_schema

REPO = Path(__file__).resolve().parents[1]
app = application()
DOCS = REPO / "docs"


def _docgen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docgen", REPO / "scripts" / "docgen.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docgen"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


docgen = _docgen()


# -- the generated pages -------------------------------------------------------------


def test_the_committed_generated_pages_are_current() -> None:
    assert docgen.stale(docgen.pages()) == []


def test_gen_docs_check_exits_0_on_this_tree() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen-docs"), "--check"],
        capture_output=True,
        text=True,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def _mutated_schema() -> dict[str, Any]:
    schema = copy.deepcopy(job_schema())
    task = schema["definitions"]["task"]["properties"]
    task["timeout"]["description"] = "A description nobody regenerated the page for."
    return schema


def test_a_changed_description_makes_the_job_file_page_stale() -> None:
    pages = docgen.pages(schema=_mutated_schema())
    assert "A description nobody regenerated the page for." in pages[docgen.JOB_FILE_PAGE]
    assert docgen.stale(pages) == [docgen.JOB_FILE_PAGE]


def test_check_names_the_stale_page_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A copy of the tree whose committed page predates a description change.
    shutil.copytree(DOCS, tmp_path / "docs")
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 0
    stale_page = docgen.pages(schema=_mutated_schema())[docgen.JOB_FILE_PAGE]
    (tmp_path / docgen.JOB_FILE_PAGE).write_text(stale_page)
    capsys.readouterr()
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 1
    assert capsys.readouterr().out == (
        "docs/reference/job-file.md is stale: run .venv/bin/python scripts/gen-docs and commit it\n"
    )
    # Writing regenerates it.
    assert docgen.main(["--root", str(tmp_path)]) == 0
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 0


def _keys(node: Any, schema: dict[str, Any], path: str, seen: set[int]) -> set[str]:
    """Every key path a job file may write, as the reference page names them."""
    while "$ref" in node:
        node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
    if id(node) in seen:  # a table several keys share (a window) is documented once
        return set()
    seen.add(id(node))
    found: set[str] = set()
    for key, prop in node.get("properties", {}).items():
        here = f"{path}.{key}" if path else key
        found.add(here)
        resolved = prop
        while "$ref" in resolved:
            resolved = schema["definitions"][resolved["$ref"].rsplit("/", 1)[1]]
        inner = [resolved, resolved.get("items", {}), *resolved.get("oneOf", [])]
        values = resolved.get("additionalProperties")
        if isinstance(values, dict) and "$ref" in values:
            inner.append(values)
            here = f"{here}.GLOB"
        for sub in inner:
            if isinstance(sub, dict) and (sub.get("properties") or "$ref" in sub):
                found |= _keys(sub, schema, here, seen)
    return found


def test_the_job_file_page_has_every_key_of_the_schema() -> None:
    schema = job_schema()
    page = (REPO / docgen.JOB_FILE_PAGE).read_text()
    headings = set(re.findall(r"^### `([^`]+)`$", page, re.M))
    keys = _keys(schema, schema, "", set())
    assert len(keys) > 110
    assert sorted(keys - headings) == []


def test_the_cli_page_and_man_page_have_every_command_and_option() -> None:
    root = docgen.command_tree(typer.main.get_command(app))
    page = (REPO / docgen.CLI_PAGE).read_text()
    man = (REPO / docgen.MAN_PAGE).read_text()
    commands = list(docgen._walk(root))
    assert len(commands) == 17  # fanout, 14 commands, hosts check and hosts trust
    for command in commands:
        assert f"`{command.path}`" in page
        for param in command.params:
            assert f"`{param.names}`" in page, (command.path, param.names)
            if command.path != "fanout hosts":
                assert docgen._roff(param.names) in man, (command.path, param.names)


def test_the_exit_codes_page_has_every_code_the_run_help_names() -> None:
    run_epilog = typer.main.get_command(app).get_command(None, "run").epilog  # type: ignore[attr-defined]
    said = set(re.findall(r"\b(\d+) (?:if|for)\b", run_epilog.split("Exit ", 1)[1]))
    said.add(re.search(r"Exit (\d+)", run_epilog).group(1))  # type: ignore[union-attr]
    table = {code for code, _ in docgen.exit_codes((REPO / docgen.EXIT_CODES_PAGE).read_text())}
    assert said == {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "70", "130"}
    assert table == said | {"141"}
    assert table == {str(int(row.code)) for row in EXIT_CODES}
    man = (REPO / docgen.MAN_PAGE).read_text()
    for code in table:
        assert f"\n.B {code}\n" in man


def test_a_code_added_to_the_table_only_makes_the_pages_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    extra = ExitMeaning(code=ExitCode.OK, brief="if so", meaning="a code nobody documented")
    monkeypatch.setattr(errors, "EXIT_CODES", (*EXIT_CODES, extra))
    pages = docgen.pages()
    assert "a code nobody documented" in pages[docgen.EXIT_CODES_PAGE]
    assert docgen.stale(pages) == [docgen.EXIT_CODES_PAGE, docgen.MAN_PAGE]


# -- the site ------------------------------------------------------------------------


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.mark.slow
def test_mkdocs_builds_the_site_strictly(tmp_path: Path) -> None:
    done = _mkdocs(REPO / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    for page in ("index.html", "reference/job-file/index.html", "design/index.html"):
        assert (tmp_path / "site" / page).is_file()


@pytest.mark.slow
def test_a_broken_link_between_pages_fails_the_build(tmp_path: Path) -> None:
    shutil.copy(REPO / "mkdocs.yml", tmp_path)
    shutil.copytree(DOCS, tmp_path / "docs")
    alternatives = tmp_path / "docs" / "alternatives.md"
    text = alternatives.read_text()
    alternatives.write_text(text.replace("(guides/ray.md)", "(guides/rays.md)"))
    done = _mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 1
    assert "guides/rays.md" in done.stderr
    alternatives.write_text(text.replace("(performance.md)", "(performance.md#no-such-part)"))
    done = _mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 1
    assert "no-such-part" in done.stderr


def test_the_readmes_links_resolve() -> None:
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert len(local) >= 10
    for link in local:
        assert (REPO / link).exists(), link


# -- the command lines in the docs ---------------------------------------------------

_FENCE = re.compile(r"```(\w*)[^\n]*\n(.*?)```", re.S)
_SHELL_OPERATORS = {"&&", "||", "|", ";", ">", ">>", "2>&1", "<"}


def _command_lines() -> list[tuple[str, list[str]]]:
    """(page, argv after 'fanout') of every fanout command in a code block of the docs
    and the README: console lines after '$ ', sh lines, and the commands of recipes."""
    found = []
    generated = {DOCS / "reference" / "cli.md"}  # usage lines, checked above
    for page in [REPO / "README.md", *sorted(set(DOCS.rglob("*.md")) - generated)]:
        for lang, body in _FENCE.findall(page.read_text()):
            prompt = {"console": "$ ", "yaml": "run: ", "ini": "ExecStart="}.get(lang, "")
            if lang not in ("sh", "console", "text", "yaml", "ini"):
                continue
            for line in body.splitlines():
                line = re.sub(r"^\s*(- )?", "", line) if lang == "yaml" else line
                if not line.startswith(prompt):
                    continue
                line = line[len(prompt) :]
                try:
                    words = shlex.split(line, comments=True)
                except ValueError:
                    continue
                for start, word in enumerate(words):
                    if word == "fanout" or word.endswith("/fanout"):
                        argv = []
                        for arg in words[start + 1 :]:
                            if arg in _SHELL_OPERATORS:
                                break
                            argv.append(arg)
                        if argv and not argv[0].startswith("http"):
                            found.append((page.relative_to(REPO).as_posix(), argv))
    return found


COMMAND_LINES = _command_lines()


def test_the_docs_show_fanout_commands() -> None:
    assert len(COMMAND_LINES) >= 20


@pytest.mark.parametrize(
    "argv", [a for _, a in COMMAND_LINES], ids=[f"{p}:{' '.join(a)}" for p, a in COMMAND_LINES]
)
def test_each_fanout_command_in_the_docs_is_one_the_app_accepts(argv: list[str]) -> None:
    command: Any = typer.main.get_command(app)
    ctx = command.make_context("fanout", [], resilient_parsing=True)
    words = list(argv)
    while hasattr(command, "list_commands") and words and not words[0].startswith("-"):
        name = words.pop(0)
        sub = command.get_command(ctx, name)
        assert sub is not None, f"no command {name!r} in fanout {' '.join(argv)}"
        command = sub
        ctx = command.make_context(name, [], parent=ctx, resilient_parsing=True)
    assert not hasattr(command, "list_commands"), f"fanout {' '.join(argv)} names no command"
    options = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    options |= {"--help", "-h"}
    for word in words:
        if word.startswith("-") and word != "-":
            assert word.split("=", 1)[0] in options, f"{word} in fanout {' '.join(argv)}"
    # The arguments parse (types aside: the files of an example are not here).
    command.make_context(ctx.info_name, words, parent=ctx.parent, resilient_parsing=True)
