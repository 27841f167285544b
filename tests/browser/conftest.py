"""A real headless Chromium driven by selenium through Debian's chromedriver.

The browser gets a fresh profile in the test's temporary directory and no network beyond
127.0.0.1 (no component updates, sync or QUIC). Every test using ``browser`` fails if the page
logged anything at SEVERE level: a console error, an uncaught exception or a failed request.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmplane.testing.browser import chromium


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


def until(browser: Browser, predicate: Any, what: str, timeout: float = 30) -> Any:
    """Wait on a condition in the page; a timeout fails naming it (and saves a screenshot)."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        # An element the page redrew between finding and reading it: look again.
        return WebDriverWait(
            browser.driver,
            timeout,
            poll_frequency=0.1,
            ignored_exceptions=(StaleElementReferenceException,),
        ).until(lambda d: predicate(d))
    except TimeoutException:
        shot = browser.screenshot("timeout")
        raise AssertionError(f"timed out waiting for {what} (screenshot {shot})") from None


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    driver = chromium(tmp_path / "chromium-profile", log=tmp_path / "chromedriver.log")
    shots = tmp_path / "screenshots"
    shots.mkdir()
    wrapper = Browser(driver, shots)
    try:
        yield wrapper
        errors = wrapper.severe()
        assert not errors, f"the console logged errors: {errors}"
    finally:
        driver.quit()
