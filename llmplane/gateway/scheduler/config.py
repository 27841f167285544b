"""Scheduler configuration in the style of the Inference Extension's EndpointPickerConfig::

    plugins:
      - type: queue-scorer            # or the short name: queue
      - type: prefix-cache-scorer
        parameters: {blockSize: 64, maxPrefixBlocksToMatch: 256, lruCapacityPerServer: 31250}
      - type: max-score-picker
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: queue-scorer
            weight: 2
          - pluginRef: prefix-cache-scorer
            weight: 3
          - pluginRef: max-score-picker

A plugin's ``name`` defaults to its ``type``; profiles refer to plugins by name, so two
profiles naming the same plugin share its state (one prefix index). The profile named
``default`` (else the first) serves every route; a ModelServer, InferencePool or Playground
picks another with the annotation ``llmplane.io/scheduling-profile: <name>``.

The file may carry ``apiVersion: llm-d.ai/v1alpha1`` (or the deprecated
``inference.networking.x-k8s.io/v1alpha1``) and ``kind: EndpointPickerConfig``, as llm-d's
router's do; its other sections (featureGates, dataLayer, flowControl, ...) are not read.

``DEFAULT_CONFIG`` is the built-in profile: the one place to tune it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmplane.gateway.kvcache.index import BlockIndex
from llmplane.gateway.scheduler import plugins as p
from llmplane.gateway.scheduler.framework import Profile, Scheduler
from llmplane.gateway.scheduler.precise_prefix import PrecisePrefixCacheScorer, TokenSource
from llmplane.gateway.scheduler.prefill_cost import PrefillCostScorer
from llmplane.gateway.scheduler.prefix import PrefixCacheScorer, SharedPicks
from llmplane.gateway.scheduler.prefix_spread import PrefixSpreadScorer

DEFAULT_CONFIG: dict[str, Any] = {
    "plugins": [
        {"type": "model-served-filter"},
        {"type": "queue-margin-filter", "parameters": {"margin": 64}},
        {"type": "prefix-cache-scorer"},
        {"type": "least-request-scorer"},
        {"type": "kv-cache-utilization-scorer"},
        {"type": "prefix-spread-scorer"},
        {"type": "max-score-picker"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "model-served-filter"},
                {"pluginRef": "queue-margin-filter"},
                {"pluginRef": "prefix-cache-scorer", "weight": 6},
                {"pluginRef": "least-request-scorer", "weight": 2},
                {"pluginRef": "kv-cache-utilization-scorer", "weight": 1},
                {"pluginRef": "prefix-spread-scorer", "weight": 3},
                {"pluginRef": "max-score-picker"},
            ],
        }
    ],
}


@dataclass(frozen=True, slots=True)
class PluginHandle:
    """What the gateway hands a plugin's constructor besides its name and parameters (the
    Inference Extension's plugin handle): state the plugin shares with the rest of it."""

    picks: SharedPicks | None = None  # several gateway workers: their prefix picks
    kv_index: BlockIndex | None = None  # the blocks the replicas report (gateway/kvcache)
    tokens: TokenSource | None = None  # a request's token ids, as the engines compute them


def _prefix(name: str, params: dict[str, Any], handle: PluginHandle) -> PrefixCacheScorer:
    return PrefixCacheScorer(
        name,
        block_size=int(params.get("blockSize", 64)),
        max_blocks=int(params.get("maxPrefixBlocksToMatch", 256)),
        capacity=int(params.get("lruCapacityPerServer", 31_250)),
        feed=handle.picks,
    )


def _precise(handle: PluginHandle, name: str = "precise-prefix-cache") -> PrecisePrefixCacheScorer:
    return PrecisePrefixCacheScorer(name, index=handle.kv_index, tokens=handle.tokens)


