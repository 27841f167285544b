"""What one object may ask of the embedded runtime: replicas up to a ceiling, started a few at
a time.

``replicas: 100000`` was accepted and made ``llmplane up`` fork engines for minutes. The
ceiling belongs to this machine, not to the API: the resource schema (and so the CRDs) has no
upper bound, because on Kubernetes the cluster's quotas and schedulers decide what fits.
Embedded, ``llmplane apply`` and ``up -f`` refuse an object over it (nothing is stored), the
autoscaler never scales past it, and the local runtime never starts more than it for one
workload, whatever reached the store (a store written elsewhere). Defaults are in
docs/security.md ("Replicas").
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from llmplane.api.base import Resource, Violation

ENV = "LLMPLANE_MAX_REPLICAS"
# The smallest engine (the sim) with its share of the control plane: the machine's memory
# divided by this is the most replicas one object may ask for, at least MIN_CEILING.
REPLICA_FOOTPRINT = 64 * 1024 * 1024
MIN_CEILING = 16


class CeilingSettingError(ValueError):
    """``LLMPLANE_MAX_REPLICAS`` is not a whole number of at least 1."""


def machine_ceiling() -> int:
    """Replicas per object this machine's memory could hold of the smallest engine."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return MIN_CEILING
    return max(MIN_CEILING, memory // REPLICA_FOOTPRINT)


def replica_ceiling() -> int:
    """The ceiling in force: ``$LLMPLANE_MAX_REPLICAS``, else :func:`machine_ceiling`."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return machine_ceiling()
    if not text.isascii() or not text.isdigit() or len(text) > 9 or int(text) < 1:
        raise CeilingSettingError(f"{ENV}={text[:40]!r}: must be a whole number of at least 1")
    return int(text)


def _asks(resource: Resource) -> Iterator[tuple[str, int]]:
    """(field path, replicas) for every count of engine processes the object asks for."""
    spec: Any = getattr(resource, "spec", None)
    if resource.kind not in ("Playground", "Service") or spec is None:
        return
    yield "spec.replicas", spec.replicas
    elastic = getattr(spec, "elastic_config", None)
    if elastic is not None:
        yield "spec.elasticConfig.minReplicas", elastic.min_replicas
        if elastic.max_replicas is not None:
            yield "spec.elasticConfig.maxReplicas", elastic.max_replicas


def violations(resources: Iterable[Resource], ceiling: int) -> list[str]:
    """One message per field of ``resources`` asking for more than ``ceiling`` replicas."""
    out = []
    for resource in resources:
        for path, count in _asks(resource):
            if count > ceiling:
                rule = Violation(
                    path,
                    f"{count} is over this machine's limit of {ceiling} replicas per object "
                    f"(embedded runtime; set {ENV} to change it)",
                )
                out.append(f"{resource.ref}: {rule}")
    return out


def check(resources: Iterable[Resource]) -> list[str]:
    """:func:`violations` against the ceiling in force; a bad setting is one message too."""
    try:
        ceiling = replica_ceiling()
    except CeilingSettingError as err:
        return [str(err)]
    return violations(resources, ceiling)


def start_concurrency() -> int:
    """Engines the local runtime starts at once (spawned, not yet Ready): enough to keep the
    cores busy with engine start-ups, few enough that a scale-up of hundreds forks a handful
    at a time and ``up``'s gateway and shutdown stay responsive meanwhile."""
    return max(8, 2 * (os.cpu_count() or 1))
