"""Screenshots of the web console for the README (docs/img/console-*.png).

    python scripts/console_screenshot.py [--seconds 150] [--out docs/img]

Starts ``llmplane up`` with examples/sim-fleet.yaml (four sim replicas) in a temporary state
directory, sends streaming chat traffic whose concurrency rises and falls for ``--seconds`` so
the charts have a shape, asks one question in the Chat page and saves the Chat and Fleet pages
from a headless Chromium (Debian's chromium + chromium-driver, as the browser tests use).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from llmplane.testing.browser import chromium

ROOT = Path(__file__).resolve().parents[1]
MODEL = "llama3-8b-sim"


# One long system prompt shared by every request: the engines' prefix caches hit on it.
SYSTEM = " ".join(f"Rule {i}: answer the question about topic {i} plainly." for i in range(60))


def chat(url: str, prompt: str, tokens: int) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        resp.read()


def load(url: str, seconds: float, stop: threading.Event) -> None:
    """Concurrency 1 -> 12 -> 1 over ``seconds``."""
    start = time.monotonic()
    active: list[threading.Thread] = []

    def worker(i: int) -> None:
        n = 0
        while not stop.is_set():
            elapsed = (time.monotonic() - start) / seconds
            wanted = 1 + int(11 * (1 - abs(2 * elapsed - 1)))
            if i >= wanted:
                time.sleep(0.2)
                continue
            n += 1
            chat(url, f"Question {i}-{n}?", 64 + 16 * (i % 4))

    for i in range(12):
        t = threading.Thread(target=worker, args=(i,), daemon=True)
        t.start()
        active.append(t)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=150)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    with tempfile.TemporaryDirectory() as tmp:
        up = subprocess.Popen(
            [
                *(sys.executable, "-m", "llmplane.cli", "up", "--port", "0", "--state-dir", tmp),
                *("-f", str(ROOT / "examples" / "sim-fleet.yaml")),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            assert up.stdout is not None
            url = ""
            seen = []
            for line in up.stdout:
                seen.append(line)
                if m := re.search(r"OpenAI API at (http://[\d.]+:\d+)/v1", line):
                    url = m.group(1)
                    break
            if not url:
                raise SystemExit("llmplane up did not start:\n" + "".join(seen))
            threading.Thread(target=lambda: [None for _ in up.stdout], daemon=True).start()
            while True:
                with urllib.request.urlopen(f"{url}/console/api/fleet") as resp:
                    fleet = json.loads(resp.read())
                if fleet["workloads"] and fleet["workloads"][0]["ready"] == 4:
                    break
                time.sleep(0.5)
            stop = threading.Event()
            load(url, args.seconds, stop)
            time.sleep(args.seconds * 0.8)

            driver = chromium(Path(tmp) / "profile", height=1000)
            try:
                wait = WebDriverWait(driver, 30)
                driver.get(f"{url}/console/#chat")
                wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#chat-model option"))
                Select(driver.find_element(By.ID, "chat-model")).select_by_value(MODEL)
                driver.find_element(By.ID, "chat-system").send_keys("You are a concise assistant.")
                driver.find_element(By.ID, "chat-text").send_keys("What does a gateway do?")
                driver.find_element(By.ID, "chat-send").click()
                wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg .meta .tps"))
                args.out.mkdir(parents=True, exist_ok=True)
                driver.save_screenshot(str(args.out / "console-chat.png"))
                driver.get(f"{url}/console/#fleet")
                wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#chart-ttft path.line"))
                time.sleep(2)  # a couple of refreshes so every table cell is filled
                height = driver.execute_script(
                    "return Math.ceil(document.querySelector('main').getBoundingClientRect().bottom)"
                )
                driver.execute_cdp_cmd(  # the picture ends where the page does
                    "Emulation.setDeviceMetricsOverride",
                    {"width": 1440, "height": height, "deviceScaleFactor": 1, "mobile": False},
                )
                time.sleep(1.5)  # charts redraw at the new size on the next refresh
                driver.save_screenshot(str(args.out / "console-fleet.png"))
            finally:
                driver.quit()
                stop.set()
        finally:
            up.send_signal(signal.SIGTERM)
            up.wait(60)
    print(f"wrote {args.out / 'console-chat.png'} and {args.out / 'console-fleet.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
