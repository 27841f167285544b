"""The workers' shared-state pieces in one process (the multi-process behaviour is
tests/integration/test_gateway_workers.py): prefix picks published by one worker reach the
other's index, also across the ring's wrap and after an overrun; /metrics texts merge; in-flight
and first-chunk counts are every worker's sum; scraped signals published by the scraping worker
reach a follower's states (a torn row never), idle rows are not republished but take the
scraper's heartbeat, and model lists read by the scraping worker reach the others."""

from __future__ import annotations

import asyncio
import logging
import os
import time

from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scheduler.config import PluginHandle, build_scheduler
from llmplane.gateway.scheduler.prefix import PrefixCacheScorer, block_hashes
from llmplane.gateway.scraper import (
    MAX_NAME_CHARS,
    MAX_SERVED_NAMES,
    MODELS_CHANGED_AT,
    LoadMetrics,
    apply_metrics,
    served_names,
)
from llmplane.gateway.workers import scrapes
from llmplane.gateway.workers.board import BoardDiscovery, EndpointBoard
from llmplane.gateway.workers.inflight import InflightTable
from llmplane.gateway.workers.metrics import merge
from llmplane.gateway.workers.picks import PickRings
from llmplane.gateway.workers.scrapes import (
    TEXT_BYTES,
    ScrapeFollower,
    ScrapePublisher,
    ScrapeTable,
    apply_row,
    encode_row,
)
from llmplane.gateway.workers.shm import Directory, Locks
from llmplane.gateway.workers.wake import WakeTable
from llmplane.runtime.endpoint import Endpoint


def scorers(rings: PickRings) -> list[PrefixCacheScorer]:
    return [PrefixCacheScorer(feed=rings.feed(i)) for i in range(rings.workers)]


def test_picks_reach_the_peer_index():
    rings = PickRings(2)
    a, b = scorers(rings)
    hashes = block_hashes(b"p" * 640, "m")
    a.feed.publish(a.feed_id, "10.0.0.1:8000", hashes)
    assert b.index.matches(hashes, ["10.0.0.1:8000"]) == {}
    b.feed.apply()
    assert b.index.matches(hashes, ["10.0.0.1:8000"]) == {"10.0.0.1:8000": 10}
    a.feed.apply()  # its own picks do not come back to it
    assert a.index.matches(hashes, ["10.0.0.1:8000"]) == {}


def test_workers_schedulers_share_picks_scorer_by_scorer():
    """Every worker builds its scheduler from the same config with its own feed: a pick of one
    prefix scorer reaches the same scorer in the other worker, not another one."""
    config = {
        "plugins": [
            {"type": "prefix-cache-scorer", "name": "short", "parameters": {"blockSize": 32}},
            {"type": "prefix-cache-scorer", "name": "long"},
        ]
    }
    rings = PickRings(2)
    a, b = (build_scheduler(config, PluginHandle(picks=rings.feed(i))) for i in range(2))
    hashes = block_hashes(b"p" * 640, "m")
    picked = a.plugins["long"]
    picked.feed.publish(picked.feed_id, "10.0.0.1:8000", hashes)
    b.plugins["short"].feed.apply()  # (one feed per worker, whichever scorer applies it)
    assert b.plugins["long"].index.matches(hashes) == {"10.0.0.1:8000": 10}
    assert b.plugins["short"].index.matches(hashes) == {}


def test_ring_wraps_and_a_reader_that_fell_behind_skips():
    rings = PickRings(2, ring_bytes=4096)
    a, b = scorers(rings)
    for round_ in range(120):  # about 10 KB through a 4 KB ring, read as it goes
        hashes = block_hashes(os.urandom(64 * 8), "m")
        a.feed.publish(0, f"e{round_}", hashes)
        b.feed.apply()
        assert b.index.matches(hashes, [f"e{round_}"]) == {f"e{round_}": 8}
    assert b.feed.lost == 0
    for _ in range(100):  # now without reading: the ring laps the reader
        a.feed.publish(0, "late", block_hashes(os.urandom(64 * 8), "m"))
    b.feed.apply()
    assert b.feed.lost == 1
    fresh = block_hashes(os.urandom(64 * 8), "m")
    a.feed.publish(0, "fresh", fresh)
    b.feed.apply()
    assert b.index.matches(fresh, ["fresh"]) == {"fresh": 8}


