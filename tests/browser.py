"""A real headless Chromium for the browser tier (the ``browser`` fixture, conftest.py).

Selenium drives Debian's Chromium through Debian's chromedriver (``scripts/system-deps``
installs both), named by path so Selenium Manager never looks for, or downloads, a
driver of its own.  The browser cannot reach the network: every host name resolves to
nothing (``--host-resolver-rules``) and its own background traffic is off, so a page
that asks for anything but itself shows in ``requests()`` and fails there instead of
fetching.  What a test checks comes from Chromium's logs: the console (where a Content
Security Policy violation is a SEVERE "Refused to ..." line) and the DevTools network
events of the page.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# Where screenshots go when set (CI keeps them as an artifact); else the test's tmp_path:
# tests never write into the work tree.
SHOTS_VARIABLE = "FANOUT_SCREENSHOTS"
WINDOW = (1280, 900)
T = TypeVar("T")


def require_chromium() -> None:
    """Skip without Chromium and its driver, except under CI, which must run the tier."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if not missing:
        return
    reason = f"{' and '.join(missing)} not installed (scripts/system-deps installs them)"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def options(profile: Path) -> webdriver.ChromeOptions:
    """Headless, offline Chromium with a fresh profile in ``profile`` and both logs on."""
    chosen = webdriver.ChromeOptions()
    chosen.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--disable-gpu",
        # /dev/shm is 64 MB in many containers: a large page's renderer crashes there.
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        # Every host name resolves to nothing, so a request fails at once (an address
        # that does not route would leave it waiting for a connect timeout instead).
        # Loopback IP literals are not names: a served page on 127.0.0.1 still loads.
        "--host-resolver-rules=MAP * ~NOTFOUND",
        # The browser's own traffic (updates, safe browsing, metrics), not the page's.
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--no-first-run",
        "--no-default-browser-check",
        "--metrics-recording-only",
    ):
        chosen.add_argument(flag)
    if os.geteuid() == 0:
        # Chromium refuses to run its sandbox as root.
        chosen.add_argument("--no-sandbox")
    chosen.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return chosen


class Browser:
    """One headless Chromium (``driver``) and what the page did in it.  Chromium hands
    each log entry out once, so the entries read are kept: ``console_errors()`` and
    ``requests()`` answer for everything since the last ``open``."""

    def __init__(self, driver: webdriver.Chrome, shots: Path) -> None:
        self.driver = driver
        self.shots = shots
        self._console: list[dict[str, Any]] = []
        self._network: list[dict[str, Any]] = []

    def open(self, page: Path, fragment: str = "") -> None:
        """Load the file ``page`` (and its ``#fragment``); returns after its load event.
        The logs start again here: what an earlier page did is not this one's."""
        self._log("browser")
        self._log("performance")
        self._console.clear()
        self._network.clear()
        self.driver.get(page.resolve().as_uri() + (f"#{fragment}" if fragment else ""))

    def title(self) -> str:
        return str(self.driver.execute_script("return document.title"))

    def find(self, css: str) -> WebElement:
        return self.driver.find_element("css selector", css)

    def find_all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements("css selector", css)

    def wait_for(self, css: str, timeout: float = 10) -> WebElement:
        """The first element matching ``css``, once there is one (the app builds the
        page after it loads, and again on a hash change)."""

        def first(driver: webdriver.Chrome) -> WebElement | Literal[False]:
            found = driver.find_elements("css selector", css)
            return found[0] if found else False

        return self.wait_until(first, timeout)

    def wait_until(
        self, check: Callable[[webdriver.Chrome], T | Literal[False]], timeout: float = 10
    ) -> T:
        """What ``check`` returns once it is not False, asked again while it is (or
        while the element it looked at was replaced); a timeout fails the test."""
        wait = WebDriverWait(
            self.driver, timeout, ignored_exceptions=(StaleElementReferenceException,)
        )
        return wait.until(check)

    def _log(self, kind: str) -> list[dict[str, Any]]:
        """The entries of Chromium's log ``kind`` not read before (Chromium drops them)."""
        entries: list[dict[str, Any]] = self.driver.get_log(kind)  # type: ignore[no-untyped-call]
        return entries

    def console(self) -> list[dict[str, Any]]:
        """Every console entry so far: ``level``, ``message``, ``source``, ``timestamp``."""
        self._console.extend(self._log("browser"))
        return list(self._console)

    def console_errors(self) -> list[str]:
        """The SEVERE console messages so far: errors thrown, resources refused, and
        Content Security Policy violations ("Executing inline script violates the
        following Content Security Policy directive ..."; before Chromium 150 or so,
        "Refused to execute inline script ...")."""
        return [str(e["message"]) for e in self.console() if e["level"] == "SEVERE"]

    def csp_violations(self) -> list[str]:
        """The console errors that are Content Security Policy violations."""
        return [m for m in self.console_errors() if "Content Security Policy" in m]

    def requests(self) -> list[str]:
        """Every URL the page asked for so far, in order (DevTools'
        ``Network.requestWillBeSent``): its own ``file://`` load, and anything else it
        tried, whether or not the request could go anywhere.  ``data:`` URLs are inline
        bytes, not requests, and are left out."""
        for entry in self._log("performance"):
            self._network.append(json.loads(entry["message"])["message"])
        return [
            str(event["params"]["request"]["url"])
            for event in self._network
            if event["method"] == "Network.requestWillBeSent"
            and not str(event["params"]["request"]["url"]).startswith("data:")
        ]

    def screenshot(self, name: str) -> Path:
        """Save what the window shows as ``<shots>/<name>.png`` and print where."""
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{name}.png"
        if not self.driver.save_screenshot(str(path)):
            raise AssertionError(f"Chromium saved no screenshot at {path}")
        print(f"screenshot: {path}")
        return path


@contextmanager
def started(tmp_path: Path) -> Iterator[Browser]:
    """A ``Browser`` for one test, quit after it; screenshots under ``$FANOUT_SCREENSHOTS``
    when set, else ``tmp_path/screenshots``."""
    require_chromium()
    shots = Path(os.environ.get(SHOTS_VARIABLE) or tmp_path / "screenshots")
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        driver = webdriver.Chrome(
            options=options(Path(profile)), service=Service(str(CHROMEDRIVER))
        )
        try:
            # Chromium starts on its new tab page, whose requests would be logged as the
            # first page's: leave it (get waits for about:blank's load) before any open.
            driver.get("about:blank")
            yield Browser(driver, shots)
        finally:
            driver.quit()
