"""fanout view: report.html of a real run (sandbox none), its data, its policy, and
--serve on 127.0.0.1.  What a browser does with the page is tested with Chromium
elsewhere; these read the page as text."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from fanout.journal import Journal
from fanout.view import data as view_data
from fanout.view import page
from fanout.view.serve import Server
from fanout.view.timeline import lanes

from helpers import cli, run_report, write_job

JOB = """
version = 1
name = "viewed"
[inputs]
items = ["a", "b", "c </script><script>alert(1)</script>", "https://evil.example/x"]
[units]
stage = ["a.txt"]
collect = ["a.txt"]
[runtime]
sandbox = "none"
[task]
command = ["sh", "-c", "echo out; echo changed > a.txt; test \\"$FANOUT_UNIT_ID\\" != b"]
verify = ["true"]
"""


def _run(tmp_path: Path, monkeypatch: Any) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("old\n")
    write_job(tmp_path, JOB)
    assert cli("run", "job.toml").code == 1  # unit b fails
    (run_dir,) = (tmp_path / ".fanout" / "runs").iterdir()
    return run_dir


def _embedded(text: str) -> dict[str, Any]:
    found = re.search(
        r'<script type="application/json" id="fanout-data">(.*?)</script>', text, re.S
    )
    assert found is not None
    return json.loads(found.group(1))  # type: ignore[no-any-return]


def _inline(text: str, tag: str) -> str:
    found = re.search(rf"<{tag}>(.*?)</{tag}>", text, re.S)
    assert found is not None
    return found.group(1)


def _sha(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def test_view_writes_a_page_whose_data_and_policy_match_the_run(
    tmp_path: Path, monkeypatch: Any
) -> None:
    run_dir = _run(tmp_path, monkeypatch)
    (run_dir / "report.html").unlink()  # written by the run; view writes it again
    ran = cli("view")
    assert (ran.code, ran.out) == (
        0,
        f"{Path('.fanout') / 'runs' / run_dir.name / 'report.html'}\n",
    )
    text = (run_dir / "report.html").read_text()
    embedded = _embedded(text)
    report = run_report(tmp_path)
    assert embedded["summary"]["totals"] == report["totals"] == {"failed": 1, "succeeded": 3}
    assert sorted(u[0] for u in embedded["units"]) == sorted(u["unit"] for u in report["units"])
    script, style = _inline(text, "script"), _inline(text, "style")
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', text)
    assert csp is not None
    assert csp.group(1) == (
        f"default-src 'none'; script-src '{_sha(script)}'; style-src '{_sha(style)}';"
        " img-src data:; connect-src 'none'; base-uri 'none'; form-action 'none'"
    )
    assert re.findall(r"https?://", text) == []
    # The hostile id stays inside the data element: one closing tag per script.
    assert text.count("</script>") == 2
    assert text.count("<script") == 2
    b = embedded["details"]["b"]["attempts"][0]
    assert (b["exit"], b["status"], b["log"], b["verify"]) == (1, "failed", "out\n", ["true"])
    assert b["argv"] == ["sh", "-c", 'echo out; echo changed > a.txt; test "$FANOUT_UNIT_ID" != b']
    assert "FANOUT_UNIT_ID" in b["env"]
    assert b["transcript"] == []
    assert embedded["details"]["a"]["diff"]["text"] == (
        "--- workspace/a.txt\n+++ collected/a.txt\n@@ -1 +1 @@\n-old\n+changed\n"
    )


def test_lanes_are_the_fewest_per_host() -> None:
    rows = [
        ["u1", 1, 1, "r", "h1", 0.0, 10.0],
        ["u2", 1, 1, "r", "h1", 1.0, 3.0],
        ["u3", 1, 1, "r", "h2", 1.0, 5.0],
        ["u4", 1, 1, "r", "h1", 3.0, 4.0],
        ["u5", 1, 1, "r", "h1", 3.5, None],
    ]
    assert lanes(rows) == [0, 1, 0, 1, 2]


def test_data_json_cannot_close_its_element() -> None:
    text = view_data.to_json({"id": "</script><!-- https://x"})
    assert text == '{"id":"\\u003c/script>\\u003c!-- https:\\/\\/x"}'
    assert json.loads(text) == {"id": "</script><!-- https://x"}


def test_serve_answers_on_loopback_with_the_policy(tmp_path: Path, monkeypatch: Any) -> None:
    run_dir = _run(tmp_path, monkeypatch)
    journal_path = tmp_path / ".fanout" / "journal.sqlite"

    def load() -> dict[str, Any]:
        journal = Journal(journal_path, read_only=True)
        try:
            return view_data.build(journal, run_dir.name, run_dir)
        finally:
            journal.close()

    server = Server(load, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert server.server_address[0] == "127.0.0.1"
        with urllib.request.urlopen(server.url, timeout=10) as answer:
            header = answer.headers["Content-Security-Policy"]
            body = answer.read().decode()
        assert header == page.policy(connect="'self'")
        assert "connect-src 'self'" in header
        assert f'content="{header}"' in body
        with urllib.request.urlopen(server.url + "data.json", timeout=10) as answer:
            fresh = json.loads(answer.read())
        assert fresh["summary"]["totals"] == {"failed": 1, "succeeded": 3}
        # Another name for the same address (a rebound DNS name) is refused.
        rebound = urllib.request.Request(
            server.url + "data.json", headers={"Host": f"evil.example:{server.server_address[1]}"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(rebound, timeout=10)
        assert refused.value.code == 421
    finally:
        server.shutdown()
        server.server_close()


def test_a_symlink_in_the_workspace_is_not_read_into_the_diff(
    tmp_path: Path, monkeypatch: Any
) -> None:
    run_dir = _run(tmp_path, monkeypatch)
    # After the run, a.txt becomes a link to a file the run never touched.
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("hunter2-do-not-paste\n")
    (tmp_path / "a.txt").unlink()
    (tmp_path / "a.txt").symlink_to(outside / "secret.txt")
    made = cli("view", run_dir.name)
    assert made.code == 0, made.err
    page_text = (run_dir / "report.html").read_text()
    assert "hunter2" not in page_text
    diffs = [d["diff"]["text"] for d in _embedded(page_text)["details"].values()]
    assert any("+changed" in text for text in diffs)  # the collected copy is still shown