def test_directory_rows_are_stable_and_bounded():
    directory = Directory(4, Locks().held(0))
    rows = [directory.row(f"k{i}") for i in range(4)]
    assert sorted(r[0] for r in rows if r) == [0, 1, 2, 3]
    assert all(r is not None and r[1] for r in rows)
    assert directory.row("k2") == (rows[2][0], False)  # type: ignore[index]
    assert directory.row("k4") is None


def test_merge_sums_counters_and_histograms_keeps_shared_gauges():
    one = b"""# HELP llmplane_gateway_requests_total r
# TYPE llmplane_gateway_requests_total counter
llmplane_gateway_requests_total{status="200"} 3.0
# HELP d h
# TYPE d histogram
d_bucket{le="0.1"} 1.0
d_bucket{le="+Inf"} 2.0
d_count 2.0
d_sum 0.5
# HELP llmplane_gateway_endpoint_inflight i
# TYPE llmplane_gateway_endpoint_inflight gauge
llmplane_gateway_endpoint_inflight{endpoint="a"} 5.0
"""
    two = b"""# HELP llmplane_gateway_requests_total r
# TYPE llmplane_gateway_requests_total counter
llmplane_gateway_requests_total{status="200"} 4.0
llmplane_gateway_requests_total{status="429"} 1.0
# HELP d h
# TYPE d histogram
d_bucket{le="0.1"} 0.0
d_bucket{le="+Inf"} 1.0
d_count 1.0
d_sum 0.25
# HELP llmplane_gateway_endpoint_inflight i
# TYPE llmplane_gateway_endpoint_inflight gauge
llmplane_gateway_endpoint_inflight{endpoint="a"} 5.0
"""
    text = merge([one, two]).decode()
    assert 'llmplane_gateway_requests_total{status="200"} 7.0' in text
    assert 'llmplane_gateway_requests_total{status="429"} 1.0' in text
    assert 'd_bucket{le="+Inf"} 3.0' in text
    assert "d_sum 0.75" in text
    assert 'llmplane_gateway_endpoint_inflight{endpoint="a"} 5.0' in text


def test_prefilling_counts_are_every_workers_sum():
    # saturationMaxPrefilling holds across workers: a stream waiting for its first chunk in
    # one worker counts in the other's saturation rule; a reaped worker's count goes with it.
    table = InflightTable(2, 8, Locks())
    endpoint = Endpoint("10.0.0.1:8000")
    a, b = table.state(endpoint, 0), table.state(endpoint, 1)
    a.add_prefilling(1)
    b.add_prefilling(2)
    a.add_inflight(1)
    assert (a.prefilling, b.prefilling, b.inflight) == (3, 3, 1)
    b.add_prefilling(-1)
    assert a.prefilling == 2
    table.clear(0)
    assert (a.prefilling, b.prefilling, a.inflight) == (1, 1, 0)


