"""report.html at scale: a finished run of SIZE units (10,000 by default), each with
one attempt on one of 4 hosts of 8 slots, a tenth failed with 4 KiB of output in its
log.  Prints the page's size, the time to build its data and render it, and, where
headless Chromium and selenium are at hand (/usr/bin/chromium, /usr/bin/chromedriver),
the time until the units table shows its rows; otherwise it says it skipped that.

Usage: .venv/bin/python bench/view.py [SIZE ...]
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))


def fill(journal: Any, run_dir: Path, units: int) -> str:
    """A finished run of ``units`` units, one attempt each, a tenth failed with a log."""
    from fanout.attempt.staging import unit_folder_name
    from fanout.backlog.units import Unit
    from fanout.outcome import RunState

    run = journal.create_run(job="scale", job_file="gone.toml", apply=False)
    journal.add_units(
        run, 1, (Unit(id=f"src/m{n:06d}.py", index=n, items=(n,), origin="x") for n in range(units))
    )
    start = time.time() - units / 4
    rows = []
    for n in range(units):
        failed = n % 10 == 0
        begin = start + n / 4
        rows.append(
            (
                run,
                1,
                f"src/m{n:06d}.py",
                1,
                "default",
                f"host{n % 4}",
                begin,
                begin + 1.5,
                "failed" if failed else "succeeded",
                1 if failed else 0,
                "exit 1: group " + str(n % 20) if failed else "ok",
                1.5,
            )
        )
        if failed:
            folder = run_dir / "logs" / unit_folder_name(f"src/m{n:06d}.py")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "r1-a1.log").write_text("output line\n" * 340)
    with journal.db:
        journal.db.execute("BEGIN")
        journal.db.executemany(
            "INSERT INTO attempts (run, round, unit, n, rung, host, started, finished, status,"
            " exit_code, reason, duration) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        journal.db.execute(
            "UPDATE units SET state = CASE WHEN idx % 10 = 0 THEN 'failed' ELSE 'succeeded' END,"
            " reason = CASE WHEN idx % 10 = 0 THEN 'exit 1: group ' || (idx % 20) ELSE 'ok' END,"
            ' attempts = 1, worker_seconds = 1.5, last = \'{"rung": "default"}\' WHERE run = ?',
            (run,),
        )
    journal.finish_run(run, state=RunState.FINISHED, wall=units / 4)
    return str(run)


def browser_seconds(page: Path) -> str:
    """Seconds until headless Chromium shows the units table's rows, or why not."""
    if not (Path("/usr/bin/chromium").exists() and Path("/usr/bin/chromedriver").exists()):
        return "skipped (no chromium)"
    try:  # imported by name: selenium is optional here, and mypy need not know it
        webdriver: Any = importlib.import_module("selenium.webdriver")
        by: Any = importlib.import_module("selenium.webdriver.common.by").By
        wait: Any = importlib.import_module("selenium.webdriver.support.ui").WebDriverWait
    except ImportError:
        return "skipped (no selenium)"
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu"):
        options.add_argument(flag)
    driver = webdriver.Chrome(
        service=webdriver.ChromeService("/usr/bin/chromedriver"), options=options
    )
    try:
        began = time.perf_counter()
        driver.get(page.as_uri())
        wait(driver, 30).until(lambda d: d.find_elements(by.CSS_SELECTOR, "table#units tbody tr"))
        return f"{time.perf_counter() - began:.2f}"
    finally:
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sizes", nargs="*", type=int, default=[10_000])
    options = parser.parse_args()
    from fanout import view
    from fanout.journal import Journal

    print("| units | page MB | build + render s | units table shown in Chromium s |")
    print("| ---: | ---: | ---: | ---: |")
    for size in options.sizes:
        with tempfile.TemporaryDirectory() as folder:
            state = Path(folder) / ".fanout"
            journal = Journal(state / "journal.sqlite")
            run_dir = state / "runs" / "bench"
            run = fill(journal, run_dir, size)
            run_dir = state / "runs" / run
            (state / "runs" / "bench").rename(run_dir)
            began = time.perf_counter()
            path = view.write(journal, run, run_dir)
            built = time.perf_counter() - began
            shown = browser_seconds(path)
            print(f"| {size:,} | {path.stat().st_size / 1e6:.1f} | {built:.2f} | {shown} |")
            journal.close()


if __name__ == "__main__":
    main()
