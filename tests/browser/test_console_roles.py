"""The console's Fleet page in a real headless Chromium shows a disaggregated Playground
(examples/disaggregated-sim.yaml, smaller) as one card per role, with a role badge and the
role's replicas, and on the decode card the KV the pair moved."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmplane.testing import Up, wait_for
from tests.browser.conftest import Browser, until
from tests.integration.upcli import condition, http

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama3-8b-pd"


def test_fleet_page_shows_roles(tmp_path: Path, browser: Browser) -> None:
    from selenium.webdriver.common.by import By

    doc = (ROOT / "examples" / "disaggregated-sim.yaml").read_text()
    path = tmp_path / "pd.yaml"
    path.write_text(doc.replace("replicas: 2", "replicas: 1"))  # 1 prefill + 4 decode
    up = Up(tmp_path / "state", str(path)).start()
    try:
        wait_for(
            lambda: (
                condition(up.state_dir, "Playground", MODEL, "Available").get("status") == "True"
            ),
            60,
            what="the disaggregated Playground ready",
        )
        d = browser.driver
        d.get(f"{up.url}/console/#fleet")
        for role, replicas in (("prefill", 1), ("decode", 4)):
            card = f'[data-workload="default/{MODEL}-{role}"]'
            until(
                browser,
                lambda d, card=card, replicas=replicas: (
                    [
                        e.text
                        for e in d.find_elements(By.CSS_SELECTOR, f"{card} [data-testid=replicas]")
                    ]
                    == [f"{replicas}/{replicas} ready"]
                ),
                f"the {role} card with {replicas}/{replicas} ready",
            )
            badge = d.find_element(By.CSS_SELECTOR, f"{card} [data-testid=role]")
            assert badge.text == role
            title = d.find_element(By.CSS_SELECTOR, f"{card} h3").text
            assert title == f"Playground default/{MODEL}"
            rows = d.find_elements(By.CSS_SELECTOR, f"{card} table.replicas tbody tr")
            assert len(rows) == replicas
        # The decode card shows the KV the pair moved: the fleet's count, as the page got it.
        prompt = "Tell me about disaggregated serving " * 20
        code, _, _ = http(
            f"{up.url}/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 2}
        )
        assert code == 200
        moved = wait_for(
            lambda: next(w for w in http(f"{up.url}/console/api/fleet")[2]["workloads"]
                         if w["role"] == "decode")["kvMoved"],
            30,
            what="KV moved on the fleet's decode workload",
        )  # fmt: skip
        decode = f'[data-workload="default/{MODEL}-decode"] [data-testid=kv-moved]'
        until(
            browser,
            lambda d: (
                [e.text for e in d.find_elements(By.CSS_SELECTOR, decode)]
                == [f"KV from prefill: {int(moved):,} tokens"]
            ),
            "the decode card's KV moved",
        )
        prefill = f'[data-workload="default/{MODEL}-prefill"] [data-testid=kv-moved]'
        assert d.find_elements(By.CSS_SELECTOR, prefill) == []
        browser.screenshot("fleet-roles")
        d.get("about:blank")  # the page stops polling before up stops (no failed loads logged)
    finally:
        up.kill_everything()
