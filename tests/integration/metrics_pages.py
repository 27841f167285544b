"""A gateway's or an engine's Prometheus /metrics page read over HTTP, one value out of it."""

from __future__ import annotations

import re
import urllib.request


async def scrape(session, address: str) -> str:
    async with session.get(f"http://{address}/metrics") as resp:
        return await resp.text()


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` (or a name it begins) with these labels in ``text``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def engine_metric(address: str, name: str) -> float:
    """Sum of a metric's samples on one vLLM replica's own /metrics."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
    values = [float(v) for v in pattern.findall(text)]
    assert values, f"{name} not in {address}/metrics"
    return sum(values)


def gateway_metric(url: str, name: str) -> dict[str, float]:
    """The gateway's own /metrics: ``name``'s value per endpoint label."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(rf'^{re.escape(name)}{{endpoint="([^"]+)"}} (\S+)$', text, re.M)
    }
