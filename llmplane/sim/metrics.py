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
    from llmplane.sim.scheduler import Sequence

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
# Request phase times (queue, prefill, decode, inference) share the e2e bounds in vLLM.
PHASE_BUCKETS = E2E_BUCKETS
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)


def token_buckets(max_model_len: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_model_len`` (vLLM's token-count histograms)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


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
        # Observed when a sequence finishes (engine.py).
        self.queue_time = Histogram(PHASE_BUCKETS)
        self.prefill_time = Histogram(PHASE_BUCKETS)
        self.decode_time = Histogram(PHASE_BUCKETS)
        self.inference_time = Histogram(PHASE_BUCKETS)
        self.tpot = Histogram(ITL_BUCKETS)
        tokens = token_buckets(engine.cfg.max_model_len)
        self.req_prompt_tokens = Histogram(tokens)
        self.req_generation_tokens = Histogram(tokens)
        self.req_max_tokens = Histogram(tokens)
        self.req_max_generation = Histogram(tokens)
        self.req_prefill_computed = Histogram(tokens)
        self.req_n = Histogram(PARAMS_N_BUCKETS)
        self.req_preemptions = Histogram(PREEMPTION_BUCKETS)
        self.iteration_tokens = Histogram(ITERATION_TOKEN_BUCKETS)
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.created = time.time()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def request_arrived(self, n: int, prompts: int) -> None:
        for _ in range(prompts):
            self.req_n.observe(n)

    def sequence_finished(self, seq: Sequence, now: float, max_tokens: int | None) -> None:
        """vLLM's per-request histograms (each choice of ``n`` is a request to the engine)."""
        scheduled = seq.scheduled_at if seq.scheduled_at is not None else seq.arrival
        first = seq.first_token_at if seq.first_token_at is not None else now
        decode = now - first
        self.queue_time.observe(scheduled - seq.arrival)
        self.prefill_time.observe(first - scheduled)
        self.decode_time.observe(decode)
        self.inference_time.observe(now - scheduled)
        self.tpot.observe(decode / (seq.num_output - 1) if seq.num_output > 1 else 0.0)
        self.req_prompt_tokens.observe(seq.prompt_len)
        self.req_generation_tokens.observe(seq.num_output)
        if max_tokens is not None:
            self.req_max_tokens.observe(max_tokens)
        self.req_preemptions.observe(seq.preemptions)
        self.req_prefill_computed.observe(seq.prompt_len - min(max(0, seq.num_cached),
                                                              seq.prompt_len))  # fmt: skip

    def request_finished(self, seqs: list[Sequence]) -> None:
        self.req_max_generation.observe(max(s.num_output for s in seqs))

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
        deferred = len(sched.transferring)
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            labels=["engine", "model_name", "reason"],
        )
        by_reason.add_metric([ENGINE, model, "capacity"], sched.num_waiting - deferred)
        by_reason.add_metric([ENGINE, model, "deferred"], deferred)
        yield by_reason
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
        yield counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).",
            stats.prompt_cached,
        )  # fmt: skip
        cached, transferred = stats.prompt_cached, stats.prompt_transferred
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
            labels=["engine", "model_name", "source"],
        )  # fmt: skip
        for source, n in (
            ("local_compute", stats.prompt_tokens - cached - transferred),
            ("local_cache_hit", cached),
            ("external_kv_transfer", transferred),
        ):
            by_source.add_metric([ENGINE, model, source], n, created=created)
        yield by_source
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
        for hist, name, doc in (
            (self.queue_time, "vllm:request_queue_time_seconds",
             "Histogram of time spent in WAITING phase for request."),
            (self.inference_time, "vllm:request_inference_time_seconds",
             "Histogram of time spent in RUNNING phase for request."),
            (self.prefill_time, "vllm:request_prefill_time_seconds",
             "Histogram of time spent in PREFILL phase for request."),
            (self.decode_time, "vllm:request_decode_time_seconds",
             "Histogram of time spent in DECODE phase for request."),
            (self.tpot, "vllm:request_time_per_output_token_seconds",
             "Histogram of time_per_output_token_seconds per request."),
            (self.req_prompt_tokens, "vllm:request_prompt_tokens",
             "Number of prefill tokens processed."),
            (self.req_generation_tokens, "vllm:request_generation_tokens",
             "Number of generation tokens processed."),
            (self.iteration_tokens, "vllm:iteration_tokens_total",
             "Histogram of number of tokens per engine_step."),
            (self.req_max_generation, "vllm:request_max_num_generation_tokens",
             "Histogram of maximum number of requested generation tokens."),
            (self.req_n, "vllm:request_params_n", "Histogram of the n request parameter."),
            (self.req_max_tokens, "vllm:request_params_max_tokens",
             "Histogram of the max_tokens request parameter."),
            (self.req_preemptions, "vllm:request_num_preemptions",
             "Histogram of the number of times a request was preempted."),
            (self.req_prefill_computed, "vllm:request_prefill_kv_computed_tokens",
             "Histogram of new KV tokens computed during prefill (excluding cached tokens)."),
        ):  # fmt: skip
            yield hist.family(name, doc, model, created)
