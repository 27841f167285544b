"""Gateway settings: limits, admission thresholds, scraping, retries, ejection, scheduling.

``load_checked(path)`` reads one YAML file: an EndpointPickerConfig (``plugins`` and
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
    """Every ``gateway:`` setting, camelCase in YAML (what each does: docs/gateway.md, limits:
    docs/security.md)."""

    max_body_bytes: int = 16 * 1024 * 1024  # larger: 413
    max_body_bytes_total: int = 256 * 1024 * 1024  # bodies held at once per process (0: no cap)
    max_response_bytes: int = 256 * 1024 * 1024  # a whole (unary) upstream answer; larger: 502
    # Admission: when an endpoint is saturated (docs/gateway.md, "Admission").
    saturation_queue: float = 5
    saturation_kv: float = 0.8
    metrics_staleness: float = 0.2
    saturation_inflight: int = 64  # engines without load metrics
    saturation_max_inflight: int = 0  # whatever the metrics say (0: no cap)
    saturation_max_prefilling: int = 0  # streams before their first chunk (0: off)
    shed_retry_after: float = 1.0
    scrape_interval: float = 0.05  # while an endpoint is busy
    scrape_idle_interval: float = 2.0  # at most, once it is idle (gateway/scraper.py)
    scrape_timeout: float = 1.0
    models_refresh_interval: float = 5.0
    # For routes without a trafficPolicy (or its annotation); None: no limit.
    default_retry_attempts: int = 2
    default_retry_interval: float = 0.0
    default_timeout: float | None = 300.0  # upstream time to first byte
    stream_stall_timeout: float | None = 60.0  # per route: llmplane.io/stream-stall-timeout
    migration_limit: int = 3  # per route: llmplane.io/migration-limit (gateway/migration.py)
    migration_max_sequence: int = 131072  # prompt + generated tokens, past it no migration
    connect_timeout: float = 5.0
    # Outlier ejection: this many failures in a row, skipped base seconds doubling up to max.
    ejection_failures: int = 3
    ejection_base: float = 10.0
    ejection_max: float = 300.0
    fallbacks: int = 4  # endpoints a pick returns (the first plus those tried on retry)
    connection_limit: int = 1024  # upstream pool
    # Below the engines' own idle limit (5 s), see gateway/upstream_client.py.
    keepalive_timeout: float = KEEPALIVE_TIMEOUT
    client_keepalive_timeout: float = 75.0
    shutdown_grace: float = 60.0  # for requests in flight
    client_header_timeout: float = 10.0  # 408 past it; 0: no limit
    client_body_timeout: float = 60.0  # from the head's end; 0: no limit
    # None: from the open-files limit (client_connection_limit below); 0: no cap.
    max_client_connections: int | None = None
    # Besides the loopback names and the gateway's own origin (gateway/exposure.py); "*": any.
    allowed_hosts: list[str] = field(default_factory=list)
    allowed_origins: list[str] = field(default_factory=list)
    # Activator (gateway/activator.py): how long, how many and how many bytes it holds.
    activator_hold_timeout: float = 60.0
    activator_max_queue: int = 100
    activator_max_queue_bytes: int = 64 * 1024 * 1024
    activator_retry_after: float = 5.0
    # Flow control (gateway/flowcontrol/; docs/gateway.md, "Flow control").
    flow_control: bool = True
    flow_control_ttl: float = 30.0
    flow_control_band_requests: int = 1000
    flow_control_band_bytes: int = 64 * 1024 * 1024
    flow_control_total_requests: int = 2000
    flow_control_total_bytes: int = 128 * 1024 * 1024
    flow_control_reserve: int = 0  # flowcontrol/fairshare.py; 0: off
    # ID:SALT:HASH (`llmplane keys admin`): /metrics and the console's API need that key.
    admin_key_hash: str | None = None
    scheduler: dict[str, Any] | None = None  # EndpointPickerConfig; None: the default profile
    hooks: list[Any] = field(default_factory=list)  # llmplane.gateway.hooks
    # Token rate limits (llmplane.gateway.ratelimit; docs/gateway.md, "Rate limits").
    rate_limit_default_output_tokens: int = 256  # reserved without max_tokens
    rate_limit_redis_failure: str = "open"  # Redis unreachable: open, local or closed
    rate_limit_redis_timeout: float = 0.25
    rate_limit_redis_retry_interval: float = 1.0
    rate_limit_redis_max_connections: int = 64
    # Model name -> tokenizer.json (or its directory) to count input tokens exactly.
    rate_limit_tokenizers: dict[str, str] = field(default_factory=dict)
    # gateway/tenant_usage.py: a SQLite path, "off", or None: usage.db beside a SQLite store.
    usage_log: str | None = None
    usage_flush_interval: float = 10.0


def config_from_dict(doc: dict[str, Any] | None) -> GatewayConfig:
    doc = dict(doc or {})
    settings = doc.pop("gateway", None) or {}
    names = {f.name for f in fields(GatewayConfig)} - {"scheduler", "hooks"}
    kwargs: dict[str, Any] = {}
    for key, value in settings.items():
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()
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


class ConfigFileError(ValueError):
    """A gateway config file that cannot be used; the message names the file and the problem."""


def load_checked(path: str | Path) -> GatewayConfig:
    """The config in ``path``, its scheduling profiles built, so that a bad file is refused
    before anything starts, with one line saying why (no traceback)."""
    try:
        with open(path) as f:
            doc = safe_yaml.load(f)
        if doc is not None and not isinstance(doc, dict):
            raise ValueError("expected a mapping (an EndpointPickerConfig)")
        config = config_from_dict(doc)
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