def test_scrape_rows_reach_followers_and_a_torn_row_is_skipped():
    table = ScrapeTable(8)
    scraped = EndpointState(Endpoint("10.0.0.1:8000", engine="sim"))
    apply_metrics(
        scraped,
        LoadMetrics(
            waiting=3, running=5, kv=0.25, lora_running=frozenset({"a", "b"}), kv_received=384
        ),
        now=123.5,
        inflight_at_start=7,
    )
    follower = EndpointState(Endpoint("10.0.0.1:8000", engine="sim"))
    row = table.row(2)
    assert row.read(0) is None  # never published
    table.write(2, encode_row(scraped))
    seq, data = row.read(0)
    assert row.read(seq) is None  # nothing new since
    apply_row(follower, data)
    assert (follower.waiting, follower.running, follower.kv_usage) == (3, 5, 0.25)
    assert (follower.scraped_at, follower.inflight_at_scrape) == (123.5, 7)
    assert follower.has_kv and follower.has_load_metrics and follower.scrape_ok
    assert follower.lora_running == {"a", "b"} and follower.lora_waiting == frozenset()
    assert follower.kv_received == 384  # KV a decode replica took over its connector
    assert (follower.capacity, follower.room) == (5, 0)  # full at 5: requests wait
    # Idle again: the room the queue estimate subtracts reaches the followers too.
    apply_metrics(
        scraped, LoadMetrics(waiting=0, running=1, kv=0.1), now=124.0, inflight_at_start=1
    )
    table.write(2, encode_row(scraped))
    seq, data = row.read(0)
    apply_row(follower, data)
    assert (follower.capacity, follower.room) == (5, 4)
    assert follower.kv_received == -1  # an engine without a KV connector reports none
    # A writer that died mid-row leaves the sequence odd: readers keep what they had, the
    # next writer steps over it.
    row.words[0] += 1
    assert row.read(seq) is None and row.read(0) is None
    scraped.has_load_metrics, scraped.scrape_ok = None, False
    table.write(2, encode_row(scraped))
    seq2, data = row.read(seq)
    assert seq2 % 2 == 0 and seq2 > seq
    apply_row(follower, data)
    assert follower.has_load_metrics is None and not follower.scrape_ok


def test_a_row_cuts_adapter_names_past_its_room_and_says_so_once(caplog):
    table = ScrapeTable(2)
    scraped = EndpointState(Endpoint("10.0.0.1:8000", engine="vllm"))
    names = frozenset(f"adapter-{i:04d}" for i in range(200))  # 2,600 bytes of names
    waiting = frozenset({"w"})
    apply_metrics(scraped, LoadMetrics(1, 2, 0.5, names, waiting), now=5.0)
    scrapes._log_once.cache_clear()  # said once per process: count from here
    with caplog.at_level(logging.WARNING, "llmplane.gateway"):
        table.write(0, encode_row(scraped))
        table.write(0, encode_row(scraped))
    follower = EndpointState(Endpoint("10.0.0.1:8000", engine="vllm"))
    apply_row(follower, table.row(0).read(0)[1])
    assert (follower.waiting, follower.running, follower.kv_usage) == (1, 2, 0.5)
    assert len(follower.lora_running & names) > 60 and follower.lora_waiting == frozenset()
    assert all(n.startswith("adapter-") for n in follower.lora_running)
    assert [r.message for r in caplog.records] == [f"LoRA adapter names cut to {TEXT_BYTES} bytes"]


def _pair(table: ScrapeTable, changes: list, models: list | None = None):
    inflight = InflightTable(2, 4, Locks())
    endpoint = Endpoint("10.0.0.1:8000", model_name="m", engine="sim", workload="default/m")
    writer, reader = inflight.state(endpoint, 0), inflight.state(endpoint, 1)
    publisher = ScrapePublisher(table, lambda: [writer], 0.1)
    follower = ScrapeFollower(
        table,
        lambda: [reader],
        1.0,
        lambda: changes.append(1),
        on_models_changed=(lambda: models.append(1)) if models is not None else None,
    )
    return writer, reader, publisher, follower


def test_scrape_follower_copies_only_published_changes():
    table = ScrapeTable(4)
    changes: list[int] = []
    writer, reader, publisher, follower = _pair(table, changes)
    start = time.monotonic()
    table.beat(start)
    assert not follower.poll(start)
    writer.waiting = 4
    publisher.publish(writer, False)
    assert follower.poll(start) and reader.waiting == 4 and changes == [1]
    assert not follower.poll(start) and changes == [1]
    # No heartbeat for longer than stale_after (0.2 s): the scraper is gone, the follower's
    # copies count as unreadable metrics (admission's own-count rule), not stale.
    assert not follower.poll(start + 0.1) and reader.scrape_ok
    assert follower.poll(start + 0.5) and not reader.scrape_ok and changes == [1, 1]
    assert not follower.poll(start + 0.6)
    # The scraper beats again (a paused one, or its replacement with nothing new to say):
    # every row is read again and restores its state.
    table.beat(start + 0.65)
    assert follower.poll(start + 0.7) and reader.scrape_ok and reader.waiting == 4


