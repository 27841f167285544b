"""Disaggregated Playgrounds on Kubernetes: one inference Service per role, with what each
KV connector needs in the pod (``controlplane/disaggregation.py`` has the engine flags).

- ``sharedStorage``: a hostPath directory per Playground (``/var/lib/llmplane/kv/<ns>/<name>``,
  DirectoryOrCreate) mounted at ``/workspace/kv`` in both roles: prefill and decode pods must
  share a node (or replace the volume with a ReadWriteMany claim);
- ``nixl``: the side-channel port (5600, ``nixl``) and ``VLLM_NIXL_SIDE_CHANNEL_HOST`` = the
  pod IP, so decode pods reach prefill pods directly;
- ``mooncake``, ``lmcache``, ``offloading``: the engine flags only (their stores are
  configured with ``kvConnector.extraConfig`` and envs);
- SGLang: the prefill pods' bootstrap port (8998, ``bootstrap``), where decode pods pull the KV.

Each role Service becomes its own LeaderWorkerSet (or Deployment) and is scaled on its own.
"""

from __future__ import annotations

from typing import Any

from llmplane.api.documents import dump_resource
from llmplane.api.inference import BackendRuntime, Playground, Service
from llmplane.api.llmaz import OpenModel
from llmplane.controlplane.disaggregation import (
    NIXL_SIDE_CHANNEL_PORT,
    engine_family,
    services_for,
)
from llmplane.controlplane.plan import ROLE_LABEL
from llmplane.runtime.kube.base import runner_container
from llmplane.runtime.kube.service import playground_objects, service_for_playground, service_object

KV_MOUNT_PATH = "/workspace/kv"
KV_HOST_ROOT = "/var/lib/llmplane/kv"
KV_VOLUME = "kv-shared"
SGLANG_BOOTSTRAP_PORT = 8998  # SGLang's --disaggregation-bootstrap-port default


def _connector_pod(service: Service, pg: Playground) -> Service:
    dis = pg.spec.disaggregation
    assert dis is not None
    kind = dis.kv_connector.type
    family = engine_family(pg.spec.backend_runtime_config.backend_name)
    if family == "sglang" and (service.metadata.labels or {}).get(ROLE_LABEL) == "prefill":
        kind = "sglang-prefill"  # decode replicas pull the KV from its bootstrap server
    elif family != "vllm":
        return service
    data = dump_resource(service)
    template = data["spec"]["workloadTemplate"]
    for key in ("workerTemplate", "leaderTemplate"):
        pod = template.get(key)
        if pod is None or (key == "workerTemplate" and "leaderTemplate" in template):
            continue  # multi-host: the leader serves and holds the connector
        spec = pod["spec"]
        runner = runner_container(spec)
        if kind == "sharedStorage":
            host = f"{KV_HOST_ROOT}/{pg.namespace or 'default'}/{pg.name}"
            spec.setdefault("volumes", []).append(
                {"name": KV_VOLUME, "hostPath": {"path": host, "type": "DirectoryOrCreate"}}
            )
            runner.setdefault("volumeMounts", []).append(
                {"name": KV_VOLUME, "mountPath": KV_MOUNT_PATH}
            )
        elif kind == "sglang-prefill":
            runner.setdefault("ports", []).append(
                {"name": "bootstrap", "containerPort": SGLANG_BOOTSTRAP_PORT, "protocol": "TCP"}
            )
        elif kind == "nixl":
            runner.setdefault("ports", []).append(
                {"name": "nixl", "containerPort": NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"}
            )
            runner.setdefault("env", []).append(
                {
                    "name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
                    "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                }
            )
    return Service.model_validate(data)


def playground_services(
    pg: Playground, models: dict[str, OpenModel], backend: BackendRuntime
) -> tuple[list[Service], list[dict[str, Any]]]:
    """(the Services, the objects to apply) for one Playground: its own Service (and HPA)
    as ``playground_objects`` gives them, or one Service per role when disaggregated."""
    if pg.spec.disaggregation is None:
        service, objects = playground_objects(pg, models, backend)
        return [service], objects
    services = [
        _connector_pod(s, pg)
        for s in services_for(
            pg, lambda p: service_for_playground(p, models, backend), KV_MOUNT_PATH
        )
    ]
    return services, [service_object(s) for s in services]
