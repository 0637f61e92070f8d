"""The browser tier's harness (tests/browser.py) on pages made here, independent of any
page fanout writes: each check the viewer's tests rely on can fail."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from browser import Browser

# Chromium's start alone takes 3-4 s here.
pytestmark = pytest.mark.slow

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _digest(script: str) -> str:
    return base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()


def _page(directory: Path, name: str, *, script: str, allowed: str, body: str = "") -> Path:
    """A page whose policy allows only the inline script whose text is ``allowed``."""
    digest = _digest(allowed)
    page = directory / name
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'>"
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\';'
        f" script-src 'sha256-{digest}'; img-src data:\">"
        f"<title>before</title></head><body>{body}<script>{script}</script></body></html>",
        encoding="utf-8",
    )
    return page


def test_a_hashed_script_runs_and_an_unhashed_one_is_refused(
    browser: Browser, tmp_path: Path
) -> None:
    script = "document.title = 'ran'"
    browser.open(_page(tmp_path, "allowed.html", script=script, allowed=script))
    assert browser.title() == "ran"
    assert browser.console_errors() == []
    refused = _page(tmp_path, "refused.html", script=script, allowed="other()")
    browser.open(refused)
    assert browser.title() == "before"
    (error,) = browser.console_errors()
    assert browser.csp_violations() == [error]
    # Chromium 156's words; older ones said "Refused to execute inline script because it
    # violates ...".  The message names the page, the policy and the script's own hash.
    assert error.startswith(f"{refused.as_uri()} 0 Executing inline script violates the")
    assert f"directive 'script-src 'sha256-{_digest('other()')}''" in error
    assert f"a hash ('sha256-{_digest(script)}')" in error


def test_a_request_for_anything_but_the_page_shows(browser: Browser, tmp_path: Path) -> None:
    # No policy to stop it: the img is requested (and fails: no name resolves).
    page = tmp_path / "img.html"
    page.write_text('<html><body><img src="http://example.invalid/x.png"></body></html>')
    browser.open(page)
    assert browser.requests() == [page.as_uri(), "http://example.invalid/x.png"]
    # Kept: the entries are still there when asked again.
    assert browser.requests() == [page.as_uri(), "http://example.invalid/x.png"]


def test_a_screenshot_is_a_png_file(browser: Browser, tmp_path: Path) -> None:
    script = "document.body.append('hello')"
    browser.open(_page(tmp_path, "shot.html", script=script, allowed=script))
    shot = browser.screenshot("harness")
    assert shot.parent == browser.shots
    assert shot.read_bytes()[:8] == PNG_SIGNATURE
