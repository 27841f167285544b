"""The activator's queue (gateway/activator.py): FIFO release, bounds by count and bytes, hold
timeout with Retry-After, a cancelled (disconnected) request leaving the queue, metrics."""

from __future__ import annotations

import asyncio

import pytest

from llmplane.gateway.activator import Activator
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.errors import GatewayError
from llmplane.testing import eventually


def activator(**kw: float) -> Activator:
    return Activator(GatewayConfig(**kw))  # type: ignore[arg-type]


async def test_held_requests_are_released_in_arrival_order() -> None:
    woken: list[str] = []
    act = Activator(GatewayConfig(), wake=woken.append)
    order: list[int] = []

    async def request(i: int) -> None:
        await act.hold("m", "default/pg", 10)
        order.append(i)

    tasks = [asyncio.create_task(request(i)) for i in range(5)]
    await eventually(lambda: act.held("m") == 5, every=0.005, what="five held")
    assert woken == ["default/pg"] * 5  # the autoscaler is asked at once, for each
    act.release(lambda model: True)  # still activatable: nothing moves
    waiters = act.queues["m"].flows["m"].waiters
    assert act.held("m") == 5 and not any(w.future.done() for w in waiters)
    assert order == []
    act.release(lambda model: False)  # a replica is ready
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert act.queues == {}
    assert act.metrics.held.labels("m").value == 5
    assert sum(act.metrics.cold_start.labels("m").counts) == 1  # one cold start


async def test_held_by_workload_adds_up_the_models_of_one_workload() -> None:
    """What the autoscaling signals count: held requests per workload, over its models (a
    Playground's model and, say, an InferenceModel routed to it)."""
    act = activator()
    held = [("a", "default/pg"), ("a", "default/pg"), ("b", "default/pg"), ("c", "other/pg")]
    tasks = [asyncio.create_task(act.hold(model, workload, 10)) for model, workload in held]
    await eventually(lambda: sum(map(act.held, "abc")) == 4, every=0.005, what="four held")
    assert act.held_by_workload() == {"default/pg": 3, "other/pg": 1}
    act.release(lambda model: model == "c")  # the replica of default/pg is ready
    await asyncio.gather(*tasks[:3])
    assert act.held_by_workload() == {"other/pg": 1}
    act.release(lambda model: False)
    await asyncio.gather(*tasks)
    assert act.held_by_workload() == {}


async def test_queue_bounded_by_count_and_bytes() -> None:
    act = activator(activator_max_queue=2, activator_max_queue_bytes=100)
    first = [asyncio.create_task(act.hold("m", "default/pg", 40)) for _ in range(2)]
    await eventually(lambda: act.held("m") == 2, every=0.005, what="two held")
    with pytest.raises(GatewayError) as err:
        await act.hold("m", "default/pg", 1)
    assert err.value.status == 503 and "2 requests already wait" in err.value.message
    assert err.value.retry_after == 5.0
    other = asyncio.create_task(act.hold("n", "default/pg2", 60))
    await eventually(lambda: act.held("n") == 1, every=0.005, what="one held for n")
    with pytest.raises(GatewayError) as err:
        await act.hold("n", "default/pg2", 41)  # 60 + 41 > 100 bytes
    assert "60 bytes of requests already wait" in err.value.message
    assert act.metrics.refused.labels("m", "queue_full").value == 1
    act.release(lambda model: False)
    await asyncio.gather(*first, other)


async def test_hold_timeout_is_a_503_with_retry_after() -> None:
    act = activator(activator_hold_timeout=0.05, activator_retry_after=7)
    with pytest.raises(GatewayError) as err:
        await act.hold("m", "default/pg", 1)
    assert err.value.status == 503 and err.value.code == "no_ready_endpoint"
    assert "no replica became ready within 0.05 s" in err.value.message
    assert err.value.response().headers["Retry-After"] == "7"
    assert act.queues == {}  # left the queue
    assert act.metrics.refused.labels("m", "timeout").value == 1


@pytest.mark.parametrize("timeout", [0.3, 0.6])
async def test_the_hold_lasts_the_hold_timeout(timeout: float) -> None:
    """Measured on the loop's clock: not shorter than the setting, and well short of twice
    it (a hold of a fixed or scaled length fails one of the two)."""
    act = activator(activator_hold_timeout=timeout)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(GatewayError):
        await asyncio.wait_for(act.hold("m", "default/pg", 1), 10 * timeout)
    held = loop.time() - start
    assert timeout <= held < 1.6 * timeout, f"held {held:.3f} s for a timeout of {timeout} s"
    assert act.queues == {}


async def test_disabled_hold_answers_at_once() -> None:
    act = activator(activator_hold_timeout=0)
    with pytest.raises(GatewayError) as err:
        await act.hold("m", "default/pg", 1)
    assert "starting or scaled to zero" in err.value.message and act.queues == {}


async def test_a_cancelled_request_leaves_the_queue() -> None:
    act = activator()
    order: list[str] = []

    async def request(name: str) -> None:
        await act.hold("m", "default/pg", 5)
        order.append(name)

    a = asyncio.create_task(request("a"))
    b = asyncio.create_task(request("b"))
    c = asyncio.create_task(request("c"))
    await eventually(lambda: act.held("m") == 3, every=0.005, what="three held")
    b.cancel()  # its client went away
    await eventually(lambda: act.held("m") == 2, every=0.005, what="b dropped")
    assert act.queues["m"].bytes == 10
    act.release(lambda model: False)
    await asyncio.gather(a, c)
    assert order == ["a", "c"]
    assert b.cancelled()