PLUGIN_TYPES: dict[str, Callable[[str, dict[str, Any], PluginHandle], Any]] = {
    "model-served-filter": lambda n, *_: p.ModelServedFilter(n),
    "low-queue-filter": lambda n, a, _: p.LowQueueFilter(n, float(a.get("threshold", 10))),
    "queue-margin-filter": lambda n, a, _: p.QueueMarginFilter(n, float(a.get("margin", 64))),
    "queue-scorer": lambda n, *_: p.QueueScorer(n),
    "kv-cache-utilization-scorer": lambda n, *_: p.KVCacheScorer(n),
    "prefix-cache-scorer": _prefix,
    # The blocks engines report in their KV events (scheduler/precise_prefix.py); in the
    # default profile it takes the approximate scorer's place while some replica publishes.
    "precise-prefix-cache-scorer": lambda n, _, h: _precise(h, n),
    # Expected time to first token: queued prefill plus the uncached tokens (prefill_cost.py);
    # opt-in (alone it trades a recompute for a short wait too readily under load).
    "prefill-cost-scorer": lambda n, _, h: PrefillCostScorer(n, _precise(h)),
    "least-request-scorer": lambda n, *_: p.LeastRequestScorer(n),
    "prefix-spread-scorer": lambda n, a, _: PrefixSpreadScorer(n, float(a.get("window", 60))),
    "lora-affinity-scorer": lambda n, *_: p.LoraAffinityScorer(n),
    "session-affinity-scorer": lambda n, a, _: p.SessionAffinityScorer(
        n, header=str(a.get("header", "x-session-id")).lower()
    ),
    "round-robin-scorer": lambda n, *_: p.RoundRobinScorer(n),
    "random-scorer": lambda n, *_: p.RandomScorer(n),
    "max-score-picker": lambda n, *_: p.MaxScorePicker(n),
    "weighted-random-picker": lambda n, *_: p.WeightedRandomPicker(n),
    "random-picker": lambda n, *_: p.RandomPicker(n),
}
ALIASES = {
    "model-served": "model-served-filter",
    "low-queue": "low-queue-filter",
    "queue-margin": "queue-margin-filter",
    "queue": "queue-scorer",
    "kv-cache-utilization": "kv-cache-utilization-scorer",
    "kv-cache-scorer": "kv-cache-utilization-scorer",
    "kv-cache": "kv-cache-utilization-scorer",
    "prefix-cache": "prefix-cache-scorer",
    "precise-prefix-cache": "precise-prefix-cache-scorer",
    "prefill-cost": "prefill-cost-scorer",
    "least-request": "least-request-scorer",
    "prefix-spread": "prefix-spread-scorer",
    "lora-affinity": "lora-affinity-scorer",
    "session-affinity": "session-affinity-scorer",
    "round-robin": "round-robin-scorer",
    "random": "random-scorer",
    "max-score": "max-score-picker",
    "weighted-random": "weighted-random-picker",
}
# Accepted for compatibility with EndpointPickerConfig files; they have no effect here
# (a disaggregated ModelServer's candidates are its decode replicas already: pd.py).
IGNORED_TYPES = {"single-profile-handler", "decode-filter"}
# A file may say what it is, as llm-d's router requires (the older group is deprecated there).
API_VERSIONS = ("llm-d.ai/v1alpha1", "inference.networking.x-k8s.io/v1alpha1")
KIND = "EndpointPickerConfig"


class ConfigError(ValueError):
    pass


def build_scheduler(
    config: dict[str, Any] | None = None, handle: PluginHandle | None = None
) -> Scheduler:
    """A Scheduler from an EndpointPickerConfig dict (None = ``DEFAULT_CONFIG``), its plugins
    built with ``handle``."""
    handle = handle or PluginHandle()
    config = config or DEFAULT_CONFIG
    api_version, kind = config.get("apiVersion"), config.get("kind")
    if api_version is not None and api_version not in API_VERSIONS:
        raise ConfigError(
            f"apiVersion: must be one of {', '.join(API_VERSIONS)}, got {api_version!r}"
        )
    if kind is not None and kind != KIND:
        raise ConfigError(f"kind: must be {KIND!r}, got {kind!r}")
    instances: dict[str, Any] = {}
    for i, entry in enumerate(config.get("plugins") or []):
        if not isinstance(entry, dict) or "type" not in entry:
            raise ConfigError(f"plugins[{i}]: needs a type")
        kind = ALIASES.get(entry["type"], entry["type"])
        if kind in IGNORED_TYPES:
            continue
        factory = PLUGIN_TYPES.get(kind)
        if factory is None:
            known = sorted(PLUGIN_TYPES) + sorted(ALIASES)
            raise ConfigError(
                f"plugins[{i}].type: unknown plugin {entry['type']!r} (known: {', '.join(known)})"
            )
        name = entry.get("name") or entry["type"]
        if name in instances:
            raise ConfigError(f"plugins[{i}].name: {name!r} is defined twice")
        instances[name] = factory(name, dict(entry.get("parameters") or {}), handle)
        if name != kind:
            instances.setdefault(kind, instances[name])  # refer by canonical type name too
    profiles: dict[str, Profile] = {}
    raw_profiles = config.get("schedulingProfiles") or [
        {"name": "default", "plugins": [{"pluginRef": n} for n in instances]}
    ]
    for i, raw in enumerate(raw_profiles):
        name = raw.get("name") or f"profile-{i}"
        profile = Profile(name)
        for j, ref in enumerate(raw.get("plugins") or []):
            plugin_name = ref.get("pluginRef")
            plugin = instances.get(plugin_name) or instances.get(ALIASES.get(plugin_name, ""))
            if plugin is None:
                if ALIASES.get(plugin_name, plugin_name) in IGNORED_TYPES:
                    continue
                raise ConfigError(
                    f"schedulingProfiles[{i}].plugins[{j}].pluginRef: no plugin named {plugin_name!r}"
                )
            weight = float(ref.get("weight", 1))
            if hasattr(plugin, "filter"):
                profile.filters.append(plugin)
            elif hasattr(plugin, "score"):
                if weight < 0:
                    raise ConfigError(f"schedulingProfiles[{i}].plugins[{j}].weight: must be >= 0")
                profile.scorers.append((plugin, weight))
            elif hasattr(plugin, "pick"):
                if profile.picker is not None:
                    raise ConfigError(f"schedulingProfiles[{i}]: more than one picker")
                profile.picker = plugin
            if hasattr(plugin, "on_pick") and plugin not in profile.observers:
                profile.observers.append(plugin)
        if profile.picker is None:
            profile.picker = p.MaxScorePicker()
        profiles[name] = profile
    if not profiles:
        raise ConfigError("schedulingProfiles: at least one profile is needed")
    default = "default" if "default" in profiles else next(iter(profiles))
    unique = {id(v): v for v in instances.values()}
    return Scheduler(profiles, {getattr(v, "name", str(k)): v for k, v in unique.items()}, default)
