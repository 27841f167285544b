"""The simulator's HTTP surface against real sim processes: vLLM shapes, the openai client,
determinism and metric types."""

from __future__ import annotations

import aiohttp
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmplane.testing import sim_process


@pytest.fixture(scope="module")
def sim():
    with sim_process("llama-8b", "--time-scale", "0.01", "--seed", "7") as p:
        yield p


async def post(url: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        return r.status, orjson.loads(await r.read())


async def test_chat_and_completion_shapes(sim):
    status, body = await post(
        f"{sim.url}/v1/chat/completions",
        {
            "model": "llama-8b",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "ignore_eos": True,
        },
    )
    assert status == 200
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"]) == 20  # 5 tokens x 4 characters
    assert body["usage"]["completion_tokens"] == 5
    assert body["kv_transfer_params"] is None

    status, body = await post(
        f"{sim.url}/v1/completions",
        {
            "model": "llama-8b",
            "prompt": ["abcd" * 3, "efgh"],
            "n": 2,
            "max_tokens": 3,
            "ignore_eos": True,
        },
    )
    assert status == 200 and body["object"] == "text_completion"
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["usage"] == {
        "prompt_tokens": 4, "total_tokens": 16, "completion_tokens": 12,
        "prompt_tokens_details": None, "completion_tokens_details": None,
    }  # fmt: skip


async def test_errors_in_vllm_shape(sim):
    status, body = await post(f"{sim.url}/v1/completions", {"model": "nope", "prompt": "x"})
    assert status == 404
    # vLLM 0.32's envelope (OpenAI's), with param naming the culprit.
    assert body == {"error": {
        "message": "The model `nope` does not exist. Valid aliases: llama-8b.",
        "type": "NotFoundError", "param": "model", "code": 404,
    }}  # fmt: skip
    status, body = await post(
        f"{sim.url}/v1/completions", {"model": "llama-8b", "prompt": "x", "max_tokens": 0}
    )
    assert status == 400 and body["error"] == {
        "message": "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
        "type": "BadRequestError", "param": "max_tokens", "code": 400,
    }  # fmt: skip
    status, body = await post(
        f"{sim.url}/v1/completions",
        {"model": "llama-8b", "prompt": "x", "max_tokens": 200_000},
    )
    assert status == 400 and body["error"]["param"] == "max_tokens"
    assert "cannot be greater than max_model_len=131072" in body["error"]["message"]
    status, body = await post(
        f"{sim.url}/v1/completions", {"model": "llama-8b", "prompt": [1] * 131_073}
    )
    assert status == 400 and body["error"]["param"] == "input_tokens"
    assert "maximum context length is 131072 tokens" in body["error"]["message"]
    status, body = await post(
        f"{sim.url}/v1/chat/completions",
        {"model": "llama-8b", "messages": [{"role": "user", "content": "x"}], "n": 2,
         "temperature": 0},
    )  # fmt: skip
    assert status == 400
    assert body["error"]["message"] == "n must be 1 when using greedy sampling, got 2."
    status, body = await post(f"{sim.url}/v1/chat/completions", {"model": "llama-8b"})
    assert status == 400 and body["error"]["type"] == "Bad Request"
    assert body["error"]["param"] == "body.messages"
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{sim.url}/v1/completions", data=b"{nope", headers={"Content-Type": "application/json"}
        ) as r,
    ):
        assert r.status == 400 and (await r.json())["error"]["param"] == "body.1"


async def test_max_tokens_is_cut_to_the_context_left():
    # vLLM 0.32 cuts max_tokens to max_model_len - prompt instead of refusing the request.
    with sim_process("m", "--time-scale", "0", "--max-model-len", "64") as sim:
        status, body = await post(
            f"{sim.url}/v1/completions",
            {"model": "m", "prompt": "abcd" * 10, "max_tokens": 60, "ignore_eos": True},
        )
        assert status == 200 and body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["prompt_tokens"] == 10 and body["usage"]["completion_tokens"] == 54
        status, body = await post(
            f"{sim.url}/v1/completions", {"model": "m", "prompt": [5] * 64, "max_tokens": 4}
        )
        assert status == 400
        assert (
            body["error"]["message"]
            == "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
        )


async def test_stop_max_completion_tokens_and_tokenize(sim):
    status, body = await post(
        f"{sim.url}/v1/chat/completions",
        {
            "model": "llama-8b",
            "messages": [{"role": "user", "content": "x"}],
            "max_completion_tokens": 3,
            "ignore_eos": True,
        },
    )
    assert body["usage"]["completion_tokens"] == 3
    text = body["choices"][0]["message"]["content"]
    status, body = await post(
        f"{sim.url}/v1/chat/completions",
        {
            "model": "llama-8b",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 3,
            "ignore_eos": True,
            "stop": [text[5:8]],
        },
    )
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == text[5:8]
    assert choice["message"]["content"] == text[:5]
    assert body["usage"]["completion_tokens"] == 2

    status, tok = await post(f"{sim.url}/tokenize", {"model": "llama-8b", "prompt": "a" * 10})
    assert status == 200 and tok["count"] == 3 and len(tok["tokens"]) == 3
    status, tok = await post(
        f"{sim.url}/tokenize", {"messages": [{"role": "user", "content": "hi"}]}
    )
    # "<|user|>\nhi\n<|assistant|>\n" is 26 characters
    assert tok["count"] == 7


