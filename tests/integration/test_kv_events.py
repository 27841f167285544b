"""KV-cache events end to end: real sims publish them over ZMQ, the gateway's subscriber
builds its index from them, and the gateway routes by it.

Each test starts sims (real processes) with vLLM's ``--kv-events-config`` and compares what
the gateway's index holds with what the sim's prefix cache holds (``/admin/kv-cache``), or
looks at where requests went (the sims' own counters)."""

from __future__ import annotations

import asyncio
import signal
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgpack
import orjson
import pytest
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry, generate_latest

from llmplane.gateway.discovery.store_endpoints import endpoint_object
from llmplane.gateway.kvcache.events import EventLimits
from llmplane.gateway.kvcache.index import block_keys
from llmplane.gateway.kvcache.subscriber import KVEventSubscriber
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.scheduler.framework import SchedulingContext
from llmplane.gateway.scheduler.precise_prefix import SimTokens
from llmplane.runtime.endpoint import Endpoint
from llmplane.sim.kvcache import chain_hashes
from llmplane.sim.tokenizer import tokenize
from llmplane.testing import Processes, wait_for
from llmplane.testing.fleets import sim_fleet
from llmplane.testing.process import sim_process
from llmplane.testing.wait import eventually
from tests.integration.kv_sims import (
    BLOCK,
    VOCAB,
    complete,
    events_flags,
    indexed,
    sim_cache,
    start_sim,
)
from tests.integration.upcli import http


@pytest.fixture
async def subscriber() -> AsyncIterator[KVEventSubscriber]:
    sub = KVEventSubscriber()
    try:
        yield sub
    finally:
        await sub.close()


