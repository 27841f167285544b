"""Accelerator placement for local replicas (llmplane/runtime/placement.py)."""

from __future__ import annotations

import asyncio

import pytest

from llmplane.runtime.placement import (
    NO_DEVICES,
    DevicePool,
    FlavorOption,
    Placement,
    parse_device_list,
)
from llmplane.testing import eventually

GPU = "nvidia.com/gpu"
TWO_THEN_ONE = [FlavorOption("a100x2", {GPU: 2}), FlavorOption("t4", {GPU: "1"})]


def test_replicas_get_distinct_devices_trying_flavors_in_order() -> None:
    pool = DevicePool({GPU: ["0", "1", "2"]})
    first = pool.place(TWO_THEN_ONE)
    second = pool.place(TWO_THEN_ONE)
    assert first == Placement("a100x2", {GPU: ("0", "1")})
    assert second == Placement("t4", {GPU: ("2",)})
    assert first.env() == {"CUDA_VISIBLE_DEVICES": "0,1"}
    third = pool.place(TWO_THEN_ONE)
    assert third == (
        "flavor a100x2 needs 2 nvidia.com/gpu (0 of 3 free); "
        "flavor t4 needs 1 nvidia.com/gpu (0 of 3 free)"
    )
    pool.release(first)
    assert pool.free[GPU] == ["0", "1"]
    assert pool.place(TWO_THEN_ONE) == Placement("a100x2", {GPU: ("0", "1")})


def test_no_gpu_request_or_no_known_devices_places_nothing() -> None:
    pool = DevicePool({GPU: ["0"]})
    assert pool.place([FlavorOption(None, {"cpu": 4, "memory": "8Gi"})]) == Placement(None, {})
    assert pool.free[GPU] == ["0"]
    assert DevicePool({GPU: []}).place(TWO_THEN_ONE) is NO_DEVICES  # this machine


def test_other_vendors_get_their_variables() -> None:
    pool = DevicePool({"amd.com/gpu": ["0", "1"]})
    placement = pool.place([FlavorOption("mi300", {"amd.com/gpu": 1})])
    assert isinstance(placement, Placement)
    assert placement.env() == {"HIP_VISIBLE_DEVICES": "0", "ROCR_VISIBLE_DEVICES": "0"}
    # A flavor asking for a vendor the host does not have cannot be placed.
    assert "needs 1 nvidia.com/gpu (0 of 0 free)" in str(pool.place([FlavorOption("t4", {GPU: 1})]))


async def test_a_waiting_replica_is_woken_when_devices_are_released() -> None:
    pool = DevicePool({GPU: ["0"]})
    held = pool.place([FlavorOption(None, {GPU: 1})])
    waiter = asyncio.ensure_future(pool.wait_released())
    # The waiter is waiting once the pool has the event it waits on.
    await eventually(lambda: pool._released is not None, what="the waiter waiting")
    assert not waiter.done()
    pool.release(held)  # type: ignore[arg-type]
    await asyncio.wait_for(waiter, 1)


@pytest.mark.parametrize("text", ["", "0,,1", "0,0", "0;rm -rf /"])
def test_bad_device_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--gpus"):
        parse_device_list(text)


def test_device_lists() -> None:
    assert parse_device_list("0,1, 3") == ["0", "1", "3"]
    uuid = "GPU-5fa3c1e2-8b1d-4c2e-9f00-0123456789ab"
    assert parse_device_list(uuid) == [uuid]
