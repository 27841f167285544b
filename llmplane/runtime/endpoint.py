"""``Endpoint``: one ready model-server replica, as a runtime reports it and the gateway routes to it.

The one type shared by the runtimes (``Runtime.endpoints()`` returns it) and the gateway's
discovery sources (embedded runtime, Kubernetes pods, store-registered servers). It lives here,
a leaf that imports nothing from llmplane but the label names of ``controlplane.plan`` (a pure
module), because the runtime produces it and the gateway only consumes it: the gateway may
depend on the runtime's output type, never the other way round.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmplane.controlplane.plan import MODEL_NAME_LABEL


@dataclass
class Endpoint:
    """One ready model-server replica.

    ``address`` is ``host:port`` (or a bare host that takes its port from the route).
    ``labels`` are pod-like labels (``llmaz.io/model-name`` ...) that ModelServer and
    InferencePool selectors match. ``model_name`` is the name the server serves (its
    ``--served-model-name``). ``fixed_port`` marks endpoints whose port is their own (the
    embedded runtime gives every process its own port), so ``workloadPort`` and
    ``targetPortNumber``, which name a pod's container port in Kubernetes, do not replace it.
    ``workload`` (``namespace/name`` of the plan) and ``replica`` (its index) are set by the
    runtime that runs the replica; other sources leave them empty. ``max_num_seqs`` is the
    engine's configured concurrency when the source knows it (0: unknown): the gateway's
    queue estimate starts from it instead of learning it (``gateway/registry.scraped_room``).
    ``priority_scheduling``: the engine orders its waiting queue by each request's
    ``priority`` (vLLM's ``--scheduling-policy priority``); only then does the gateway send
    one (``gateway/flowcontrol/priority.py``). ``model_path``: the directory of the model's
    files when the gateway can read them (the embedded runtime's model cache), from which it
    tokenizes requests as the engine does (``gateway/tokenization``); empty otherwise.
    ``kv_events``: the ZMQ address the engine publishes its KV-cache events on
    (``tcp://host:port`` or ``ipc:///path``; empty: it does not) and ``kv_events_replay``
    its replay endpoint (empty: none); the gateway subscribes (``gateway/kvcache``).
    """

    address: str
    labels: dict[str, str] = field(default_factory=dict)
    model_name: str = ""
    backend: str = ""
    namespace: str = "default"
    engine: str = "vllm"
    fixed_port: bool = False
    workload: str = ""
    replica: int = 0
    max_num_seqs: int = 0
    priority_scheduling: bool = False
    model_path: str = ""
    kv_events: str = ""
    kv_events_replay: str = ""

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0] or self.address

    def with_port(self, port: int | None) -> str:
        """The address to send inference to when a route names a port (a ModelServer's
        ``workloadPort``, an InferencePool's ``targetPortNumber``): it replaces the port unless
        the endpoint's port is its own; an address without a port takes it (8080 if none)."""
        host, sep, own = self.address.rpartition(":")
        if not sep or not own.isdigit():
            return f"{self.address}:{port or 8080}"
        if port is None or self.fixed_port:
            return self.address
        return f"{host}:{port}"

    def served_names(self) -> set[str]:
        """Names a client may send that this endpoint serves without any route."""
        names = {self.model_name} if self.model_name else set()
        claimed = self.labels.get(MODEL_NAME_LABEL)
        if claimed:
            names.add(claimed)
        return names


# What an engine may name as its KV events address: a TCP host:port or a local socket path.
_EVENTS_ADDRESS = re.compile(
    r"^(tcp://[A-Za-z0-9.\-\[\]:]{1,260}:\d{1,5}|ipc:///[\x21-\x7e]{1,200})$"
)


def valid_events_address(address: str) -> bool:
    """Whether ``address`` is a ZMQ address the gateway subscribes to (tcp:// or ipc://)."""
    return bool(_EVENTS_ADDRESS.match(address))


KV_EVENTS_FLAG = "--kv-events-config"  # vLLM's (the sim's too)


def _bound_at(endpoint: object, host: str) -> str:
    """Where a subscriber on ``host``'s network reaches a publisher endpoint the engine
    binds (vLLM binds ``ipc://`` and ``*`` endpoints, connects out to any other)."""
    if not isinstance(endpoint, str):
        return ""
    if endpoint.startswith("ipc://"):
        return endpoint if host in ("127.0.0.1", "localhost") else ""
    if endpoint.startswith("tcp://*:"):
        return f"tcp://{host}:{endpoint.removeprefix('tcp://*:')}"
    return ""


def kv_events_addresses(argv: list[str], host: str) -> tuple[str, str] | None:
    """(events, replay) addresses a gateway reaches for an engine started with ``argv`` on
    ``host``, from its ``--kv-events-config`` (the last one wins); None when it has none,
    ("", "") when it turns events off or publishes where the gateway cannot subscribe."""
    values = _flag_values(argv, KV_EVENTS_FLAG)
    if not values:
        return None
    try:
        config = json.loads(values[-1])
    except ValueError:
        return "", ""
    if not isinstance(config, dict) or config.get("enable_kv_cache_events") is not True:
        return "", ""
    if config.get("publisher") != "zmq":
        return "", ""
    events = _bound_at(config.get("endpoint", "tcp://*:5557"), host)
    return events, _bound_at(config.get("replay_endpoint"), host) if events else ""


# Engine flags that set how many requests run at once: vLLM and the sim, SGLang.
CONCURRENCY_FLAGS = ("--max-num-seqs", "--max-running-requests")
MAX_CONCURRENCY = 1 << 20


def max_num_seqs(argv: list[str]) -> int:
    """The concurrency an engine command line sets (the last such flag wins, as in argparse),
    0 when it sets none or a value that is not a positive integer (the engine's default is
    unknown here; the gateway learns it)."""
    found = 0
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name not in CONCURRENCY_FLAGS:
            continue
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        found = (
            int(value)
            if value.isascii()
            and value.isdigit()
            and len(value) <= 7
            and 0 < int(value) <= MAX_CONCURRENCY
            else 0
        )
    return found


def _flag_values(argv: list[str], flag: str) -> list[str]:
    """Every value ``argv`` gives ``flag`` (``--flag value`` or ``--flag=value``), in order."""
    values = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name == flag:
            values.append(value if eq else argv[i + 1] if i + 1 < len(argv) else "")
    return values


def priority_scheduling(argv: list[str]) -> bool:
    """Whether an engine command line sets vLLM's ``--scheduling-policy priority`` (the last
    such flag wins, as in argparse)."""
    values = _flag_values(argv, "--scheduling-policy")
    return bool(values) and values[-1] == "priority"


def _pod_argvs(pod: Mapping[str, Any]) -> list[list[str]]:
    """Each container's command line (command + args); anything not a list of strings counts
    as not there."""
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    return [
        [
            arg
            for key in ("command", "args")
            if isinstance(part := container.get(key), list)
            for arg in part
            if isinstance(arg, str)
        ]
        for container in (containers if isinstance(containers, list) else ())
        if isinstance(container, Mapping)
    ]


def pod_max_num_seqs(pod: Mapping[str, Any]) -> int:
    """``max_num_seqs`` of the first container of a pod whose command line sets it (0: none
    does)."""
    for argv in _pod_argvs(pod):
        if found := max_num_seqs(argv):
            return found
    return 0


def pod_kv_events(pod: Mapping[str, Any], host: str) -> tuple[str, str]:
    """(events, replay) of the first container of a pod (at ``host``, its IP) that sets
    ``--kv-events-config`` to a ``tcp://*:PORT`` endpoint; ("", "") when none does."""
    for argv in _pod_argvs(pod):
        found = kv_events_addresses(argv, host)
        if found is not None:
            return found
    return "", ""


def pod_priority_scheduling(pod: Mapping[str, Any]) -> bool:
    """Whether the first container of a pod that sets ``--scheduling-policy`` sets
    ``priority``."""
    for argv in _pod_argvs(pod):
        if _flag_values(argv, "--scheduling-policy"):
            return priority_scheduling(argv)
    return False
