"""A page on another origin in a real headless Chromium cannot use a keyless loopback gateway:
``llmplane up`` with a sim replica, and a page served from another 127.0.0.1 port whose
``fetch()`` calls POST completions (no Content-Type: no CORS preflight; ``no-cors`` and
``cors`` modes), read the console's API, and submit a form. The engine's own request counter
says whether any of them was served; the console's own page then chats through the same
gateway, so the counter is seen to move when a request does get through."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llmplane.testing import Up, wait_for
from tests.browser.conftest import Browser, until
from tests.integration.upcli import http, sim_fleet, status

pytestmark = pytest.mark.slow

ATTACK = """<!doctype html><html><head><link rel="icon" href="data:,"></head><body>
<form id="f" method="POST" action="GATEWAY/v1/completions" target="sink" enctype="text/plain">
<input name='{"model": "tiny", "prompt": "hi", "max_tokens": 1, "x": "' value='"}'></form>
<iframe name="sink"></iframe>
<script>
const gw = "GATEWAY";
const body = JSON.stringify({model: "tiny", prompt: "hi", max_tokens: 1});
async function attempt(name, path, init) {
  try {
    const r = await fetch(gw + path, init);
    window.results[name] = r.type === "opaque" ? "opaque" : String(r.status);
  } catch (e) {
    window.results[name] = "failed";
  }
}
window.results = {};
Promise.all([
  attempt("no-cors", "/v1/completions", {method: "POST", mode: "no-cors", body: new Blob([body])}),
  attempt("cors", "/v1/completions", {method: "POST", body: new Blob([body])}),
  attempt("chat", "/v1/chat/completions", {method: "POST", mode: "no-cors",
    body: new Blob([JSON.stringify({model: "tiny", max_tokens: 1,
                                    messages: [{role: "user", content: "hi"}]})])}),
  attempt("fleet", "/console/api/fleet", {}),
  attempt("models", "/v1/models", {}),
]).then(() => { document.getElementById("f").submit(); window.done = true; });
</script></body></html>
"""


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    path = tmp_path / "fleet.yaml"
    path.write_text(sim_fleet("tiny", 1))
    up = Up(tmp_path / "state", str(path)).start()
    try:
        wait_for(
            lambda: status(up.state_dir, "Playground", "tiny").get("readyReplicas") == 1,
            what="Playground tiny ready",
        )
        yield up
    finally:
        up.kill_everything()


@pytest.fixture
def other_site(tmp_path: Path, up: Up) -> Iterator[str]:
    """A page on another port of 127.0.0.1 (another origin, the same site) that calls ``up``."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "attack.html").write_text(ATTACK.replace("GATEWAY", up.url))
    handler = partial(SimpleHTTPRequestHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/attack.html"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def served(up: Up) -> float:
    """Requests the engine finished (its ``vllm:request_success_total``), read directly."""
    _, _, fleet = http(f"{up.url}/console/api/fleet")
    address = fleet["workloads"][0]["replicas"][0]["address"]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


def frame_text(d: object) -> str:
    """The text of the attack page's frame (where the form's answer lands)."""
    d.switch_to.frame("sink")  # type: ignore[attr-defined]
    try:
        return str(d.find_element("tag name", "body").text)  # type: ignore[attr-defined]
    finally:
        d.switch_to.default_content()  # type: ignore[attr-defined]


def test_a_page_on_another_origin_gets_nothing_served(
    up: Up, other_site: str, browser: Browser
) -> None:
    d = browser.driver
    before = served(up)
    d.get(other_site)
    until(browser, lambda d: d.execute_script("return window.done === true"), "the attack page")
    results = d.execute_script("return window.results")
    # Nothing readable came back: fetch failed or was opaque, whatever the gateway did.
    assert results == {
        "no-cors": "opaque",
        "cors": "failed",
        "chat": "opaque",
        "fleet": "failed",
        "models": "failed",
    }, results
    assert served(up) == before, "a request from another origin reached the engine"
    # The form's POST goes last: the frame shows the gateway's refusal.
    until(browser, lambda d: "origin_not_allowed" in frame_text(d), "the form POST refused")
    assert served(up) == before, "the form's POST reached the engine"
    # The browser logged the refusals (403s, CORS errors): the attack page's, nothing else.
    errors = browser.severe()
    assert errors and all(
        up.url in str(e["message"]) or "attack.html" in str(e["message"]) for e in errors
    ), errors

    # The console's own page (same origin) is served by the same gateway, through the engine.
    d.get(f"{up.url}/console/#chat")
    d.execute_script(
        "fetch('/v1/completions', {method: 'POST', headers: {'Content-Type': 'application/json'},"
        " body: JSON.stringify({model: 'tiny', prompt: 'hi', max_tokens: 1})})"
        ".then(r => { window.status_code = r.status; })"
    )
    until(
        browser, lambda d: d.execute_script("return window.status_code") == 200, "same-origin 200"
    )
    wait_for(lambda: served(up) == before + 1, 10, what="the engine counting the console's request")