async def test_models_health_and_version(sim):
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{sim.url}/v1/models") as r:
            models = await r.json()
        assert [m["id"] for m in models["data"]] == ["llama-8b"]
        assert models["data"][0]["owned_by"] == "vllm"
        async with s.get(f"{sim.url}/health") as r:
            assert r.status == 200
        async with s.get(f"{sim.url}/version") as r:
            assert "version" in await r.json()


async def test_raw_stream_bytes(sim):
    body = {"model": "llama-8b", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{sim.url}/v1/chat/completions", json=body) as r,
    ):
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = await r.read()
    events = raw.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    chunks = [orjson.loads(e[6:]) for e in events[:-2]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["finish_reason"] for c in chunks[1:4]] == [None, None, "length"]
    assert all("usage" not in c for c in chunks[:4])
    assert chunks[4]["choices"] == [] and chunks[4]["usage"]["completion_tokens"] == 3


async def test_openai_client(sim):
    client = openai.AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0)
    try:
        chat = await client.chat.completions.create(
            model="llama-8b", messages=[{"role": "user", "content": "hello"}], max_tokens=4,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 4
        comp = await client.completions.create(model="llama-8b", prompt="hello", max_tokens=4)
        assert comp.usage.prompt_tokens == 2 and comp.choices[0].text is not None

        stream = await client.chat.completions.create(
            model="llama-8b", messages=[{"role": "user", "content": "hello"}], max_tokens=4,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        parts, usage, finish = [], None, None
        async for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                parts.append(c.delta.content or "")
                finish = c.finish_reason or finish
        assert finish == "length" and usage.completion_tokens == 4
        assert "".join(parts) == chat.choices[0].message.content  # same request, same text

        stream = await client.completions.create(
            model="llama-8b", prompt="hello", max_tokens=4, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        texts, usage = [], None
        async for chunk in stream:
            usage = chunk.usage or usage
            texts += [c.text for c in chunk.choices]
        assert len(texts) == 4 and usage.total_tokens == 6

        with pytest.raises(openai.NotFoundError):
            await client.completions.create(model="missing", prompt="x")
        models = await client.models.list()
        assert [m.id for m in models.data] == ["llama-8b"]
    finally:
        await client.close()


async def test_same_seed_same_text_across_processes(sim):
    body = {"model": "llama-8b", "messages": [{"role": "user", "content": "determinism"}],
            "max_tokens": 40, "n": 2}  # fmt: skip
    _, first = await post(f"{sim.url}/v1/chat/completions", body)
    with sim_process("llama-8b", "--time-scale", "0", "--seed", "7") as other:
        _, second = await post(f"{other.url}/v1/chat/completions", body)
    with sim_process("llama-8b", "--time-scale", "0", "--seed", "8") as third:
        _, different = await post(f"{third.url}/v1/chat/completions", body)

    def key(b):
        return [(c["message"]["content"], c["finish_reason"]) for c in b["choices"]], b["usage"]

    assert key(first) == key(second)
    assert key(first) != key(different)
    assert first["choices"][0]["message"]["content"] != first["choices"][1]["message"]["content"]


METRICS = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:lora_requests_info": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:num_requests_waiting_by_reason": "gauge",
    "vllm:prompt_tokens_cached": "counter",
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_params_n": "histogram",
    "vllm:request_params_max_tokens": "histogram",
    "vllm:request_max_num_generation_tokens": "histogram",
    "vllm:request_num_preemptions": "histogram",
    "vllm:request_prefill_kv_computed_tokens": "histogram",
    "vllm:iteration_tokens_total": "histogram",
}


async def test_per_request_histograms_count_each_choice():
    with sim_process("m", "--time-scale", "0", "--max-model-len", "1000") as sim:
        for _ in range(2):  # the second one hits the prefix cache
            await post(
                f"{sim.url}/v1/completions",
                {"model": "m", "prompt": "abcd" * 40, "max_tokens": 3, "n": 2,
                 "ignore_eos": True},
            )  # fmt: skip
        async with aiohttp.ClientSession() as s, s.get(f"{sim.url}/metrics") as r:
            text = await r.text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}

    def value(name, suffix="_count", **labels):
        return next(x.value for x in fams[name].samples if x.name == name + suffix
                    and all(x.labels.get(k) == v for k, v in labels.items()))  # fmt: skip

    for name in ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                 "vllm:request_decode_time_seconds", "vllm:request_generation_tokens"):  # fmt: skip
        assert value(name) == 4  # 2 requests x n=2
    assert value("vllm:request_generation_tokens", "_sum") == 12
    assert value("vllm:request_prompt_tokens", "_sum") == 160
    assert value("vllm:request_params_n") == 2 and value("vllm:request_params_n", "_sum") == 4
    assert value("vllm:request_params_max_tokens", "_sum") == 12
    assert value("vllm:request_max_num_generation_tokens") == 2
    # 1000-token context: token buckets 1, 2, 5 ... 500, 1000
    buckets = [x.labels["le"] for x in fams["vllm:request_prompt_tokens"].samples
               if x.name.endswith("_bucket")]  # fmt: skip
    assert buckets[-2:] == ["1000.0", "+Inf"]
    cached = value("vllm:prompt_tokens_cached", "_total")
    assert cached > 0
    assert value("vllm:prompt_tokens_by_source", "_total", source="local_cache_hit") == cached
    assert value("vllm:prompt_tokens_by_source", "_total", source="local_compute") + cached == (
        value("vllm:prompt_tokens", "_total")
    )


