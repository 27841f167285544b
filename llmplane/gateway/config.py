"""Gateway settings: limits, admission thresholds, scraping, retries, ejection, scheduling.

``load_config(path)`` reads one YAML file: an EndpointPickerConfig (``plugins`` and
``schedulingProfiles``, see ``llmplane.gateway.scheduler.config``) plus an optional
``gateway:`` section whose camelCase keys set the fields below (``maxBodyBytes: 1048576``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from llmplane.api import safe_yaml
from llmplane.fdlimit import client_connection_cap, open_files_limit
from llmplane.gateway.apikeys import parse_admin_setting
from llmplane.gateway.exposure import check_origins
from llmplane.gateway.scheduler.config import build_scheduler
from llmplane.gateway.upstream_client import KEEPALIVE_TIMEOUT


@dataclass
class GatewayConfig:
    # Requests with a larger body get 413.
    max_body_bytes: int = 16 * 1024 * 1024
    # Request bodies held at once by a gateway process, across all client connections: from a
    # body's first byte until its request is answered (pipelined ones included). A body that
    # would go over gets 503 with Retry-After and its connection is closed. 0: no cap.
    max_body_bytes_total: int = 256 * 1024 * 1024
    # Admission: an endpoint is saturated when its queue or KV use is above these, or its
    # metrics are older than ``metrics_staleness`` seconds. Engines without load metrics are
    # saturated when the gateway has more than ``saturation_inflight`` requests on them.
    saturation_queue: float = 5
    saturation_kv: float = 0.8
    metrics_staleness: float = 0.2
    saturation_inflight: int = 64
    # An endpoint with this many requests in flight from the gateway is saturated whatever its
    # metrics say (0: no cap). Set to the engines' running capacity (vLLM --max-num-seqs),
    # flow control then keeps the rest in the gateway and a dispatched request starts at once.
    saturation_max_inflight: int = 0
    # An endpoint with this many streams from the gateway that have not yet sent their first
    # chunk (queued or in prefill in the engine) is saturated (0: off): prefills sharing an
    # engine step slow each other's TTFT; flow control releases the next request when a first
    # token arrives. 2 suits prefill-bound streaming (docs/gateway.md). Shared by workers.
    saturation_max_prefilling: int = 0
    shed_retry_after: float = 1.0
    # Engine metrics scraping.
    scrape_interval: float = 0.05  # while an endpoint is busy
    scrape_idle_interval: float = 2.0  # at most, once it is idle (see gateway/scraper.py)
    scrape_timeout: float = 1.0
    models_refresh_interval: float = 5.0
    # Retries and timeouts for routes without a trafficPolicy (Playgrounds, InferencePools,
    # ModelServers without trafficPolicy.retry).
    default_retry_attempts: int = 2
    default_retry_interval: float = 0.0
    # Upstream time to first byte (a unary answer: the whole answer) for routes without a
    # trafficPolicy.timeout or a llmplane.io/upstream-timeout annotation; None: no limit.
    default_timeout: float | None = 300.0
    # A stream whose upstream sends nothing for this many seconds ends with an SSE error event
    # (and counts against the replica); per route: llmplane.io/stream-stall-timeout. None: off.
    stream_stall_timeout: float | None = 60.0
    # A stream whose replica is lost (broken, stalled, an engine error) continues on another
    # replica of a vLLM or sim engine up to this many times; per route:
    # llmplane.io/migration-limit (0: never). See gateway/migration.py.
    migration_limit: int = 3
    # No migration once prompt + generated tokens exceed this (the continuation's prefill).
    migration_max_sequence: int = 131072
    connect_timeout: float = 5.0
    # Outlier ejection: a replica failing this many times in a row is skipped for
    # ``ejection_base`` seconds, doubling on each repeat up to ``ejection_max``.
    ejection_failures: int = 3
    ejection_base: float = 10.0
    ejection_max: float = 300.0
    # How many endpoints a pick returns (the first plus the fallbacks tried on retry).
    fallbacks: int = 4
    # Upstream connection pool. Idle keep-alive connections are closed after
    # ``keepalive_timeout`` seconds: keep it below the engines' own idle limit (vLLM's uvicorn
    # and llama.cpp's: 5 s), else a request may meet a connection the engine is closing
    # (then it is sent again on a new connection, see gateway/upstream_client.py).
    connection_limit: int = 1024
    keepalive_timeout: float = KEEPALIVE_TIMEOUT
    # Client connections: an idle keep-alive connection is closed after this many seconds;
    # on shutdown, requests in flight get ``shutdown_grace`` seconds to finish.
    client_keepalive_timeout: float = 75.0
    shutdown_grace: float = 60.0
    # A request head (request line and headers) must arrive within this many seconds of its
    # first byte (or of connecting), else 408 and close; 0: no limit.
    client_header_timeout: float = 10.0
    # A request body must arrive within this many seconds of its head's end, else 408 and
    # close; 0: no limit (an idle connection is then closed after client_keepalive_timeout).
    client_body_timeout: float = 60.0
    # Client connections one gateway process holds at once. At the cap a new connection
    # closes an idle keep-alive one (no request under way) to make room, else it gets 503 and
    # is closed. None: derived from the open-files limit (``fdlimit.client_connection_cap``,
    # docs/security.md); 0: no cap (the control plane may then run out of descriptors).
    max_client_connections: int | None = None
    # Host names requests may name (port ignored) besides the loopback names a gateway on a
    # loopback address always accepts; "*" accepts any. See gateway/exposure.py.
    allowed_hosts: list[str] = field(default_factory=list)
    # Origins (scheme://host[:port], "null", "*": any) of web pages allowed to call the
    # gateway besides its own; requests from other pages get 403. See gateway/exposure.py.
    allowed_origins: list[str] = field(default_factory=list)
    # Activator (gateway/activator.py): requests for a model without a ready replica wait up
    # to this long (0: answer 503 at once), at most this many and this many bytes per model;
    # a 503 then says Retry-After this many seconds.
    activator_hold_timeout: float = 60.0
    activator_max_queue: int = 100
    activator_max_queue_bytes: int = 64 * 1024 * 1024
    activator_retry_after: float = 5.0
    # Flow control (gateway/flowcontrol/): while every candidate of a backend is saturated
    # (the rule above), requests wait in the gateway by priority band (Critical, Default,
    # Sheddable) and fairly between tenants, instead of piling onto engine queues. A request
    # waits at most ``flow_control_ttl`` seconds (then 429 + Retry-After
    # ``shed_retry_after``); each band holds at most this many requests and bytes, the whole
    # queue of a backend at most the total ones (full: lower bands are evicted first).
    # Off: Sheddable requests get 429 at once and the others go to the engines' queues.
    flow_control: bool = True
    flow_control_ttl: float = 30.0
    flow_control_band_requests: int = 1000
    flow_control_band_bytes: int = 64 * 1024 * 1024
    flow_control_total_requests: int = 2000
    flow_control_total_bytes: int = 128 * 1024 * 1024
    # Per endpoint, this many requests past the saturation rule (each count limit: in flight,
    # prefilling, queue) for a request whose tenant holds less than its fair share of the
    # backend's requests in flight (not Sheddable): it goes at once instead of waiting behind
    # a heavy tenant's backlog (gateway/flowcontrol/fairshare.py; 0: off).
    flow_control_reserve: int = 0
    # ID:SALT:HASH of the admin key (`llmplane keys admin` makes one): with it, /metrics and
    # the console's JSON API need that key (Authorization: Bearer or x-api-key). None: open.
    admin_key_hash: str | None = None
    # EndpointPickerConfig as a dict; None = the built-in default profile.
    scheduler: dict[str, Any] | None = None
    # Request hooks: see llmplane.gateway.hooks (the token rate limiter is always installed).
    hooks: list[Any] = field(default_factory=list)
    # Token rate limits (ModelRoute.spec.rateLimit, see llmplane.gateway.ratelimit).
    # Output tokens reserved per prompt and choice of a request without max_tokens /
    # max_completion_tokens (capped at the bucket; the real output is settled from usage).
    rate_limit_default_output_tokens: int = 256
    # global.redis unreachable: "open" admits (availability first; errors are counted),
    # "local" falls back to this process's buckets, "closed" answers 503.
    rate_limit_redis_failure: str = "open"
    # Bound on each Redis call (connect, pool wait, script); after a failure Redis is not
    # asked again for rate_limit_redis_retry_interval seconds (the failure policy applies).
    rate_limit_redis_timeout: float = 0.25
    rate_limit_redis_retry_interval: float = 1.0
    rate_limit_redis_max_connections: int = 64
    # Model name -> tokenizer.json (or a directory holding one) for counting input tokens
    # exactly; needs the tokenizers package. Otherwise ceil(chars / 4), see gateway/tokens.py.
    rate_limit_tokenizers: dict[str, str] = field(default_factory=dict)
    # Usage records per tenant, model and minute (gateway/tenant_usage.py, read by
    # `llmplane usage`): a SQLite file path, "off", or None = usage.db beside a SQLite store
    # (none on Kubernetes: use the Prometheus counters there). Written every
    # usage_flush_interval seconds in one batch, off the request path.
    usage_log: str | None = None
    usage_flush_interval: float = 10.0


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def config_from_dict(doc: dict[str, Any] | None) -> GatewayConfig:
    doc = dict(doc or {})
    settings = doc.pop("gateway", None) or {}
    names = {f.name for f in fields(GatewayConfig)} - {"scheduler", "hooks"}
    kwargs: dict[str, Any] = {}
    for key, value in settings.items():
        name = _snake(key)
        if name not in names:
            raise ValueError(f"gateway.{key}: unknown setting (known: {sorted(names)})")
        kwargs[name] = value
    scheduler = doc if (doc.get("plugins") or doc.get("schedulingProfiles")) else None
    config = GatewayConfig(scheduler=scheduler, **kwargs)
    _check_settings(config)
    return config


# What a setting of each declared type must be (the annotations are strings here).
_KINDS = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "list[str]": "a list of strings",
    "dict[str, str]": "a mapping of names to strings",
}
# The least a number may be, and how to say it: at least 0 unless named here.
_LEAST = {
    "flow_control_ttl": (1e-9, "of seconds above 0"),
    # Below 0: every replica reporting its KV use counts as saturated (shedding on demand).
    "saturation_kv": (-1, "of at least -1"),
} | {
    f"flow_control_{bound}_{what}": (1, "of at least 1")
    for bound in ("band", "total")
    for what in ("requests", "bytes")
}


def _fits(value: Any, kind: str, least: float) -> bool:
    if kind == "bool" or isinstance(value, bool):
        return kind == "bool" and isinstance(value, bool)
    if kind in ("int", "float"):
        return isinstance(value, int if kind == "int" else int | float) and value >= least
    if kind == "list[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, str if kind == "str" else dict)


def _check_settings(config: GatewayConfig) -> None:
    """Every setting of the type its field declares, numbers at least 0 (or ``_LEAST``);
    origins well formed. ValueError says which and what it must be."""
    for name in ("allowed_hosts", "allowed_origins"):
        if isinstance(getattr(config, name), str):  # one name written without a list
            setattr(config, name, [getattr(config, name)])
    for f in fields(GatewayConfig):
        value, kind = getattr(config, f.name), str(f.type)
        if kind.endswith(" | None"):
            if value is None:
                continue
            kind = kind.removesuffix(" | None")
        least, said = _LEAST.get(f.name, (0, "of at least 0"))
        if kind in _KINDS and not _fits(value, kind, least):
            what = _KINDS[kind] + (f" {said}" if kind in ("int", "float") else "")
            camel = re.sub(r"_(\w)", lambda m: m.group(1).upper(), f.name)
            raise ValueError(f"gateway.{camel}: must be {what}")
    check_origins(config.allowed_origins)


def client_connection_limit(config: GatewayConfig) -> int:
    """The client-connection cap in force (0: none): the setting, else what this process's
    open-files limit leaves after the control plane's reserve."""
    if config.max_client_connections is not None:
        return config.max_client_connections
    return client_connection_cap(open_files_limit())


def load_config(path: str | Path | None) -> GatewayConfig:
    if path is None:
        return GatewayConfig()
    with open(path) as f:
        doc = safe_yaml.load(f)
    if doc is not None and not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping (an EndpointPickerConfig)")
    return config_from_dict(doc)


class ConfigFileError(ValueError):
    """A gateway config file that cannot be used; the message names the file and the problem."""


def load_checked(path: str | Path) -> GatewayConfig:
    """``load_config`` plus building its scheduling profiles, so that a bad file is refused
    before anything starts, with one line saying why (no traceback)."""
    try:
        config = load_config(path)
        build_scheduler(config.scheduler)
        if config.admin_key_hash is not None:
            parse_admin_setting(config.admin_key_hash)
    except OSError as e:
        raise ConfigFileError(f"{path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        where, problem = safe_yaml.describe(e, str(path))
        raise ConfigFileError(f"{where}: not valid YAML: {problem}") from None
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ConfigFileError(f"{path}: invalid gateway config: {e}") from None
    return config