def test_idle_rows_are_not_republished_and_take_the_heartbeat():
    table = ScrapeTable(4)
    changes: list[int] = []
    writer, reader, publisher, follower = _pair(table, changes)
    apply_metrics(writer, LoadMetrics(waiting=0, running=0, kv=0.0), now=100.0)
    table.beat(100.0)
    publisher.publish(writer, True)  # gone idle: worker 0's ticker keeps it fresh
    generation = table.generation()
    assert follower.poll(100.0) and reader.scraped_at == 100.0
    # Idle scrapes with nothing new publish nothing; the heartbeat alone keeps the copy fresh.
    writer.scraped_at = 102.0
    publisher.publish(writer, True)
    assert table.generation() == generation
    publisher.flush(102.05)
    assert not follower.poll(102.1) and reader.scraped_at == 102.05
    # A request sent to it (any worker's, the count is shared): the copy stops aging with the
    # heartbeat, as worker 0's ticker stops refreshing its own and wakes the scraper.
    reader.add_inflight(1)
    publisher.flush(102.15)
    follower.poll(102.2)
    assert reader.scraped_at == 102.05
    # Busy: each scrape is published (its scraped_at matters), changed or not.
    writer.inflight_at_scrape = 1
    writer.running, writer.scraped_at = 1.0, 102.3
    publisher.publish(writer, False)
    publisher.publish(writer, False)
    assert table.generation() == generation + 2
    assert follower.poll(102.3) and reader.running == 1.0 and reader.scraped_at == 102.3
    publisher.flush(102.4)
    follower.poll(102.45)
    assert reader.scraped_at == 102.3  # not kept: the row's own scrape time


def test_a_kept_row_made_fresh_by_the_heartbeat_wakes_the_follower():
    """A request held while the copy was stale may go once the heartbeat makes it fresh: no
    row changes while every client waits in this worker, so nothing else would wake it."""
    table = ScrapeTable(4)
    changes: list[int] = []
    writer, reader, publisher, follower = _pair(table, changes)
    apply_metrics(writer, LoadMetrics(waiting=0, running=0, kv=0.0), now=100.0)
    table.beat(100.0)
    publisher.publish(writer, True)
    assert follower.poll(100.0) and changes == [1]
    assert not follower.poll(100.05) and changes == [1]  # nothing new: no wake-up
    publisher.flush(100.3)  # a heartbeat: the copy (100.0) was past metricsStaleness
    assert not follower.poll(100.32)  # no row changed ...
    assert reader.scraped_at == 100.3 and changes == [1, 1]  # ... but fresh again: woken
    assert not follower.poll(100.35) and changes == [1, 1]


def test_model_lists_reach_followers_once_read():
    table = ScrapeTable(4)
    changes: list[int] = []
    models: list[int] = []
    writer, reader, publisher, follower = _pair(table, changes, models)
    table.beat(10.0)
    writer.served_models = frozenset({"m", "lora-a"})
    publisher.models_read(writer, 9.9)
    assert follower.poll(10.0) is False and reader.served_models is None  # not flushed yet
    publisher.flush(10.0)
    follower.poll(10.01)
    assert reader.served_models == {"m", "lora-a"} and models == [1]
    follower.poll(10.02)
    assert models == [1]  # nothing new: nothing applied
    # This worker loaded an adapter after worker 0's next read began: its own list stays.
    reader.served_models = frozenset({"m", "lora-a", "lora-b"})
    reader.extra[MODELS_CHANGED_AT] = 10.5
    writer.served_models = frozenset({"m"})
    publisher.models_read(writer, 10.4)
    publisher.flush(10.6)
    follower.poll(10.61)
    assert reader.served_models == {"m", "lora-a", "lora-b"}
    writer.served_models = frozenset({"m", "lora-b"})
    publisher.models_read(writer, 10.7)
    publisher.flush(10.8)
    follower.poll(10.81)
    assert reader.served_models == {"m", "lora-b"} and models == [1, 1]
    # The scraper gone for long: the names stay (they change rarely).
    assert follower.poll(20.0) and follower.orphaned
    assert reader.served_models == {"m", "lora-b"}
    # A new state for the address (the same workload): the names are applied at once.
    again = InflightTable(2, 4, Locks()).state(reader.endpoint, 1)
    follower.states = lambda: [again]
    assert follower.follows(again)
    follower.poll(20.0)
    assert again.served_models == {"m", "lora-b"}
    # The address back serving another workload: the old names are not its.
    other = InflightTable(2, 4, Locks()).state(Endpoint("10.0.0.1:8000", model_name="x"), 1)
    follower.states = lambda: [other]
    assert follower.follows(other)
    follower.poll(20.0)
    assert other.served_models is None


