"""Engine behaviour a router can observe, against real sim processes: prefix caching,
queueing, LoRA slots and prefill/decode disaggregation."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmplane.testing import sim_process

LONG = "The quick brown fox jumps over the lazy dog. " * 360  # ~4,000 tokens


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, list]:
    async with session.get(f"{url}/metrics") as r:
        text = await r.text()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(metrics: dict, name: str) -> float:
    return metrics[name][0].value


async def timed_post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    async with session.post(url, json=body) as r:
        data = orjson.loads(await r.read())
        assert r.status == 200, data
    return time.perf_counter() - t0, data


@pytest.fixture(scope="module")
def sim():
    with sim_process("m", "--time-scale", "0.2", "--max-num-seqs", "4") as p:
        yield p


async def test_repeated_long_prompt_is_faster_and_hits_the_prefix_cache(sim):
    url = f"{sim.url}/v1/completions"
    async with aiohttp.ClientSession() as s:
        before = await scrape(s, sim.url)
        body = {"model": "m", "prompt": LONG, "max_tokens": 1}
        cold, first = await timed_post(s, url, body)
        warm, _ = await timed_post(s, url, body)
        after = await scrape(s, sim.url)
    assert first["usage"]["prompt_tokens"] > 3500
    # prefill of ~4,000 tokens: ~150 ms modelled x 0.2; cached: one block's worth
    assert warm < cold / 2, (cold, warm)
    hits = value(after, "vllm:prefix_cache_hits") - value(before, "vllm:prefix_cache_hits")
    queries = value(after, "vllm:prefix_cache_queries") - value(before, "vllm:prefix_cache_queries")
    assert hits >= 3500 and queries >= 2 * 3500


async def test_requests_queue_beyond_max_num_seqs(sim):
    url = f"{sim.url}/v1/completions"
    body = {"model": "m", "prompt": "burst", "max_tokens": 60, "ignore_eos": True}
    seen_waiting, seen_running = 0.0, 0.0
    async with aiohttp.ClientSession() as s:
        tasks = [asyncio.create_task(timed_post(s, url, body)) for _ in range(16)]
        while not all(t.done() for t in tasks):
            m = await scrape(s, sim.url)
            seen_waiting = max(seen_waiting, value(m, "vllm:num_requests_waiting"))
            seen_running = max(seen_running, value(m, "vllm:num_requests_running"))
            await asyncio.sleep(0.005)
        await asyncio.gather(*tasks)
        idle = await scrape(s, sim.url)
    assert seen_waiting > 0
    assert seen_running == 4  # never more than --max-num-seqs
    assert value(idle, "vllm:num_requests_running") == 0
    assert value(idle, "vllm:num_requests_waiting") == 0
    assert value(idle, "vllm:kv_cache_usage_perc") == 0


async def test_lora_metrics_show_running_and_waiting_adapters():
    with sim_process(
        "m", "--time-scale", "0.2", "--max-loras", "1", "--lora-modules", "a=/loras/a"
    ) as sim:
        async with aiohttp.ClientSession() as s:
            async with s.post(
                f"{sim.url}/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": "/loras/b"}
            ) as r:
                assert r.status == 200 and "added successfully" in await r.text()
            async with s.post(
                f"{sim.url}/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": "/x"}
            ) as r:
                assert r.status == 400 and (await r.json())["error"]["type"] == "InvalidUserInput"
            async with s.get(f"{sim.url}/v1/models") as r:
                cards = (await r.json())["data"]
            assert [(c["id"], c["parent"]) for c in cards] == [
                ("m", None),
                ("a", "m"),
                ("b", "m"),
            ]

            url = f"{sim.url}/v1/completions"
            tasks = [
                asyncio.create_task(
                    timed_post(
                        s, url, {"model": name, "prompt": "x", "max_tokens": 40, "ignore_eos": True}
                    )
                )
                for name in ("a", "b", "a", "b")
            ]
            seen = set()
            while not all(t.done() for t in tasks):
                m = await scrape(s, sim.url)
                lab = m["vllm:lora_requests_info"][0].labels
                assert lab["max_lora"] == "1"
                seen.add((lab["running_lora_adapters"], lab["waiting_lora_adapters"]))
                await asyncio.sleep(0.005)
            results = await asyncio.gather(*tasks)
            assert [r[1]["model"] for r in results] == ["a", "b", "a", "b"]
            assert ("a", "b") in seen or ("b", "a") in seen
            assert all("," not in run for run, _ in seen)  # never two active adapters

            async with s.post(f"{sim.url}/v1/unload_lora_adapter", json={"lora_name": "b"}) as r:
                assert r.status == 200
            async with s.post(url, json={"model": "b", "prompt": "x"}) as r:
                assert r.status == 404
            async with s.post(f"{sim.url}/v1/unload_lora_adapter", json={"lora_name": "b"}) as r:
                assert r.status == 404


async def by_source(s: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """``vllm:prompt_tokens_by_source_total`` per source, from the engine's /metrics, and the
    KV connector's ``vllm:external_prefix_cache_{queries,hits}_total`` (keys ``queries``,
    ``hits``) when the engine has them."""
    async with s.get(f"{url}/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:prompt_tokens_by_source_total{"):
            source = line.split('source="', 1)[1].split('"', 1)[0]
            out[source] = float(line.rsplit(" ", 1)[1])
        for key in ("queries", "hits"):
            if line.startswith(f"vllm:external_prefix_cache_{key}_total{{"):
                out[key] = float(line.rsplit(" ", 1)[1])
    return out


async def test_prefill_decode_disaggregation():
    prompt = "Disaggregated serving moves the KV cache between instances. " * 160  # ~2.4k tok
    other = "A cold request of the same length that nobody prefilled before. " * 150
    args = ("--time-scale", "0.2")
    with (
        sim_process("m", *args, "--role", "prefill") as pre,
        sim_process("m", *args, "--role", "decode") as dec,
    ):
        async with aiohttp.ClientSession() as s:
            _, pre_resp = await timed_post(
                s,
                f"{pre.url}/v1/completions",
                {
                    "model": "m",
                    "prompt": prompt,
                    "max_tokens": 1,
                    "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
                },
            )
            kv = pre_resp["kv_transfer_params"]
            assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
            assert kv["remote_port"] == pre.port and kv["remote_host"] == "127.0.0.1"
            assert kv["remote_engine_id"] and len(kv["remote_block_ids"]) >= 100

            # What the decode instance computed itself and what it took over, by its own
            # counters (not wall-clock time, which a loaded machine blurs).
            body = {"model": "m", "max_tokens": 5, "ignore_eos": True}
            start = await by_source(s, dec.url)
            _, pd_resp = await timed_post(
                s, f"{dec.url}/v1/completions", {**body, "prompt": prompt, "kv_transfer_params": kv}
            )
            after_pd = await by_source(s, dec.url)
            _, cold_resp = await timed_post(
                s, f"{dec.url}/v1/completions", {**body, "prompt": other}
            )
            after_cold = await by_source(s, dec.url)
            assert pd_resp["usage"]["completion_tokens"] == 5
            pd_prompt, cold_prompt = (r["usage"]["prompt_tokens"] for r in (pd_resp, cold_resp))
            assert pd_prompt >= cold_prompt - 50
            # Given the prefill's KV: all but the last prompt token transferred, none computed.
            assert after_pd["external_kv_transfer"] - start["external_kv_transfer"] == pd_prompt - 1
            assert after_pd["local_compute"] - start["local_compute"] <= 1
            # As vLLM with a KV connector: the prompt asked of the connector, all but the last
            # token found there (what the console shows as KV moved).
            assert after_pd["queries"] - start["queries"] == pd_prompt
            assert after_pd["hits"] - start["hits"] == pd_prompt - 1
            # The cold request: computed here, every token.
            assert after_cold["local_compute"] - after_pd["local_compute"] == cold_prompt
            assert after_cold["external_kv_transfer"] == after_pd["external_kv_transfer"]
            assert after_cold["queries"] - after_pd["queries"] == cold_prompt
            assert after_cold["hits"] == after_pd["hits"]

            # SGLang style: the decode instance skips prefill given bootstrap parameters.
            third = "SGLang bootstrap rooms pair a prefill with a decode. " * 170
            _, sg_resp = await timed_post(
                s,
                f"{dec.url}/v1/completions",
                {**body, "prompt": third, "bootstrap_room": 1234, "bootstrap_host": "127.0.0.1"},
            )
            after_sg = await by_source(s, dec.url)
            sg_prompt = sg_resp["usage"]["prompt_tokens"]
            transferred = after_sg["external_kv_transfer"] - after_cold["external_kv_transfer"]
            assert transferred == sg_prompt - 1
            assert after_sg["local_compute"] - after_cold["local_compute"] <= 1
