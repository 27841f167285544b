"""The console once keys are on: ``llmplane up`` with sim replicas, an admin key
(``gateway.adminKeyHash``) and a Tenant with an API key. The page first asks for a key, a wrong
one gets a clear message, the admin key shows the Fleet page, and chat streams with the
tenant's key. The ``browser`` fixture fails the test on any browser console error, so the
401 path must not reach the browser's network log either."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmplane.testing import Up, wait_for
from tests.browser.conftest import Browser, until
from tests.integration.upcli import cli, http, sim_fleet, status

pytestmark = pytest.mark.slow

TENANT = """
apiVersion: llmplane.io/v1alpha1
kind: Tenant
metadata: {name: team-a}
spec:
  models: ["tiny"]
"""


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[tuple[Up, str, str]]:
    """``up`` with an admin key configured and a Tenant holding one key: (up, admin, tenant key)."""
    lines = cli("keys", "admin", state_dir=None).stdout.splitlines()
    config = tmp_path / "gateway.yaml"
    config.write_text("\n".join(lines[3:]) + "\n")
    yield from _up_with_tenant(tmp_path, lines[1], ["--gateway-config", str(config)])


@pytest.fixture
def tenant_only(tmp_path: Path) -> Iterator[tuple[Up, str, str]]:
    """The same without an admin key: (up, "", tenant key)."""
    yield from _up_with_tenant(tmp_path, "", [])


def _up_with_tenant(tmp_path: Path, admin: str, args: list[str]) -> Iterator[tuple[Up, str, str]]:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(sim_fleet("tiny", 1, time_scale="3", playground="chat"))
    up = Up(tmp_path / "state", str(fleet), args=args).start()
    try:
        wait_for(
            lambda: status(up.state_dir, "Playground", "chat").get("readyReplicas") == 1,
            what="Playground chat ready",
        )
        tenant = tmp_path / "tenant.yaml"
        tenant.write_text(TENANT)
        cli("apply", "-f", str(tenant), state_dir=up.state_dir)
        made = cli("keys", "create", "team-a", "--name", "console", state_dir=up.state_dir)
        key = made.stdout.strip().splitlines()[-1]
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        bearer = {"Authorization": f"Bearer {key}"}
        wait_for(
            lambda: http(f"{up.url}/v1/chat/completions", body, bearer)[0] == 200,
            30,
            what="the gateway serving the new tenant key",
        )
        yield up, admin, key
    finally:
        up.kill_everything()


def enter_key(browser: Browser, key: str) -> None:
    from selenium.webdriver.common.by import By

    d = browser.driver
    until(browser, lambda d: d.find_element(By.ID, "key-panel").is_displayed(), "the key prompt")
    d.find_element(By.ID, "key-input").send_keys(key)
    d.find_element(By.ID, "key-save").click()


def ask_tiny(d: object) -> None:
    """Send a chat message to model ``tiny``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(d.find_element(By.ID, "chat-model")).select_by_value("tiny")  # type: ignore[attr-defined]
    d.find_element(By.ID, "chat-text").send_keys("Tell me about llamas.")  # type: ignore[attr-defined]
    d.find_element(By.ID, "chat-send").click()  # type: ignore[attr-defined]


def prompt_refuses(browser: Browser, up: Up, asks: str, refusal: str, key: str) -> None:
    """Open the Fleet page: the prompt (saying ``asks``) comes first, ``key`` gets ``refusal``
    and the prompt stays, with no fleet shown."""
    from selenium.webdriver.common.by import By

    d = browser.driver
    d.get(f"{up.url}/console/#fleet")
    until(browser, lambda d: d.find_element(By.ID, "key-panel").is_displayed(), "the key prompt")
    assert asks in d.find_element(By.ID, "key-kind").text
    enter_key(browser, key)
    until(browser, lambda d: refusal in d.find_element(By.ID, "key-error").text, "the refusal")
    assert d.find_element(By.ID, "key-panel").is_displayed()
    assert not d.find_elements(By.CSS_SELECTOR, "[data-workload]")


def test_console_asks_for_keys(keyed: tuple[Up, str, str], browser: Browser) -> None:
    from selenium.webdriver.common.by import By

    up, admin, tenant_key = keyed
    d = browser.driver
    # --- the prompt, a wrong key, then the admin key shows the fleet --------------------------
    prompt_refuses(browser, up, "admin key", "not the admin key", "llmp-wrong-key")
    browser.screenshot("wrong-key")
    enter_key(browser, admin)
    badge = '[data-workload="default/chat"] [data-testid="replicas"]'
    until(
        browser,
        lambda d: [e.text for e in d.find_elements(By.CSS_SELECTOR, badge)] == ["1/1 ready"],
        "the fleet page with the admin key",
    )
    assert not d.find_element(By.ID, "key-panel").is_displayed()
    # The key is kept for the tab only and never written into the page.
    stored = d.execute_script("return sessionStorage.getItem('llmplane.key.admin')")
    assert stored == admin
    assert d.execute_script("return localStorage.length") == 0
    assert admin not in d.page_source and admin not in d.current_url

    # --- chat asks for a tenant key (the admin key is not one) and streams ---------------------
    d.get(f"{up.url}/console/#chat")
    until(
        browser,
        lambda d: (
            "tiny" in [o.text for o in d.find_elements(By.CSS_SELECTOR, "#chat-model option")]
        ),
        "model tiny in the model list (the admin key kept across the reload)",
    )
    ask_tiny(d)
    until(
        browser, lambda d: d.find_element(By.ID, "key-panel").is_displayed(), "the chat key prompt"
    )
    assert "tenant API key" in d.find_element(By.ID, "key-kind").text
    enter_key(browser, admin)
    until(
        browser,
        lambda d: "not a live API key" in d.find_element(By.ID, "key-error").text,
        "the admin key refused for chat",
    )
    enter_key(browser, tenant_key)
    until(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant .meta .tps"),
        "the streamed answer with its tokens/s",
    )
    answer = d.find_element(By.CSS_SELECTOR, ".msg.assistant .body").text
    assert len(answer.split()) >= 5, answer
    assert not d.find_elements(By.CSS_SELECTOR, ".msg.assistant.error")
    assert tenant_key not in d.page_source
    browser.screenshot("chat-with-key")


def test_without_an_admin_key_a_tenant_key_does_not_read_the_console(
    tenant_only: tuple[Up, str, str], browser: Browser
) -> None:
    from selenium.webdriver.common.by import By

    up, _, tenant_key = tenant_only
    prompt_refuses(browser, up, "none is configured", "no admin key is configured", tenant_key)
    # Chat still works with the tenant's key: its models come from the key's /v1/models.
    d = browser.driver
    d.get(f"{up.url}/console/#chat")
    # The Fleet page's prompt (no key satisfies it) gives way to chat's.
    until(
        browser,
        lambda d: (
            d.find_element(By.ID, "key-panel").is_displayed()
            and "tenant API key" in d.find_element(By.ID, "key-kind").text
        ),
        "the chat prompt",
    )
    enter_key(browser, tenant_key)
    until(
        browser,
        lambda d: (
            [o.text for o in d.find_elements(By.CSS_SELECTOR, "#chat-model option")] == ["tiny"]
        ),
        "the key's model in the model list",
    )
    ask_tiny(d)
    until(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant .meta .tps"),
        "the streamed answer",
    )
    assert not d.find_element(By.ID, "key-panel").is_displayed()
    assert tenant_key not in d.page_source