def prompts(n: int, words: int = 40) -> list[str]:
    """``n`` prompts, pairs of which share their first half (a shared prefix)."""
    out = []
    for i in range(n):
        head = " ".join(f"head{i // 2}w{j}" for j in range(words // 2))
        tail = " ".join(f"tail{i}w{j}" for j in range(words // 2))
        out.append(f"{head} {tail}")
    return out


def sim_held(cache: set[int], prompt: str) -> int:
    """Leading blocks of ``prompt`` in the sim's cache, by the sim's own hashes."""
    count = 0
    for h in chain_hashes(tokenize(prompt, VOCAB), BLOCK):
        if h not in cache:
            break
        count += 1
    return count


@pytest.mark.parametrize("wire", ["map", "positional"])
async def test_index_matches_the_sims_cache_through_evictions(
    processes: Processes,
    subscriber: KVEventSubscriber,
    client: aiohttp.ClientSession,
    sockets: Path,
    wire: str,
) -> None:
    flags, events, replay = events_flags(sockets, "a")
    sim = start_sim(processes, [*flags, "--kv-events-wire", wire])
    texts = prompts(12)
    # Requests before the gateway subscribes: it learns them from the replay buffer.
    for text in texts[:3]:
        await complete(client, sim.address, text)
    subscriber.sync(
        [Endpoint(sim.address, model_name="m", kv_events=events, kv_events_replay=replay)]
    )
    for text in texts[3:] + texts[:4]:  # 48 blocks hold about 3 prompts: evictions
        await complete(client, sim.address, text)
    cache = await sim_cache(client, sim.address)
    await eventually(
        lambda: indexed(subscriber, sim.address) == cache,
        what="the index holds exactly the sim's cached blocks",
    )
    feed = subscriber.feeds[sim.address]
    assert feed.batches > 10 and not feed.dropped and feed.gaps_lost == 0
    # Our keys, from token ids alone, find what the sim holds, prompt by prompt.
    for text in texts:
        keys = block_keys(tokenize(text, VOCAB), BLOCK)
        held = subscriber.index.matches("m", BLOCK, keys).get(sim.address, 0)
        assert held == sim_held(cache, text), text[:20]
    assert any(sim_held(cache, t) for t in texts) and not all(sim_held(cache, t) for t in texts)


async def test_a_gap_is_replayed_and_without_replay_the_replica_is_forgotten(
    processes: Processes,
    subscriber: KVEventSubscriber,
    client: aiohttp.ClientSession,
    sockets: Path,
) -> None:
    flags, events, replay = events_flags(sockets, "a")
    flags_b, events_b, _ = events_flags(sockets, "b", replay=False)
    a = start_sim(processes, flags, blocks=400)
    b = start_sim(processes, flags_b, blocks=400)
    subscriber.sync(
        [
            Endpoint(a.address, model_name="m", kv_events=events, kv_events_replay=replay),
            Endpoint(b.address, model_name="m", kv_events=events_b),
        ]
    )
    texts = prompts(6)
    for sim in (a, b):
        await complete(client, sim.address, texts[0])
        await eventually(lambda s=sim: indexed(subscriber, s.address), what="first blocks")
        # The next two batches are numbered and buffered but never sent: a gap.
        async with client.post(
            f"http://{sim.address}/admin/faults", json={"kv_events_drop": 2}
        ) as r:
            assert r.status == 200
        for text in texts[1:4]:
            await complete(client, sim.address, text)
    cache_a = await sim_cache(client, a.address)
    await eventually(lambda: indexed(subscriber, a.address) == cache_a, what="gap replayed")
    assert subscriber.feeds[a.address].gaps_replayed == 1
    # Without a replay endpoint the replica's blocks are forgotten, then relearnt.
    await eventually(lambda: subscriber.feeds[b.address].gaps_lost == 1, what="gap lost")
    cache_b = await sim_cache(client, b.address)
    assert indexed(subscriber, b.address) < cache_b  # fewer, never blocks it does not hold
    await complete(client, b.address, texts[4])
    keys = block_keys(tokenize(texts[4], VOCAB), BLOCK)
    await eventually(
        lambda: subscriber.index.matches("m", BLOCK, keys).get(b.address) == len(keys),
        what="new blocks learnt after the lost gap",
    )


async def test_a_restarted_sim_is_forgotten_within_a_second(
    processes: Processes,
    subscriber: KVEventSubscriber,
    client: aiohttp.ClientSession,
    sockets: Path,
) -> None:
    flags, events, replay = events_flags(sockets, "a")
    sim = start_sim(processes, flags)
    endpoint = Endpoint(sim.address, model_name="m", kv_events=events, kv_events_replay=replay)
    subscriber.sync([endpoint])
    await complete(client, sim.address, prompts(1)[0])
    await eventually(lambda: subscriber.index.held(sim.address) > 0, what="blocks indexed")
    sim.stop(signal.SIGKILL)
    killed = time.monotonic()
    await eventually(
        lambda: subscriber.index.held(sim.address) == 0, timeout=1.0, what="blocks forgotten"
    )
    assert time.monotonic() - killed < 1.0
    assert subscriber.feeds[sim.address].resets == 1
    # The new process on the same sockets is followed from its first batch.
    again = processes.start(sim_process("m", "--time-scale", "0", "--block-size", str(BLOCK),
                                        "--num-blocks", "48", *flags))[0]  # fmt: skip
    await complete(client, again.address, prompts(2)[1])
    cache = await sim_cache(client, again.address)
    await eventually(lambda: indexed(subscriber, sim.address) == cache, what="relearnt")
    subscriber.sync([])  # the replica leaves discovery: it leaves the index
    assert sim.address not in subscriber.index.replicas and not subscriber.feeds
    assert subscriber.index.sizes["m"] == 0


async def test_hostile_publishers_cost_a_counter_not_the_index(
    subscriber: KVEventSubscriber, sockets: Path
) -> None:
    """A publisher that is not an engine (a raw ZMQ socket here, sending what no engine would)."""
    subscriber.limits = EventLimits(message_bytes=64 * 1024, events=100, hashes=64)
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    address = f"ipc://{sockets}/evil.sock"
    pub.bind(address)
    try:
        subscriber.sync([Endpoint("evil:1", model_name="m", kv_events=address)])
        good = msgpack.packb([time.time(), [{"type": "BlockStored", "block_hashes": [1],
                              "parent_block_hash": None, "token_ids": list(range(4)),
                              "block_size": 4}]])  # fmt: skip
        seq = 0

        async def send(*frames: bytes) -> None:
            await pub.send_multipart(frames)

        async def connected() -> bool:
            nonlocal seq
            await send(b"kv", seq.to_bytes(8, "big"), good)
            seq += 1
            return subscriber.index.held("evil:1") == 1

        await eventually(connected, every=0.05, what="the subscription is up")
        feed = subscriber.feeds["evil:1"]
        hostile = [
            (b"kv", b"\x00" * 3, good),  # a sequence number that is not 8 bytes
            (b"kv",),  # one frame
            (b"kv", b"\x00" * 8, good, good),  # four frames
        ]
        for frames in hostile:
            await send(*frames)
        for payload in (
            b"\x00" * (64 * 1024 + 1),  # over the size limit
            b"\x91" * 10_000,  # nested arrays, truncated
            b"\xdd\xff\xff\xff\xff",  # an array claiming 4G elements
            msgpack.packb([0.0, [{"type": "AllBlocksCleared"}] * 101]),  # too many events
            msgpack.packb({"ts": "x", "events": []}),
        ):
            await send(b"kv", seq.to_bytes(8, "big"), payload)
            seq += 1
        await send(b"kv", seq.to_bytes(8, "big"), msgpack.packb([0.0, [
            {"type": "BlockStored", "block_hashes": list(range(65)), "parent_block_hash": None,
             "token_ids": [0] * 260, "block_size": 4},  # more hashes than allowed
            {"type": "BlockRemoved", "block_hashes": [[1, 2]]},  # not a hash
        ]]))  # fmt: skip
        seq += 1
        await eventually(
            lambda: sum(feed.dropped.values()) == 10,
            what=f"every hostile message counted (so far {dict(feed.dropped)})",
        )
        assert feed.dropped == {
            "frames": 3, "oversized": 1, "malformed": 3, "too_many_events": 1, "event": 2,
        }  # fmt: skip
        assert subscriber.index.held("evil:1") == 1
        # Over twice the limit ZMQ cuts the peer as the bytes arrive: that forgets its blocks.
        await send(b"kv", seq.to_bytes(8, "big"), b"\x00" * (256 * 1024))
        await eventually(lambda: subscriber.index.held("evil:1") == 0, what="cut")
        registry = CollectorRegistry()
        registry.register(subscriber)  # type: ignore[arg-type]
        text = generate_latest(registry).decode()
        assert (
            'llmplane_gateway_kv_events_dropped_total{endpoint="evil:1",reason="frames"} 3.0'
            in text
        )
    finally:
        pub.close(0)
        ctx.term()


async def test_the_gateway_routes_a_prompt_to_the_replica_that_holds_it(
    processes: Processes, store, gateways, client: aiohttp.ClientSession, sockets: Path
) -> None:
    """Prompts warmed directly on one sim (the gateway never saw them: only the events tell)
    go to that sim through the gateway."""
    sims = []
    for i, name in enumerate(("a", "b")):
        flags, events, replay = events_flags(sockets, name)
        sim = start_sim(processes, flags, blocks=2000)
        store.apply(endpoint_object(f"s{i}", sim.address, "m", engine="sim", kv_events=events,
                                    kv_events_replay=replay))  # fmt: skip
        sims.append(sim)
    gateway = await gateways(store)
    texts = prompts(8, words=200)
    for i, text in enumerate(texts):
        await complete(client, sims[i % 2].address, text)
    await eventually(
        lambda: all(gateway.kv.subscriber.index.held(s.address) > 0 for s in sims),
        what="both sims' blocks indexed",
    )

    async def seen(sim) -> int:
        async with client.get(f"http://{sim.address}/admin/faults") as r:
            return (await r.json())["requests_seen"]

    for i, text in enumerate(texts):
        before = [await seen(s) for s in sims]
        await complete(client, f"127.0.0.1:{gateway.port}", text)
        after = [await seen(s) for s in sims]
        assert after[i % 2] == before[i % 2] + 1, f"prompt {i} did not go to sim {i % 2}"
    async with client.get(f"http://127.0.0.1:{gateway.port}/metrics") as r:
        metrics = await r.text()
    for sim in sims:
        line = f'llmplane_gateway_endpoint_kv_blocks{{endpoint="{sim.address}"}}'
        assert line in metrics and f"{line} 0.0" not in metrics


def test_up_turns_events_on_for_its_sims_and_the_gateway_indexes_them(
    tmp_path: Path, processes: Processes
) -> None:
    """The local runtime gives each sim (as each vLLM) an ipc events socket in its state
    directory and the endpoint its address: the built-in gateway indexes what the sim caches."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(sim_fleet("tiny", 2))
    state = tmp_path / "state"
    up = processes.up(state, str(fleet))
    base = f"http://{up.address}"
    prompt = " ".join(f"word{i}" for i in range(300))
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2}
    wait_for(lambda: len(up.engine_pids()) == 2, 60, what="two engines")
    wait_for(lambda: http(f"{base}/v1/completions", body)[0] == 200, 60, what="served")
    argvs = orjson.loads((state / "runtime" / "processes.json").read_bytes())["processes"]
    assert all("--kv-events-config" in r["argv"] for r in argvs)

    def blocks() -> list[float]:
        text = urllib.request.urlopen(f"{base}/metrics").read().decode()
        return [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("llmplane_gateway_endpoint_kv_blocks{")
        ]

    full = len(tokenize(prompt, VOCAB)) // BLOCK
    # Both replicas listed; the one that served holds the prompt's blocks, the other none.
    wait_for(lambda: sorted(blocks()) == [0.0, full], 10, what=f"[0, {full}] blocks indexed")

    # The console's fleet page shows them, and the block size: from the events where the
    # replica sent some, else from the engine's vllm:cache_config_info (the scraper's).
    def views() -> list[dict]:
        page = http(f"{base}/console/api/fleet")[2]
        return [r["endpoint"] for w in page["workloads"] for r in w["replicas"] if r["endpoint"]]

    shown = wait_for(
        lambda: (v := views()) and all(e["kvBlockSize"] for e in v) and v,
        10,
        what="both replicas' block sizes on the fleet page",
    )
    assert sorted(e["kvBlocks"] for e in shown) == [0, full], shown
    assert [e["kvBlockSize"] for e in shown] == [BLOCK, BLOCK], shown


async def test_sequence_numbers_starting_again_forget_the_replica(
    subscriber: KVEventSubscriber, sockets: Path
) -> None:
    """A new publisher behind the same address (numbers from 0 again, the connection kept)."""
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    address = f"ipc://{sockets}/pub.sock"
    pub.bind(address)

    def batch(first: int) -> bytes:
        stored = {"type": "BlockStored", "block_hashes": [first], "parent_block_hash": None,
                  "token_ids": [first] * 4, "block_size": 4}  # fmt: skip
        return msgpack.packb([time.time(), [stored]])

    try:
        subscriber.sync([Endpoint("p:1", model_name="m", kv_events=address)])

        async def up() -> bool:
            await pub.send_multipart((b"kv", (0).to_bytes(8, "big"), batch(7)))
            return subscriber.index.held("p:1") == 1

        await eventually(up, every=0.05, what="the subscription is up")
        feed = subscriber.feeds["p:1"]
        for seq in (1, 2):
            await pub.send_multipart((b"kv", seq.to_bytes(8, "big"), batch(10 + seq)))
        await eventually(lambda: subscriber.index.held("p:1") == 3, what="three blocks")
        resets = feed.resets  # (the probes above may have sent 0 twice already)
        await pub.send_multipart((b"kv", (0).to_bytes(8, "big"), batch(99)))
        await eventually(
            lambda: set(subscriber.index.replicas["p:1"].blocks) == {99},
            what="only the new publisher's block",
        )
        assert feed.resets == resets + 1
    finally:
        pub.close(0)
        ctx.term()


async def test_the_sims_token_ids_are_what_the_sim_computes(
    processes: Processes, client: aiohttp.ClientSession
) -> None:
    """The scorer keys a request by the token ids the sim itself computes (its /tokenize)."""
    sim = processes.sim("m", "--time-scale", "0")
    chat = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "héllo wörld " * 20}]}]}  # fmt: skip
    for path, body in (
        ("/v1/chat/completions", chat),
        ("/v1/chat/completions", {**chat, "add_generation_prompt": False}),
        ("/v1/completions", {"model": "m", "prompt": "once upon a time " * 30}),
    ):
        request = InferenceRequest(path, {}, orjson.dumps(body))
        ctx = SchedulingContext("m", request=request)
        ours = SimTokens().token_ids(ctx, "sim")
        asked = {k: v for k, v in body.items() if k != "model"} | {"model": "m"}
        async with client.post(f"http://{sim.address}/tokenize", json=asked) as r:
            assert ours == (await r.json())["tokens"], path
        assert SimTokens().token_ids(ctx, "vllm") is None


async def test_closing_while_replicas_keep_appearing_returns_and_starts_no_feed(
    processes: Processes, sockets: Path
) -> None:
    """``up`` closes the gateway while its runtime still starts replicas: endpoints that appear
    after ``close`` began get no feed, and ``close`` returns (a feed started then kept a socket
    open, and the context's ``term`` blocked the event loop, so SIGTERM never finished)."""
    flags_a, events_a, replay_a = events_flags(sockets, "a")
    flags_b, events_b, replay_b = events_flags(sockets, "b")
    a = start_sim(processes, flags_a)
    b = start_sim(processes, flags_b)
    first = Endpoint(a.address, model_name="m", kv_events=events_a, kv_events_replay=replay_a)
    late = Endpoint(b.address, model_name="m", kv_events=events_b, kv_events_replay=replay_b)
    subscriber = KVEventSubscriber()
    subscriber.sync([first])
    closing = asyncio.ensure_future(subscriber.close())
    await eventually(lambda: not subscriber.feeds, what="close() has taken the feeds")
    subscriber.sync([first, late])  # a replica turned Ready while the gateway closes
    await asyncio.wait_for(closing, 10)
    assert subscriber.feeds == {}
