"""report.html (``fanout view``) in a real headless Chromium, on pages made from real
runs: the summary's counts, the state filter, a claude unit's transcript, the timeline's
lanes and pauses, a page that asks for nothing and violates no policy, and the hostile
golden's names rendered inert.  What the page must offer is the shared contract of
issue 25 (the ids and classes queried here)."""

from __future__ import annotations

import json
import re
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.support.ui import Select
from test_safetext import HOSTILE_JOB, HOSTILE_OUTPUT

from browser import Browser
from helpers import claude_own_key_job, cli, own_key, write_job
from mockapi import MockApi

pytestmark = pytest.mark.slow

# Ids that would run a script if any were written into the page as markup.
INJECTED = (
    "<img src=x onerror=\"document.title='pwned'\">",
    "</script><script>document.title='pwned'</script>",
)
# Units b and d fail with exit 3 (the id is the program's argument, never shell text).
MIXED_IDS = ("a", "b", "c", "d", "e", "f")
MIXED = """
version = 1
name = "mixed"
[inputs]
items = ["a", "b", "c", "d", "e", "f"]
[task]
command = ["sh", "-c", 'echo "unit $1"; case "$1" in b|d) echo "$1 fails" >&2; exit 3;; esac', "sh", "{{ unit.id }}"]
[runtime]
sandbox = "none"
[[retry.ladder]]
name = "only"
attempts = 1
"""


def _view(directory: Path) -> tuple[Path, dict[str, Any]]:
    """``fanout view`` of the one run of the job in ``directory``: report.html's path
    (printed on stdout, beside report.md) and report.json."""
    state = directory / ".fanout"
    (report,) = (state / "runs").glob("*/report.json")
    viewed = cli("view", report.parent.name, "--state-dir", str(state))
    assert viewed.code == 0, viewed.out + viewed.err
    page = Path(viewed.out.strip().splitlines()[-1])
    assert page == report.parent / "report.html"
    return page, json.loads(report.read_text())


def _run(directory: Path, job: str, code: int) -> tuple[Path, dict[str, Any]]:
    path = write_job(directory, job)
    ran = cli("run", str(path))
    assert ran.code == code, ran.out + ran.err
    return _view(directory)


