"""A headless Chromium for the console's browser tests and screenshots: Debian's ``chromium``
driven through its ``chromium-driver`` by selenium (no browser download, no network beyond
127.0.0.1: no component updates, sync, QUIC or background requests), a fresh profile each time,
and the browser's console log kept for the caller to check."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

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
)


def chromium(profile: Path, width: int = 1440, height: int = 960, log: Path | None = None) -> Any:
    """A started selenium Chrome driver on a fresh ``profile`` directory (``quit()`` it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for binary in (CHROMIUM, CHROMEDRIVER):
        if not Path(binary).exists():
            raise FileNotFoundError(
                f"{binary} is missing: apt-get install chromium chromium-driver (.ci/run does)"
            )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--window-size={width},{height}", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, log_output=str(log) if log else None)
    return webdriver.Chrome(options=options, service=service)
