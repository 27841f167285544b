"""The web console in a real headless Chromium against ``llmplane up`` with sim replicas:
chat streams an answer token by token and names the replica that served it, the Fleet page
follows a Playground scaled with ``llmplane apply``, a replica's log opens, Resources shows
the objects as YAML. Screenshots go to the test's temporary directory (``screenshots/``);
with ``LLMPLANE_CONSOLE_SHOTS=DIR`` they are also copied there (the README's image)."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmplane.testing import Up, wait_for
from tests.browser.conftest import Browser, until
from tests.integration.upcli import cli, http, sim_fleet, status

pytestmark = pytest.mark.slow

# ~20 ms a token (the sim's 6.5 ms step x 3): an answer of 48 tokens streams for about a second.
FLEET = sim_fleet("tiny", "REPLICAS", time_scale="3", playground="chat")


def fleet_file(tmp_path: Path, replicas: int) -> str:
    path = tmp_path / f"fleet-{replicas}.yaml"
    path.write_text(FLEET.replace("REPLICAS", str(replicas)))
    return str(path)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    up = Up(tmp_path / "state", fleet_file(tmp_path, 1)).start()
    try:
        wait_for(
            lambda: status(up.state_dir, "Playground", "chat").get("readyReplicas") == 1,
            what="Playground chat ready",
        )
        yield up
    finally:
        up.kill_everything()


def replica_addresses(up: Up) -> set[str]:
    _, _, data = http(f"{up.url}/console/api/fleet")
    return {r["address"] for w in data["workloads"] for r in w["replicas"] if r["address"]}


def test_console_chat_fleet_scale_logs_resources(up: Up, browser: Browser, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    d = browser.driver
    d.get(f"{up.url}/console/#chat")

    # --- chat: the answer arrives piece by piece, with who served it and how fast ---------------
    until(
        browser,
        lambda d: (
            "tiny" in [o.text for o in d.find_elements(By.CSS_SELECTOR, "#chat-model option")]
        ),
        "model tiny in the model list",
    )
    Select(d.find_element(By.ID, "chat-model")).select_by_value("tiny")
    d.find_element(By.ID, "chat-system").send_keys("You answer briefly.")
    max_tokens = d.find_element(By.ID, "chat-max-tokens")
    max_tokens.clear()
    max_tokens.send_keys("48")
    # Record the answer's length at every change of the page while it streams.
    d.execute_script(
        """
        window.__lengths = [];
        new MutationObserver(() => {
          const body = document.querySelector('.msg.assistant .body');
          if (body) window.__lengths.push(body.textContent.length);
        }).observe(document.getElementById('chat-log'),
                   {childList: true, subtree: true, characterData: true});
        """
    )
    d.find_element(By.ID, "chat-text").send_keys("Tell me about llamas.")
    d.find_element(By.ID, "chat-send").click()
    until(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant .meta .tps"),
        "the answer to finish with its tokens/s",
    )
    lengths = [n for n in d.execute_script("return window.__lengths") if n > 0]
    assert len(set(lengths)) >= 5, f"the answer did not stream: lengths seen {lengths}"
    assert lengths == sorted(lengths), lengths
    answer = d.find_element(By.CSS_SELECTOR, ".msg.assistant .body").text
    assert len(answer.split()) >= 10, answer
    meta = d.find_element(By.CSS_SELECTOR, ".msg.assistant .meta").text
    served = d.find_element(By.CSS_SELECTOR, ".msg.assistant .meta .endpoint").text
    assert served.removeprefix("served by ") in replica_addresses(up), (served, meta)
    assert "TTFT" in meta and "tokens/s" in meta and "48 tokens" in meta, meta
    browser.screenshot("chat")

    # --- fleet: 1/1, then 2/2 after llmplane apply scales the Playground ------------------------
    d.get(f"{up.url}/console/#fleet")
    badge = '[data-workload="default/chat"] [data-testid="replicas"]'
    until(
        browser,
        lambda d: [e.text for e in d.find_elements(By.CSS_SELECTOR, badge)] == ["1/1 ready"],
        "chat shown with 1/1 ready",
    )
    cli("apply", "-f", fleet_file(tmp_path, 2), state_dir=up.state_dir)
    until(
        browser,
        lambda d: [e.text for e in d.find_elements(By.CSS_SELECTOR, badge)] == ["2/2 ready"],
        "chat shown with 2/2 ready after scaling",
        timeout=60,
    )
    # ``up`` itself (no terminal: plain lines) said so too.
    wait_for(
        lambda: "playground default/chat: 2/2 replicas ready\n" in up.output(),
        what="up's status line for the scaled Playground",
    )
    # The Fleet page redraws every second: read (and click) inside the page, in one step.
    rows = d.execute_script(
        "return [...document.querySelectorAll("
        "'[data-workload=\"default/chat\"] table.replicas tbody tr')].map(r => r.innerText)"
    )
    assert len(rows) == 2 and all("Ready" in r and "sim" in r for r in rows), rows
    # Some traffic for the charts, then wait for the request-rate chart to draw a line.
    for _ in range(4):
        assert (
            http(
                f"{up.url}/v1/chat/completions",
                {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
            )[0]
            == 200
        )
    until(
        browser,
        lambda d: (
            d.find_elements(By.CSS_SELECTOR, "#chart-rps path.line")
            and d.find_elements(By.CSS_SELECTOR, "#chart-latency path.line")
        ),
        "the request-rate and latency charts",
    )

    # --- a replica's log ------------------------------------------------------------------------
    d.execute_script("document.querySelector('[data-log=\"default/chat#1\"]').click()")
    until(
        browser,
        lambda d: (
            "replica 1" in d.find_element(By.ID, "log-text").text
            and "LISTENING" in d.find_element(By.ID, "log-text").text
        ),
        "replica 1's log in the log panel",
    )
    assert d.find_element(By.ID, "log-title").text == "default/chat replica 1"
    browser.screenshot("fleet")
    # Events stay expanded across the page's redraws.
    d.execute_script(
        "document.querySelector('[data-workload=\"default/chat\"] details.events summary').click()"
    )
    renders = int(d.find_element(By.ID, "fleet-workloads").get_attribute("data-renders"))
    until(
        browser,
        lambda d: (
            int(d.find_element(By.ID, "fleet-workloads").get_attribute("data-renders"))
            >= renders + 2
        ),
        "two redraws of the Fleet page",
    )
    events = d.execute_script(
        "const e = document.querySelector('[data-workload=\"default/chat\"] details.events');"
        "return e && e.open ? e.innerText : null"
    )
    assert events is not None and "PlaygroundReady" in events, events
    d.find_element(By.ID, "log-close").click()
    until(browser, lambda d: not d.find_element(By.ID, "log-panel").is_displayed(), "log closed")
    browser.screenshot("fleet-charts")

    # --- stream migrations: both replicas end streams with vLLM's engine-failure event ----------
    for address in replica_addresses(up):
        assert http(f"http://{address}/admin/faults", {"error_event_after": 5})[0] == 200
    stream_body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 30, "stream": True}  # fmt: skip
    request = urllib.request.Request(
        f"{up.url}/v1/chat/completions",
        data=json.dumps(stream_body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        streamed = resp.read()
    # moved once (engine_error), then lost on the second replica too: nowhere left
    assert b'"stream_lost"' in streamed or b'"error"' in streamed, streamed[-400:]
    table = '[data-testid="migrations"] tbody tr'
    row = until(
        browser,
        lambda d: d.execute_script(
            f"const r = document.querySelector('{table}'); return r && r.innerText"
        ),
        "the stream migrations table",
    )
    cells = row.split("\t")
    assert cells[1:6] == ["0", "0", "1", "0", "1"], cells  # engine_error 1, not continued 1
    assert cells[6].endswith(" ms") and cells[7].endswith(" ms"), cells

    # --- resources: the Playground as YAML with its status --------------------------------------
    d.get(f"{up.url}/console/#resources")
    until(
        browser,
        lambda d: any(
            "default/chat" in s.text for s in d.find_elements(By.CSS_SELECTOR, ".resource summary")
        ),
        "the Playground in Resources",
    )
    summary = next(
        s
        for s in d.find_elements(By.CSS_SELECTOR, ".card")
        if s.find_element(By.TAG_NAME, "h3").text == "Playground"
    ).find_element(By.CSS_SELECTOR, ".resource summary")
    summary.click()
    yaml_text = until(
        browser,
        lambda d: next(
            (p.text for p in d.find_elements(By.CSS_SELECTOR, "pre.yaml") if p.text), None
        ),
        "the Playground's YAML",
    )
    assert "kind: Playground" in yaml_text and "replicas: 2" in yaml_text, yaml_text
    assert "readyReplicas: 2" in yaml_text, yaml_text
    browser.screenshot("resources")

    shots = os.environ.get("LLMPLANE_CONSOLE_SHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        for png in browser.shots.glob("*.png"):
            shutil.copy(png, Path(shots) / f"console-{png.name}")