def _events(page: Path, name: str) -> list[dict[str, Any]]:
    lines = (page.parent / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def _rows(browser: Browser) -> list[Any]:
    return browser.find_all("table#units tbody tr")


def _show_unit(browser: Browser, unit: str) -> Any:
    """Go to the unit's page (``#unit=<encodeURIComponent(id)>``) and return its section."""
    browser.driver.execute_script(
        "location.hash = 'unit=' + encodeURIComponent(arguments[0])", unit
    )

    # The app answers the hash change after this returns: wait for this unit's section.
    def shown(driver: Any) -> Any:
        for section in driver.find_elements("css selector", "section#unit"):
            if section.get_attribute("data-unit") == unit and section.is_displayed():
                return section
        return False

    return browser.wait_until(shown)


def _assert_offline_and_clean(browser: Browser, page: Path) -> None:
    assert browser.console_errors() == []
    assert browser.requests() == [page.as_uri()]


@pytest.fixture
def mixed(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    return _run(tmp_path, MIXED, 1)


def test_the_summary_counts_are_report_json_totals(
    browser: Browser, mixed: tuple[Path, dict[str, Any]]
) -> None:
    page, report = mixed
    assert report["totals"] == {"failed": 2, "succeeded": 4}
    browser.open(page)
    browser.wait_for("#summary [data-count]")
    counts = {
        str(e.get_attribute("data-count")): e.text.strip()
        for e in browser.find_all("#summary [data-count]")
    }
    assert {state: counts.get(state) for state in report["totals"]} == {
        state: str(n) for state, n in report["totals"].items()
    }
    assert counts["units"] == str(len(report["units"])) == "6"
    rows = _rows(browser)
    assert sorted(str(r.get_attribute("data-unit")) for r in rows) == list(MIXED_IDS)
    assert {str(r.get_attribute("data-unit")): r.get_attribute("data-state") for r in rows} == {
        u["unit"]: u["state"] for u in report["units"]
    }
    browser.screenshot("summary-and-table")
    _assert_offline_and_clean(browser, page)


def test_filtering_on_failed_leaves_the_failed_rows_displayed(
    browser: Browser, mixed: tuple[Path, dict[str, Any]]
) -> None:
    page, _ = mixed
    browser.open(page)
    choose = Select(browser.wait_for("select#filter-state"))
    choose.select_by_value("failed")
    rows = _rows(browser)
    assert len(rows) == 6
    shown = sorted(str(r.get_attribute("data-unit")) for r in rows if r.is_displayed())
    assert shown == ["b", "d"]
    hidden = [r for r in rows if not r.is_displayed()]
    assert [r.get_attribute("hidden") is not None for r in hidden] == [True] * 4
    choose.select_by_value("")
    assert [r.is_displayed() for r in _rows(browser)] == [True] * 6
    _assert_offline_and_clean(browser, page)


def test_a_units_page_shows_each_attempt_and_asks_for_nothing(
    browser: Browser, mixed: tuple[Path, dict[str, Any]]
) -> None:
    page, _ = mixed
    browser.open(page)
    section = _show_unit(browser, "b")
    (attempt,) = section.find_elements("css selector", ".attempt")
    assert attempt.get_attribute("data-attempt") == "1"
    assert re.search(r"\b3\b", attempt.find_element("css selector", ".exit").text)
    assert "unit b" in attempt.find_element("css selector", ".log").text
    assert "b fails" in attempt.find_element("css selector", ".log").text
    _assert_offline_and_clean(browser, page)


def test_a_claude_units_page_shows_its_tool_call_and_result(
    browser: Browser,
    claude_cli: Path,
    mock_api: MockApi,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The mock's first answer is a Bash tool_use of this command, its second ends the turn.
    command = "echo tool-said-$((6*7))"
    own_key(
        claude_cli,
        mock_api,
        monkeypatch,
        "ANTHROPIC_API_KEY",
        "sk-ant-view-browser-4d1c9e",
        tool=True,
        command=command,
    )
    job = claude_own_key_job(
        tmp_path, mock_api.url, "view-claude", task='args = ["--allowedTools", "Bash"]'
    )
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    page, report = _view(tmp_path)
    assert report["totals"] == {"succeeded": 1}
    browser.open(page)
    section = _show_unit(browser, "one")
    transcript = browser.wait_for("section#unit .attempt .transcript .tool-call")
    assert transcript.find_element("css selector", ".tool-name").text == "Bash"
    assert command in transcript.find_element("css selector", ".tool-input").text
    (result,) = section.find_elements("css selector", ".transcript .tool-result")
    assert "tool-said-42" in result.text
    assert len(section.find_elements("css selector", ".transcript .turn")) >= 2
    # The transcript comes after the log: bring it into the window for the picture.
    browser.driver.execute_script(
        "arguments[0].scrollIntoView()", section.find_element("css selector", ".transcript")
    )
    browser.screenshot("unit-transcript")
    _assert_offline_and_clean(browser, page)


def test_the_timeline_has_a_lane_per_slot_and_marks_the_throttle_pause(
    browser: Browser, tmp_path: Path
) -> None:
    # Every attempt sleeps, and the declared limit lets starts come 0.1 s apart: a, b and
    # c overlap.  Unit f answers its first attempt with exit 75 and Retry-After: 1, a
    # throttle that pauses the limit.  (Without a declared limit slow start lets one
    # start through first, and a throttle then would keep the flight at one: one lane.)
    marker = tmp_path / "throttled-once"
    script = (
        f'if [ "$1" = f ] && [ ! -e {marker} ]; then touch {marker};'
        " echo Retry-After: 1; exit 75; fi; sleep 0.6"
    )
    page, report = _run(
        tmp_path,
        f"""
        version = 1
        name = "lanes"
        [inputs]
        items = ["a", "b", "c", "d", "e", "f"]
        [task]
        command = ["sh", "-c", '{script}', "sh", "{{{{ unit.id }}}}"]
        [runtime]
        sandbox = "none"
        maxConcurrentTasks = 3
        [retry.throttle]
        initial = "1s"
        jitter = 0
        [[limits]]
        name = "api"
        requests = 600
        per = "1m"
        """,
        0,
    )
    assert report["totals"] == {"succeeded": 6}
    assert report["attempts"] == {"succeeded": 6, "throttled": 1}
    paused = _events(page, "limit.paused")
    assert [e["limit"] for e in paused] == ["api"]
    browser.open(page)
    browser.wait_for("svg#timeline g.lane")
    lanes = browser.find_all("svg#timeline g.lane")
    assert len(lanes) == 3
    assert {lane.get_attribute("data-host") for lane in lanes} == {"local"}
    assert len({lane.get_attribute("data-slot") for lane in lanes}) == 3
    outcomes = Counter(
        str(r.get_attribute("data-outcome")) for r in browser.find_all("svg#timeline rect.attempt")
    )
    assert outcomes == report["attempts"]
    pauses = browser.find_all("svg#timeline rect.pause")
    assert [p.get_attribute("data-limit") for p in pauses] == ["api"]
    _assert_offline_and_clean(browser, page)


def _hostile_ids() -> list[str]:
    items: list[str] = tomllib.loads(HOSTILE_JOB)["inputs"]["items"]
    return [*items, *INJECTED]


def test_the_hostile_names_run_no_script(browser: Browser, tmp_path: Path) -> None:
    """The hostile golden's job (tests/test_safetext.py: its name, ids and worker
    output), run for real, with ids that would close the data element or carry an
    event handler: nothing runs, no img is made, and every id reads back as itself."""
    ids = _hostile_ids()
    output = tmp_path / "output.txt"
    output.write_text(HOSTILE_OUTPUT)
    page, report = _run(
        tmp_path,
        f"""
        version = 1
        name = "hostile"
        [inputs]
        items = [{", ".join(json.dumps(i) for i in ids)}]
        [task]
        command = ["sh", "-c", 'cat {output}; [ "$1" = plain ] || exit 1', "sh", "{{{{ unit.id }}}}"]
        [runtime]
        sandbox = "none"
        [[retry.ladder]]
        name = "only"
        attempts = 1
        """,
        1,
    )
    assert sorted(u["unit"] for u in report["units"]) == sorted(ids)
    browser.open(page)
    browser.wait_for("table#units tbody tr")
    assert browser.title() != "pwned"
    assert sorted(str(r.get_attribute("data-unit")) for r in _rows(browser)) == sorted(ids)
    assert browser.find_all("table#units img") == []
    # Shown as the text it is.
    table = browser.find("table#units").text
    assert [i in table for i in INJECTED] == [True, True]
    # The page's own two: the data and the app.
    assert browser.driver.execute_script("return document.scripts.length") == 2
    for unit in ids:
        section = _show_unit(browser, unit)
        assert section.find_elements("css selector", "img") == []
        assert browser.title() != "pwned", unit
    assert browser.driver.execute_script("return document.scripts.length") == 2
    _assert_offline_and_clean(browser, page)
    browser.screenshot("hostile-unit")
