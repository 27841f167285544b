"""A real headless Chromium driven by selenium through Debian's chromedriver.

The browser gets a fresh profile in the test's temporary directory and no network beyond
127.0.0.1 (no component updates, sync or QUIC). Every test using ``browser`` fails if the page
logged anything at SEVERE level: a console error, an uncaught exception or a failed request.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1440,960",
)


class Browser:
    """The webdriver plus the test's screenshot folder."""

    def __init__(self, driver: object, shots: Path) -> None:
        self.driver = driver
        self.shots = shots

    def screenshot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.driver.save_screenshot(str(path))  # type: ignore[attr-defined]
        return path

    def severe(self) -> list[dict[str, object]]:
        """Browser-log entries at SEVERE level since the last call."""
        entries = self.driver.get_log("browser")  # type: ignore[attr-defined]
        return [e for e in entries if e.get("level") == "SEVERE"]


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for binary in (CHROMIUM, CHROMEDRIVER):
        assert Path(binary).exists(), (
            f"{binary} is missing: apt-get install chromium chromium-driver (.ci/run does)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    wrapper = Browser(driver, shots)
    try:
        yield wrapper
        errors = wrapper.severe()
        assert not errors, f"the console logged errors: {errors}"
    finally:
        driver.quit()
