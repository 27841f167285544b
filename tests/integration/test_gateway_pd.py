"""Prefill/decode disaggregation against real simulated engines (``python -m llmplane.sim
--role prefill|decode``): nixl hands the prefill's kv_transfer_params to the decode, http
prefills then decodes with the client's body, SGLang sends both at once with one bootstrap
room, pairs stay within their group, streams come from the decode, and a failing prefill is
retried on another prefill replica.

Every sim sits behind a small recording proxy (``Tap``) so the tests see the exact bodies the
gateway sent and when; the sims' own metrics show what they did with them."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager

import aiohttp
import orjson
import pytest
from aiohttp import web

from llmplane.gateway.discovery import Endpoint, StaticDiscovery
from llmplane.gateway.pd import PREFILL_HEADER
from llmplane.gateway.server import start_gateway
from llmplane.store.sqlite import SQLiteStore
from llmplane.testing import Process, eventually
from tests.integration.openai_errors import assert_openai_error

KTHENA = "networking.serving.volcano.sh/v1alpha1"
MODEL = "pd-model"
GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-index"
_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


class Tap:
    """A recording reverse proxy in front of one sim: every request's body, start and end
    times, status and (for JSON answers) response body."""

    def __init__(self, target: str, host: str = "127.0.0.1") -> None:
        self.target = target
        self.host = host
        self.calls: list[dict] = []
        self.runner: web.AppRunner | None = None
        self.session: aiohttp.ClientSession | None = None
        self.address = ""

    async def start(self) -> Tap:
        self.session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.forward)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.address = f"{self.host}:{port}"
        return self

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.session is not None:
            await self.session.close()

    @property
    def inference(self) -> list[dict]:
        return [c for c in self.calls if c["path"].startswith("/v1/") and c["method"] == "POST"]

    async def forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        call: dict = {"method": request.method, "path": request.path, "start": time.monotonic()}
        if body:
            call["body"] = orjson.loads(body)
        self.calls.append(call)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        assert self.session is not None
        try:
            async with self.session.request(
                request.method, f"http://{self.target}{request.path_qs}", data=body,
                headers=headers,
            ) as upstream:  # fmt: skip
                call["status"] = upstream.status
                out = web.StreamResponse(
                    status=upstream.status,
                    headers={k: v for k, v in upstream.headers.items() if k.lower() not in _HOP},
                )
                await out.prepare(request)
                data = b""
                async for chunk in upstream.content.iter_any():
                    data += chunk
                    await out.write(chunk)
                await out.write_eof()
                call["end"] = time.monotonic()
                if upstream.headers.get("content-type", "").startswith("application/json"):
                    call["response"] = orjson.loads(data)
                return out
        except BaseException:
            call["end"] = time.monotonic()
            call.setdefault("status", "aborted")
            raise


async def metrics_of(address: str) -> dict[str, float]:
    """The sim's Prometheus samples, ``name{labels}`` -> value (without engine/model)."""
    async with aiohttp.ClientSession() as s, s.get(f"http://{address}/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


def sample(metrics: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for key, value in metrics.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


class Pod:
    """One sim process (a prefill or decode replica) behind a Tap, labelled like a pod."""

    def __init__(self, server: Process, role: str, group: str, host: str = "127.0.0.1") -> None:
        self.role = role
        self.group = group
        self.server = server
        self.tap = Tap(self.server.address, host)

    @property
    def address(self) -> str:
        return self.tap.address

    @property
    def sim_address(self) -> str:
        return self.server.address

    def endpoint(self) -> Endpoint:
        labels = {"app": "pd", "role": self.role, GROUP_KEY: self.group}
        return Endpoint(self.address, labels, model_name=MODEL, engine="vllm")

    async def metrics(self) -> dict[str, float]:
        return await metrics_of(self.sim_address)


@pytest.fixture
def pod(processes):
    """``pod(role, group, host="127.0.0.1", *sim_args)``: a started sim behind a Tap (the sims
    end with the test; ``pd_gateway`` closes the taps)."""

    def make(role: str, group: str, host: str = "127.0.0.1", *extra: str) -> Pod:
        return Pod(processes.sim(MODEL, "--role", role, *extra), role, group, host)

    return make


def objects(engine: str = "vLLM", connector: str | None = None, retry: int | None = None):
    spec: dict = {
        "model": MODEL,
        "inferenceEngine": engine,
        "workloadSelector": {
            "matchLabels": {"app": "pd"},
            "pdGroup": {
                "groupKey": GROUP_KEY,
                "prefillLabels": {"role": "prefill"},
                "decodeLabels": {"role": "decode"},
            },
        },
    }
    if connector:
        spec["kvConnector"] = {"type": connector}
    if retry is not None:
        spec["trafficPolicy"] = {"retry": {"attempts": retry, "retryInterval": "0s"}}
    meta = {"name": "pd", "namespace": "default"}
    return [
        {"apiVersion": KTHENA, "kind": "ModelServer", "metadata": meta, "spec": spec},
        {
            "apiVersion": KTHENA,
            "kind": "ModelRoute",
            "metadata": meta,
            "spec": {"modelName": "pd", "rules": [{"targetModels": [{"modelServerName": "pd"}]}]},
        },
    ]


@asynccontextmanager
async def pd_gateway(tmp_path, pods, **spec):
    for p in pods:
        await p.tap.start()
    store = SQLiteStore(tmp_path / "db.sqlite")
    for obj in objects(**spec):
        store.apply(obj)
    gw = await start_gateway(store, StaticDiscovery([p.endpoint() for p in pods]))
    try:
        await eventually(  # the routing table follows the store
            lambda: gw.table.servers and all(gw.registry.states.values()),
            what="the routing table and endpoints",
        )
        async with aiohttp.ClientSession() as client:
            yield gw, client
    finally:
        await gw.close()
        store.close()
        for p in pods:
            await p.tap.close()


def prompt(i: int, chars: int = 2000) -> list[dict]:
    text = (f"request {i}: " + "the quick brown fox jumps over the lazy dog " * 100)[:chars]
    return [{"role": "user", "content": text}]


async def post(client, gw, body):
    async with client.post(f"http://127.0.0.1:{gw.port}/v1/chat/completions", json=body) as r:
        return r.status, r.headers, await r.read()


def by_address(pods):
    return {p.address: p for p in pods}


# --- nixl ---------------------------------------------------------------------------------


async def test_nixl_hands_kv_transfer_params_to_decode(tmp_path, pod):
    prefill, decode = pod("prefill", "0"), pod("decode", "0")
    async with pd_gateway(tmp_path, [prefill, decode], connector="nixl") as (gw, client):
        body = {"model": "pd", "messages": prompt(1), "max_tokens": 5, "ignore_eos": True}
        status, headers, data = await post(client, gw, body)
        assert status == 200, data
        assert headers["x-llmplane-endpoint"] == decode.address
        assert headers[PREFILL_HEADER] == prefill.address
        answer = orjson.loads(data)
        assert answer["usage"]["completion_tokens"] == 5
        prompt_tokens = answer["usage"]["prompt_tokens"]

        # What the gateway sent.
        (p_call,) = prefill.tap.inference
        (d_call,) = decode.tap.inference
        assert p_call["body"]["max_tokens"] == 1
        assert p_call["body"]["kv_transfer_params"] == {
            "do_remote_decode": True,
            "do_remote_prefill": False,
        }
        handed = p_call["response"]["kv_transfer_params"]
        assert handed["do_remote_prefill"] is True and handed["remote_block_ids"]
        assert d_call["body"]["kv_transfer_params"] == handed  # verbatim
        assert d_call["body"]["max_tokens"] == 5
        assert d_call["start"] >= p_call["end"]

        # What the sims did: the prefill answered one token; the decode got the prompt's KV
        # over the (simulated) wire and computed only the last prompt token.
        pm, dm = await prefill.metrics(), await decode.metrics()
        assert sample(pm, "vllm:request_params_max_tokens_sum") == 1
        assert sample(pm, "vllm:generation_tokens_total") == 1
        assert sample(dm, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == (
            prompt_tokens - 1
        )
        assert sample(dm, "vllm:prompt_tokens_by_source_total", source="local_compute") == 1

        text = (await (await client.get(f"http://127.0.0.1:{gw.port}/metrics")).read()).decode()
        assert 'llmplane_gateway_pd_requests_total{connector="nixl",model="pd"} 1.0' in text
        assert 'llmplane_gateway_pd_prefill_duration_seconds_count{model="pd"} 1.0' in text


async def test_pairs_stay_within_their_group(tmp_path, pod):
    pods = [pod(role, group) for group in ("0", "1") for role in ("prefill", "decode")]
    async with pd_gateway(tmp_path, pods, connector="nixl") as (gw, client):
        pods_by = by_address(pods)
        seen = set()
        for i in range(16):
            body = {"model": "pd", "messages": prompt(i, 400), "max_tokens": 2}
            status, headers, data = await post(client, gw, body)
            assert status == 200, data
            d = pods_by[headers["x-llmplane-endpoint"]]
            p = pods_by[headers[PREFILL_HEADER]]
            assert (d.role, p.role) == ("decode", "prefill")
            assert d.group == p.group
            seen.add(d.group)
        assert seen == {"0", "1"}
        for group in ("0", "1"):
            p, d = (x for x in pods if x.group == group)
            # every decode request of the group followed a prefill of the same group
            assert len(p.tap.inference) == len(d.tap.inference) > 0
            dm = await d.metrics()
            assert sample(dm, "vllm:prompt_tokens_by_source_total", source="local_compute") == (
                len(d.tap.inference)
            )


async def test_stream_comes_from_decode(tmp_path, pod):
    prefill, decode = pod("prefill", "0"), pod("decode", "0")
    async with pd_gateway(tmp_path, [prefill, decode], connector="nixl") as (gw, client):
        body = {
            "model": "pd",
            "messages": prompt(2),
            "max_tokens": 6,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with client.post(f"http://127.0.0.1:{gw.port}/v1/chat/completions", json=body) as r:
            assert r.status == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["x-llmplane-endpoint"] == decode.address
            assert r.headers[PREFILL_HEADER] == prefill.address
            raw = (await r.read()).decode()
        events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [orjson.loads(e) for e in events[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert len(text) == 6 * 4  # six 4-character words
        assert chunks[-1]["usage"]["completion_tokens"] == 6

        (p_call,) = prefill.tap.inference
        (d_call,) = decode.tap.inference
        assert "stream" not in p_call["body"] and "stream_options" not in p_call["body"]
        assert p_call["body"]["max_tokens"] == 1
        assert d_call["body"]["stream"] is True
        assert d_call["body"]["kv_transfer_params"] == p_call["response"]["kv_transfer_params"]
        dm = await decode.metrics()
        assert sample(dm, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") > 0


# --- http / lmcache -----------------------------------------------------------------------


async def test_http_prefills_then_decodes_with_the_original_body(tmp_path, pod):
    prefill, decode = pod("prefill", "0"), pod("decode", "0")
    async with pd_gateway(tmp_path, [prefill, decode], connector="http") as (gw, client):
        body = {
            "model": "pd",
            "messages": prompt(3),
            "max_completion_tokens": 4,
            "min_tokens": 2,
            "temperature": 0.5,
        }
        status, headers, data = await post(client, gw, body)
        assert status == 200, data
        assert headers[PREFILL_HEADER] == prefill.address
        (p_call,) = prefill.tap.inference
        (d_call,) = decode.tap.inference
        sent = {**body, "model": MODEL}  # the route rewrites the model, nothing else changes
        assert d_call["body"] == sent
        assert p_call["body"] == {
            **{k: v for k, v in sent.items() if k != "min_tokens"},
            "max_tokens": 1,
            "max_completion_tokens": 1,
        }
        assert p_call["end"] <= d_call["start"]  # prefill, then decode
        # The sim's decode has no shared KV store: it computed the prompt itself.
        dm = await decode.metrics()
        assert sample(dm, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0


# --- SGLang ---------------------------------------------------------------------------------


async def test_sglang_sends_both_at_once_with_one_bootstrap_room(tmp_path, pod):
    # A slow prefill (real time) makes the overlap visible; the prefill replicas listen on
    # their own loopback addresses so bootstrap_host names one of them.
    slow = ("--time-scale", "1", "--prefill-time-per-token", "0.0002")
    pods = [
        pod("prefill", "0", "127.0.0.2", *slow),
        pod("decode", "0"),
        pod("prefill", "1", "127.0.0.3", *slow),
        pod("decode", "1"),
    ]
    async with pd_gateway(tmp_path, pods, engine="SGLang") as (gw, client):
        pods_by = by_address(pods)
        for i in range(6):
            body = {"model": "pd", "messages": prompt(10 + i), "max_tokens": 3}
            status, headers, data = await post(client, gw, body)
            assert status == 200, data
            p = pods_by[headers[PREFILL_HEADER]]
            d = pods_by[headers["x-llmplane-endpoint"]]
            assert p.group == d.group
            p_call, d_call = p.tap.inference[-1], d.tap.inference[-1]
            room = p_call["body"]["bootstrap_room"]
            assert isinstance(room, int) and room >= 0
            assert d_call["body"]["bootstrap_room"] == room
            assert d_call["body"]["bootstrap_host"] == p.tap.host
            assert p_call["body"]["max_tokens"] == 1 and d_call["body"]["max_tokens"] == 3
            # concurrent: the decode was sent while the prefill was still running (the sim's
            # decode does not wait for the prefill, so the prefill may even outlast it)
            assert d_call["start"] < p_call.get("end", float("inf"))
            assert abs(d_call["start"] - p_call["start"]) < 0.1
        await eventually(  # prefills the decodes outran finish in the background
            lambda: all("end" in c for p in pods for c in p.tap.inference),
            what="every prefill to finish",
        )
        assert all(c["status"] == 200 for p in pods for c in p.tap.inference)
        rooms = [c["body"]["bootstrap_room"] for p in pods for c in p.tap.inference]
        assert len(rooms) == 12 and len(set(rooms)) == 6  # a new room per request
        for d in (p for p in pods if p.role == "decode" and p.tap.inference):
            dm = await d.metrics()  # the decode skipped the prefill
            assert sample(dm, "vllm:prompt_tokens_by_source_total", source="local_compute") == (
                len(d.tap.inference)
            )


# --- failures -------------------------------------------------------------------------------


async def test_failed_prefill_is_retried_on_another_prefill(tmp_path, pod):
    bad = pod("prefill", "0", "127.0.0.1", "--fault-error-rate", "1", "--fault-error-codes", "503")
    good, decode = pod("prefill", "0"), pod("decode", "0")
    async with pd_gateway(tmp_path, [bad, good, decode], connector="nixl", retry=2) as (gw, client):
        for i in range(20):
            body = {"model": "pd", "messages": prompt(100 + i, 300), "max_tokens": 2}
            status, headers, data = await post(client, gw, body)
            assert status == 200, data
            assert headers[PREFILL_HEADER] == good.address
            assert headers["x-llmplane-endpoint"] == decode.address
            if bad.tap.inference:
                break
        assert [c["status"] for c in bad.tap.inference] == [503]
        # The decode saw one request per client request, each with the good prefill's KV.
        assert len(decode.tap.inference) == i + 1
        dm = await decode.metrics()
        assert sample(dm, "vllm:prompt_tokens_by_source_total", source="local_compute") == i + 1
        text = (await (await client.get(f"http://127.0.0.1:{gw.port}/metrics")).read()).decode()
        assert "llmplane_gateway_retries_total" in text


async def test_no_prefill_in_the_group_is_503(tmp_path, pod):
    prefill, decode = pod("prefill", "0"), pod("decode", "1")
    async with pd_gateway(tmp_path, [prefill, decode], connector="nixl") as (gw, client):
        status, _, data = await post(client, gw, {"model": "pd", "messages": prompt(0, 50)})
        error = assert_openai_error(status, data, 503)
        assert "no prefill/decode pair" in error["message"]
        assert not prefill.tap.inference and not decode.tap.inference


async def test_all_prefills_failing_gives_the_engines_error(tmp_path, pod):
    bad = pod("prefill", "0", "127.0.0.1", "--fault-error-rate", "1", "--fault-error-codes", "503")
    decode = pod("decode", "0")
    async with pd_gateway(tmp_path, [bad, decode], connector="nixl", retry=1) as (gw, client):
        status, _, _ = await post(client, gw, {"model": "pd", "messages": prompt(0, 50)})
        assert status == 503  # the prefill's own 5xx on the last attempt, as for whole requests
        assert len(bad.tap.inference) == 2
        assert not decode.tap.inference  # nothing went to the decode


@pytest.fixture(autouse=True)
def _quiet_gateway_logs(caplog):
    caplog.set_level("WARNING", logger="llmplane.gateway.access")


async def test_sglang_failed_prefill_abandons_the_pair_and_retries(tmp_path, pod):
    bad = pod("prefill", "0", "127.0.0.2", "--fault-error-rate", "1", "--fault-error-codes", "500")
    good = pod("prefill", "0", "127.0.0.3")
    decode = pod("decode", "0", "127.0.0.1", "--time-scale", "1")
    pods = [bad, good, decode]
    async with pd_gateway(tmp_path, pods, engine="SGLang", retry=2) as (gw, client):
        for i in range(20):
            body = {"model": "pd", "messages": prompt(200 + i, 300), "max_tokens": 2}
            status, headers, data = await post(client, gw, body)
            assert status == 200, data
            assert headers[PREFILL_HEADER] == good.address
            if bad.tap.inference:
                break
        assert [c["status"] for c in bad.tap.inference] == [500]
        failed_room = bad.tap.inference[0]["body"]["bootstrap_room"]
        # The decode sent with the failed prefill's room was abandoned, and the retry used a
        # new room with the good prefill's host.
        rooms = [c["body"]["bootstrap_room"] for c in decode.tap.inference]
        assert failed_room in rooms
        retried = decode.tap.inference[-1]["body"]
        assert retried["bootstrap_room"] != failed_room
        assert retried["bootstrap_host"] == "127.0.0.3"
        assert len(decode.tap.inference) == i + 2