def test_served_names_are_capped():
    many = [{"id": f"m{i}"} for i in range(MAX_SERVED_NAMES + 10)]
    assert len(served_names(many)) == MAX_SERVED_NAMES
    long = [{"id": "x" * (MAX_NAME_CHARS + 1)}, {"id": "ok"}, {"no": "id"}, "junk", {"id": 7}]
    assert served_names(long) == {"ok", "7"}
    assert served_names({"id": "m"}) is None


def test_endpoint_board_carries_the_list_and_skips_a_torn_copy():
    board = EndpointBoard(size=4096)
    discovery = BoardDiscovery(board)
    assert discovery.endpoints() == [] and not discovery.poll()
    endpoints = [
        Endpoint("127.0.0.1:9001", {"llmaz.io/model-name": "m"}, "m", workload="default/m"),
        Endpoint("127.0.0.1:9002", engine="sim", fixed_port=True, replica=1),
    ]
    board.publish(endpoints)
    assert discovery.poll() and discovery.endpoints() == endpoints
    assert not discovery.poll()  # nothing new
    board.document.words[0] += 1  # a writer in the middle of it: the last good list stays
    assert not discovery.poll() and discovery.endpoints() == endpoints
    board.publish(endpoints[:1])  # the next writer steps over the odd sequence
    assert discovery.poll() and discovery.endpoints() == endpoints[:1]
    board.publish([Endpoint(f"10.0.0.{i}:1", labels={"x": "y" * 100}) for i in range(100)])
    assert not discovery.poll()  # too big for this board: not published, nothing torn
    assert discovery.endpoints() == endpoints[:1]


async def test_a_peer_completion_wakes_a_worker_with_requests_waiting():
    table = WakeTable(2)
    try:
        a, b = table.waker(0), table.waker(1)
        pumped = asyncio.Event()
        a.start(lambda: None)
        b.start(pumped.set)
        a.wake_peers()  # nothing waits in b: not woken
        assert table.poked[1] == 0
        b.waiting(1)
        a.wake_peers()
        a.wake_peers()  # already woken: no second write
        assert table.poked[1] == 1
        await asyncio.wait_for(pumped.wait(), 5)
        assert b.woken == 1 and table.poked[1] == 0  # read, cleared: the next one wakes it
        pumped.clear()
        a.wake_peers()
        await asyncio.wait_for(pumped.wait(), 5)
        assert b.woken == 2
        b.waiting(-1)
        b.waiting(2)
        table.clear(1)  # b died: its waiting requests with it
        a.wake_peers()
        assert table.waiting[1] == 0 and table.poked[1] == 0
        a.close()
        b.close()
    finally:
        table.close()


def test_a_worker_that_crashes_again_after_a_long_life_waits_again() -> None:
    """Quick deaths double the wait before a restart; a long life restarts at once and
    forgets it, so a crash loop after it starts from 0.1 s again (not from no wait)."""
    from llmplane.gateway.workers.supervisor import MAX_BACKOFF, restart_delay

    backoff: dict[int, float] = {}
    assert [restart_delay(backoff, 0, 0.1) for _ in range(3)] == [0.1, 0.2, 0.4]
    assert restart_delay(backoff, 0, 30.0) == 0.0
    assert [restart_delay(backoff, 0, 0.1) for _ in range(2)] == [0.1, 0.2]
    assert max(restart_delay(backoff, 1, 0.0) for _ in range(20)) == MAX_BACKOFF
    assert restart_delay(backoff, 0, 0.1) == 0.4  # each worker its own
