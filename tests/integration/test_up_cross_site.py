"""Requests a web page on another origin makes, against ``llmplane up`` with a sim replica:
refused with 403 on the API and the console (a foreign ``Origin``, ``null``, or no Origin but
``Sec-Fetch-Site: cross-site`` / ``same-site``) whatever their Content-Type; the gateway's own
pages, links followed to the console, configured origins and clients outside browsers pass.
(tests/browser/test_console_cross_site.py makes the same requests from a real Chromium.)"""

from __future__ import annotations

import http.client
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from llmplane.gateway.config import ConfigFileError, load_checked
from llmplane.testing import Processes, Up, wait_for
from tests.integration.openai_errors import assert_openai_error
from tests.integration.upcli import sim_fleet, status

ALLOWED = "http://app.example:3000"
BODY = orjson.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 1})


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("cross-site")
    (tmp / "fleet.yaml").write_text(sim_fleet("tiny", 1))
    (tmp / "gateway.yaml").write_text(f"gateway:\n  allowedOrigins: ['{ALLOWED}']\n")
    with Processes() as processes:
        up = processes.up(
            tmp / "state",
            str(tmp / "fleet.yaml"),
            args=["--gateway-config", str(tmp / "gateway.yaml")],
        )
        wait_for(
            lambda: status(up.state_dir, "Playground", "tiny").get("readyReplicas") == 1,
            90,
            what="Playground tiny ready",
        )
        yield up


def _send(
    up: Up, method: str, path: str, headers: dict[str, str], body: bytes | None = None
) -> tuple[int, bytes]:
    """One request with exactly ``headers`` (no Content-Type unless given)."""
    host, port = up.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _other_port(up: Up) -> int:
    return int(up.url.rpartition(":")[2]) + 1


def _foreign_headers(up: Up) -> list[dict[str, str]]:
    own = up.url.removeprefix("http://")
    return [
        {"Origin": f"http://127.0.0.1:{_other_port(up)}"},  # another port on this machine
        {"Origin": f"http://localhost:{own.rpartition(':')[2]}"},  # another name for it
        {"Origin": "null"},  # sandboxed frames, file:// pages
        {"Origin": "http://evil.example"},
        {"Origin": f"http://{own}.evil.example"},
        {"Origin": f"http://{own}/"},  # not an origin at all
        {"Origin": "http://app.example:3001"},  # the configured one's host, another port
        {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},
        {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"},
        {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"},  # a form POST
        {"Origin": "http://evil.example", "Sec-Fetch-Site": "same-origin"},  # Origin decides
    ]


@pytest.mark.parametrize("content_type", [None, "application/json"])
def test_pages_on_other_origins_are_refused_on_the_api(up: Up, content_type: str | None) -> None:
    extra = {"Content-Type": content_type} if content_type else {}
    for headers in _foreign_headers(up):
        for path in ("/v1/completions", "/v1/chat/completions"):
            code, raw = _send(up, "POST", path, {**headers, **extra}, BODY)
            assert_openai_error(code, raw, 403, "origin_not_allowed")
        code, raw = _send(up, "GET", "/v1/models", headers)
        assert_openai_error(code, raw, 403, "origin_not_allowed")


def test_pages_on_other_origins_are_refused_on_the_console(up: Up) -> None:
    for headers in _foreign_headers(up):
        for path in ("/console/api/fleet", "/console/api/resources", "/console/api/whoami"):
            code, raw = _send(up, "GET", path, headers)
            assert_openai_error(code, raw, 403, "origin_not_allowed")


def test_own_pages_links_configured_origins_and_plain_clients_pass(up: Up) -> None:
    own = up.url.removeprefix("http://")
    passing = [
        {},  # curl, scripts
        {"Origin": f"http://{own}"},  # the console's own page
        {"Origin": f"http://{own}", "Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Site": "none"},  # typed into the address bar
        {"Origin": ALLOWED},
        {"Origin": ALLOWED.upper()},
        {"Origin": ALLOWED, "Sec-Fetch-Site": "cross-site"},
    ]
    for headers in passing:
        code, raw = _send(up, "POST", "/v1/completions", headers, BODY)
        assert code == 200, (headers, raw)
        assert _send(up, "GET", "/console/api/fleet", headers)[0] == 200, headers
    # A link on another site opens the console's page (nothing there for that site to read).
    link = {
        "Sec-Fetch-Site": "cross-site",
        "Sec-Fetch-Mode": "navigate",
        "Sec-Fetch-Dest": "document",
    }
    assert _send(up, "GET", "/console/", link)[0] == 200
    # ... but the same navigation may not POST, nor open the API in a frame.
    assert _send(up, "POST", "/v1/completions", link, BODY)[0] == 403
    frame = {**link, "Sec-Fetch-Dest": "iframe"}
    assert _send(up, "GET", "/console/api/fleet", frame)[0] == 403
    client = openai.OpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0)
    assert client.completions.create(model="tiny", prompt="hi", max_tokens=1).choices


@pytest.mark.parametrize(
    "value",
    ["app.example", "http://app.example/path", "ftp//x", "http://a b", "http://x:99999999", 3],
)
def test_a_bad_allowed_origin_stops_the_gateway_at_start(tmp_path: Path, value: object) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(f"gateway:\n  allowedOrigins: [{orjson.dumps(value).decode()}]\n")
    with pytest.raises(ConfigFileError, match="allowedOrigins"):
        load_checked(path)