async def test_every_metric_has_vllm_name_type_and_model_label(sim):
    await post(
        f"{sim.url}/v1/completions", {"model": "llama-8b", "prompt": "warm", "max_tokens": 2}
    )
    async with aiohttp.ClientSession() as s, s.get(f"{sim.url}/metrics") as r:
        text = await r.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, type_ in METRICS.items():
        fam = families[name]
        assert fam.type == type_, name
        assert fam.samples and all(x.labels.get("model_name") == "llama-8b" for x in fam.samples)
    for name in ("vllm:prefix_cache_queries_total", "vllm:request_success_total",
                 "vllm:time_to_first_token_seconds_bucket"):  # fmt: skip
        assert f"\n{name}{{" in text
    lora = families["vllm:lora_requests_info"].samples[0]
    assert set(lora.labels) >= {"running_lora_adapters", "waiting_lora_adapters", "max_lora"}
    assert lora.value > 1.6e9  # a timestamp, like vLLM
    cache = families["vllm:cache_config_info"].samples[0].labels
    assert cache["block_size"] == "16" and cache["num_gpu_blocks"] == "26000"
    reasons = {x.labels["finished_reason"] for x in families["vllm:request_success"].samples}
    assert reasons == {"stop", "length", "abort", "error", "repetition"}
    # one engine, labelled like vLLM's engine 0
    assert all(x.labels.get("engine") == "0" for f in families.values()
               if f.name.startswith("vllm:") for x in f.samples)  # fmt: skip
    assert r.headers["Content-Type"] == "text/plain; version=1.0.0; charset=utf-8"
    usage = families["vllm:kv_cache_usage_perc"].samples[0].value
    assert 0.0 <= usage <= 1.0


async def test_metrics_page_is_reused_while_idle_and_follows_every_change():
    """The page is cached while nothing changes (an idle fleet's scrapes cost next to
    nothing), yet a scrape during and after a request shows the request at once."""

    def samples(text: str) -> dict[tuple[str, tuple], float]:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
        }

    def one(values: dict, name: str, **labels: str) -> float:
        return next(
            v for (n, ls), v in values.items() if n == name and set(labels.items()) <= set(ls)
        )

    with sim_process("m", "--time-scale", "1") as sim:
        async with aiohttp.ClientSession() as s:

            async def scrape() -> str:
                async with s.get(f"{sim.url}/metrics") as r:
                    return await r.text()

            idle = await scrape()
            assert await scrape() == idle
            body = {"model": "m", "prompt": "hello", "max_tokens": 40, "ignore_eos": True,
                    "stream": True}  # fmt: skip
            async with s.post(f"{sim.url}/v1/completions", json=body) as r:
                await r.content.readline()  # the first token is out: the request runs
                during = samples(await scrape())
                assert one(during, "vllm:num_requests_running") == 1
                assert one(during, "vllm:time_to_first_token_seconds_count") == 1
                await r.read()
            after = samples(await scrape())
            assert samples(await scrape()) == after
    assert one(samples(idle), "vllm:num_requests_running") == 0
    assert one(after, "vllm:num_requests_running") == 0
    assert one(after, "vllm:request_success_total", finished_reason="length") == 1
    assert one(after, "vllm:generation_tokens_total") == 40
    assert one(after, "vllm:e2e_request_latency_seconds_count") == 1
    assert one(after, "vllm:inter_token_latency_seconds_count") == 39
    assert one(after, "vllm:kv_cache_usage_perc") == 0


def test_a_running_process_is_never_launched_twice() -> None:
    """A second launch would orphan the first process (bench/sim_scrape.py leaked a sim per
    run that way): it is refused, and the one process stops with the ``with``."""
    with sim_process("m") as sim:
        first = sim.pid
        with pytest.raises(RuntimeError, match="already running"):
            sim.start()
        assert sim.pid == first
    assert sim.proc is not None and sim.proc.poll() is not None
