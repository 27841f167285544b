"""Every object the operator would create for a set of resources (``llmplane render``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llmplane.api.base import Resource
from llmplane.api.inference import BackendRuntime, Playground, Service
from llmplane.api.llmaz import OpenModel
from llmplane.controlplane.planning import PlanningError
from llmplane.runtime.kube.base import (
    KubeOptions,
)
from llmplane.runtime.kube.roles import playground_services
from llmplane.runtime.kube.workload import (
    workload_objects,
)


def objects_for(
    resources: Iterable[Resource],
    backends: Iterable[BackendRuntime] = (),
    options: KubeOptions | None = None,
) -> list[dict[str, Any]]:
    """Every object the operator would create for ``resources`` (Playgrounds and Services).

    ``backends`` are fallbacks (the built-ins) for backends ``resources`` do not define.
    Raises PlanningError naming the resource that cannot be planned.
    """
    resources = list(resources)
    models = {r.name: r for r in resources if isinstance(r, OpenModel)}
    by_backend: dict[str, BackendRuntime] = {b.name: b for b in backends}
    by_backend.update({r.name: r for r in resources if isinstance(r, BackendRuntime)})
    out: list[dict[str, Any]] = []
    for pg in (r for r in resources if isinstance(r, Playground)):
        backend_name = pg.spec.backend_runtime_config.backend_name
        backend = by_backend.get(backend_name)
        if backend is None:
            raise PlanningError(f"{pg.ref}: BackendRuntime {backend_name!r} not found")
        try:
            services, objects = playground_services(pg, models, backend)
            out += objects
            for service in services:
                out += workload_objects(service, models, backend, options)
        except PlanningError as err:
            raise PlanningError(f"{pg.ref}: {err}", err.reason) from None
    for service in (r for r in resources if isinstance(r, Service)):
        labels = service.metadata.labels or {}
        backend = by_backend.get(labels.get("inference.llmaz.io/backend-name", ""))
        try:
            out += workload_objects(service, models, backend, options)
        except PlanningError as err:
            raise PlanningError(f"{service.ref}: {err}", err.reason) from None
    return out
