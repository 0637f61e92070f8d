"""A unit's fingerprint (``run.fingerprints``): what changes it, and what does not.  A
change to the job invalidates exactly the units whose result it can change."""

from __future__ import annotations

from pathlib import Path

from fanout import spec
from fanout.backlog.units import Unit, select
from fanout.run.fingerprints import Fingerprints

from helpers import write_job

JOB = """
version = 1
name = "enrich"
[inputs]
items = [{items}]
[units]
stage = ["{stage}"]
{units}
[task]
command = ["enrich", "{{{{ unit.id }}}}"]
prompt = "{prompt}"
[runtime]
sandbox = "none"
{ladder}
"""
PROMPT = "{% if unit.id == 'b' %}VIP {% endif %}Enrich {{ unit.id }}."


def _prints(
    directory: Path,
    *,
    items: str = '"a", "b", "c"',
    prompt: str = PROMPT,
    stage: str = "data/{{ unit.id }}.txt",
    units: str = "",
    ladder: str = "",
    agent_version: str = "",
) -> dict[str, Unit]:
    job = spec.load(
        write_job(
            directory,
            JOB.format(items=items, prompt=prompt, stage=stage, units=units, ladder=ladder),
        )
    )
    prints = Fingerprints(job, trigger=None, agent_version=agent_version)
    return {unit.id: prints.of(unit) for unit in select(job, environ={})}


def _changed(before: dict[str, Unit], after: dict[str, Unit]) -> list[str]:
    """The units of ``after`` whose fingerprint is not the one they had ``before``."""
    return sorted(
        unit
        for unit, printed in after.items()
        if unit not in before or before[unit].fingerprint != printed.fingerprint
    )


def _workspace(directory: Path) -> Path:
    (directory / "data").mkdir()
    for name in "abcd":
        (directory / "data" / f"{name}.txt").write_text(f"{name} data\n")
    return directory


def test_the_same_unit_twice_has_the_same_fingerprint_and_inputs(tmp_path: Path) -> None:
    first = _prints(_workspace(tmp_path))
    again = _prints(tmp_path)
    assert {u: p.fingerprint for u, p in first.items()} == {
        u: p.fingerprint for u, p in again.items()
    }
    assert {u: p.inputs for u, p in first.items()} == {u: p.inputs for u, p in again.items()}
    assert len({p.fingerprint for p in first.values()}) == 3
    assert all(len(p.fingerprint) == 32 for p in first.values())


def test_a_template_change_invalidates_exactly_the_units_whose_rendering_changed(
    tmp_path: Path,
) -> None:
    before = _prints(_workspace(tmp_path))
    # Only b renders the VIP branch: only b's prompt changes.
    after = _prints(tmp_path, prompt=PROMPT.replace("VIP ", "Important "))
    assert _changed(before, after) == ["b"]
    # The inputs of every unit changed (the template did), which is why each is
    # rendered to find out, never matched by its inputs alone.
    assert all(before[u].inputs != after[u].inputs for u in before)


def test_a_staged_file_invalidates_exactly_the_units_that_stage_it(tmp_path: Path) -> None:
    before = _prints(_workspace(tmp_path))
    (tmp_path / "data" / "c.txt").write_text("c data, corrected\n")
    assert _changed(before, _prints(tmp_path)) == ["c"]


def test_a_record_that_moves_in_the_backlog_keeps_its_fingerprint(tmp_path: Path) -> None:
    """Its index changes (it is a template variable), its rendering does not."""
    before = _prints(_workspace(tmp_path))
    after = _prints(tmp_path, items='"d", "a", "b", "c"')
    assert _changed(before, after) == ["d"]
    assert before["a"].inputs != after["a"].inputs  # found by rendering, not by inputs


def test_the_model_the_ladder_the_agent_version_and_units_version_invalidate_every_unit(
    tmp_path: Path,
) -> None:
    before = _prints(_workspace(tmp_path))
    rung = '[[retry.ladder]]\nname = "default"\nvars = {{ model = "{model}" }}\n'
    assert _changed(before, _prints(tmp_path, ladder=rung.format(model="opus"))) == ["a", "b", "c"]
    sonnet = _prints(tmp_path, ladder=rung.format(model="sonnet"))
    assert _changed(sonnet, _prints(tmp_path, ladder=rung.format(model="opus"))) == [
        "a",
        "b",
        "c",
    ]
    assert _changed(before, _prints(tmp_path, agent_version="2.1.198")) == ["a", "b", "c"]
    assert _changed(before, _prints(tmp_path, units='version = "2"')) == ["a", "b", "c"]
    # What reuse and quarantine decide by does not change it.
    assert _changed(before, _prints(tmp_path, units='reuse = "none"')) == []


def test_a_unit_that_cannot_render_or_stage_has_a_fingerprint_of_that(tmp_path: Path) -> None:
    _workspace(tmp_path)
    broken = _prints(tmp_path, prompt="{{ unit.record.missing.deeper }}")
    assert len({u.fingerprint for u in broken.values()}) == 3
    assert broken == _prints(tmp_path, prompt="{{ unit.record.missing.deeper }}")
    (tmp_path / "data" / "a.txt").unlink()
    gone = _prints(tmp_path)
    assert _changed(_prints(tmp_path, stage="data/{{ unit.id }}.txt"), gone) == []
    (tmp_path / "data" / "a.txt").write_text("a data\n")
    assert _changed(gone, _prints(tmp_path)) == ["a"]
