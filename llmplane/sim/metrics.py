"""vLLM's Prometheus metrics, computed from the engine's state at every scrape.

Gauges are read live (no lag between a state change and a scrape); counters come from the
scheduler's running totals; histograms are plain arrays updated in the engine loop (one
bisect per observation, no locks, no label lookups). A custom collector on a per-process
``CollectorRegistry`` turns all of it into families for ``prometheus_client`` to render.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

if TYPE_CHECKING:
    from llmplane.sim.engine import Engine

# Bucket bounds as vLLM defines them (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

# vLLM's finished_reason values (error and repetition never happen in the sim: always 0).
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
# Every vllm: family carries the engine index (one engine per server here) and model_name.
ENGINE = "0"


class Histogram:
    """Lock-free histogram for a single-threaded event loop."""

    __slots__ = ("bounds", "counts", "sum", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # last: +Inf
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += 1
        self.sum += value

    def observe_all(self, values: Iterable[float]) -> None:
        counts, bounds = self.counts, self.bounds
        n = 0
        s = 0.0
        for v in values:
            counts[bisect_left(bounds, v)] += 1
            n += 1
            s += v
        self.total += n
        self.sum += s

    def family(self, name: str, doc: str, model: str, created: float) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(name, doc, labels=["engine", "model_name"])
        buckets = []
        acc = 0
        for bound, c in zip(self.bounds, self.counts, strict=False):
            acc += c
            buckets.append((repr(float(bound)), acc))
        buckets.append(("+Inf", self.total))
        fam.add_metric([ENGINE, model], buckets, self.sum)
        # prometheus_client's own histograms expose <name>_created (vLLM's do).
        fam.samples.append(
            Sample(name + "_created", {"engine": ENGINE, "model_name": model}, created)
        )
        return fam


class SimMetrics(Collector):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.created = time.time()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        eng = self.engine
        cfg = eng.cfg
        sched = eng.sched
        stats = sched.stats
        model = cfg.model_name
        created = self.created
        lab = ["engine", "model_name"]
        values = [ENGINE, model]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=lab)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=lab)
            c.add_metric(values, value, created=created)
            return c

        usage = sched.pool.usage()
        yield gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.",
            sched.num_running,
        )  # fmt: skip
        yield gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
            sched.num_waiting,
        )  # fmt: skip
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
        yield gauge(
            "vllm:gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use "
            "vllm:kv_cache_usage_perc instead.",
            usage,
        )
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_queries,
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            stats.prefix_hits,
        )
        yield counter(
            "vllm:gpu_prefix_cache_queries",
            "GPU prefix cache queries, in terms of number of queried tokens. DEPRECATED.",
            stats.prefix_queries,
        )
        yield counter(
            "vllm:gpu_prefix_cache_hits",
            "GPU prefix cache hits, in terms of number of cached tokens. DEPRECATED.",
            stats.prefix_hits,
        )
        yield counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.",
            stats.preemptions,
        )  # fmt: skip
        yield counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens
        )
        yield counter(
            "vllm:generation_tokens", "Number of generation tokens processed.",
            stats.generation_tokens,
        )  # fmt: skip
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=["engine", "finished_reason", "model_name"],
        )
        for reason, n in self.success.items():
            success.add_metric([ENGINE, reason, model], n, created=created)
        yield success

        lora = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=[
                "engine", "max_lora", "model_name", "running_lora_adapters",
                "waiting_lora_adapters",
            ],
        )  # fmt: skip
        lora.add_metric(
            [
                ENGINE,
                str(cfg.max_loras),
                model,
                ",".join(sorted(sched.lora_running)),
                ",".join(sorted(sched.lora_waiting)),
            ],
            time.time(),
        )
        yield lora
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[
                "block_size",
                "cache_dtype",
                "enable_prefix_caching",
                "engine",
                "gpu_memory_utilization",
                "num_cpu_blocks",
                "num_gpu_blocks",
                "model_name",
            ],
        )
        info.add_metric(
            [
                str(cfg.block_size),
                "auto",
                str(cfg.enable_prefix_caching),
                ENGINE,
                "0.9",
                "None",
                str(cfg.num_blocks),
                model,
            ],
            1.0,
        )
        yield info

        yield self.ttft.family(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            model, created,
        )  # fmt: skip
        yield self.itl.family(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            model, created,
        )  # fmt: skip
        yield self.itl.family(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds. DEPRECATED: Use "
            "vllm:inter_token_latency_seconds instead.",
            model,
            created,
        )
        yield self.e2e.family(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
            model, created,
        )  # fmt: skip
