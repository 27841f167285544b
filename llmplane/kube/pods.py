"""Facts about Pods every Kubernetes-facing module reads the same way: ready, and where."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running, with a podIP, Ready, and not terminating."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp") or not status.get("podIP"):
        return False
    if status.get("phase", "Running") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def pod_address(ip: str, port: int) -> str:
    """``ip:port``, with brackets around an IPv6 address."""
    try:
        if ipaddress.ip_address(ip).version == 6:
            return f"[{ip}]:{port}"
    except ValueError:
        pass
    return f"{ip}:{port}"
