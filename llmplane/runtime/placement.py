"""Accelerators on this machine, handed to local replicas as distinct devices.

``llmplane up`` learns the host's GPUs from ``--gpus 0,1,...`` or from ``nvidia-smi``. A replica
asks for the count its flavor's limits name (``nvidia.com/gpu: 2``); flavors are tried in their
priority order and the first one whose devices are free wins. The replica's engine then sees only
its devices (``CUDA_VISIBLE_DEVICES=2,3``, and the analogous variable for other vendors). A
replica that no flavor fits waits ``Pending`` with a reason until devices are released, instead
of sharing a GPU with another replica.

A host with no accelerators known places nothing: requests for GPUs are not enforced there (the
CPU engines and the simulator run as before).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

NVIDIA_GPU = "nvidia.com/gpu"
# The variable(s) that restrict an engine to its devices, per extended resource name.
VISIBLE_DEVICES: dict[str, tuple[str, ...]] = {
    NVIDIA_GPU: ("CUDA_VISIBLE_DEVICES",),
    "amd.com/gpu": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
    "habana.ai/gaudi": ("HABANA_VISIBLE_DEVICES",),
    "huawei.com/Ascend910": ("ASCEND_RT_VISIBLE_DEVICES",),
}
UNSCHEDULABLE = "Unschedulable"  # the replica's reason while no flavor fits


def detect_nvidia_gpus(timeout: float = 10.0) -> list[str]:
    """GPU indexes ``nvidia-smi`` lists; none when it is absent or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as err:
        log.warning("nvidia-smi failed (%s): no GPUs are placed", err)
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def parse_device_list(text: str) -> list[str]:
    """``--gpus 0,1,3`` (or UUIDs); a clear ValueError for a malformed list."""
    ids = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not i for i in ids):
        raise ValueError(f"--gpus {text!r}: expected a comma-separated list such as 0,1,2,3")
    if len(set(ids)) != len(ids):
        raise ValueError(f"--gpus {text!r}: a device is listed twice")
    if any(not (i.isalnum() or set(i) <= set("0123456789abcdefABCDEF-GPUgpu")) for i in ids):
        raise ValueError(f"--gpus {text!r}: device ids are indexes or GPU UUIDs")
    return ids


@dataclass(frozen=True)
class FlavorOption:
    """One way to run a replica: a flavor's name (None without flavors) and its limits."""

    name: str | None
    limits: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Placement:
    flavor: str | None
    devices: Mapping[str, tuple[str, ...]]  # resource name -> device ids

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for resource, ids in self.devices.items():
            for var in VISIBLE_DEVICES.get(resource, ()):
                out[var] = ",".join(ids)
        return out


NO_DEVICES = Placement(None, {})


def _count(value: Any) -> int:
    try:
        return max(int(str(value)), 0)
    except ValueError:
        return 0


class DevicePool:
    """The host's devices per resource name, and which are taken."""

    def __init__(self, devices: Mapping[str, Sequence[str]] | None = None) -> None:
        self.total = {r: list(ids) for r, ids in (devices or {}).items() if ids}
        self.free = {r: list(ids) for r, ids in self.total.items()}
        self._released: asyncio.Event | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.total)

    def place(self, options: Sequence[FlavorOption]) -> Placement | str:
        """Devices for the first option that fits, or why none does."""
        if not self.enabled:
            return NO_DEVICES
        reasons = []
        for option in options or [FlavorOption(None)]:
            wanted = {
                r: n
                for r, v in option.limits.items()
                if (r in VISIBLE_DEVICES or r in self.total) and (n := _count(v)) > 0
            }
            short = [
                f"{n} {r} ({len(self.free.get(r, []))} of {len(self.total.get(r, []))} free)"
                for r, n in wanted.items()
                if len(self.free.get(r, [])) < n
            ]
            if not short:
                devices = {}
                for r, n in wanted.items():
                    devices[r] = tuple(self.free[r][:n])
                    del self.free[r][:n]
                return Placement(option.name, devices)
            label = f"flavor {option.name}" if option.name else "the replica"
            reasons.append(f"{label} needs {', '.join(short)}")
        return "; ".join(reasons)

    async def wait_released(self) -> None:
        """Until devices are released (then placing again may succeed)."""
        if self._released is None:
            self._released = asyncio.Event()
        await self._released.wait()

    def release(self, placement: Placement | None) -> None:
        if placement is None or not placement.devices:
            return
        if self._released is not None:
            self._released.set()
            self._released = None
        for resource, ids in placement.devices.items():
            free = self.free.setdefault(resource, [])
            free.extend(i for i in ids if i not in free)
            order = self.total.get(resource, [])
            free.sort(key=lambda i: order.index(i) if i in order else len(order))
