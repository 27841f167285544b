"""vLLM's Prometheus metrics, read from the engine's state at every scrape.

Gauges are read live (no lag between a state change and a scrape); counters come from the
scheduler's running totals; histograms are plain arrays updated in the engine loop (one
bisect per observation, no locks, no label lookups). The page is a template filled at a
scrape, and only when a value on it changed (``exposition.py``): fleets of hundreds of
replicas are scraped all the time, mostly while idle.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from prometheus_client.utils import floatToGoString

from llmplane.sim.exposition import HistogramText, Template, header, labels

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


class SimMetrics:
    """vLLM's metrics for one engine: histograms fed by the engine loop, the rest read from
    the scheduler when a scrape finds something changed."""

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
        self._base = {"engine": ENGINE, "model_name": engine.cfg.model_name}
        # A prefill or decode instance stands for vLLM with a KV connector configured.
        self.connector = engine.cfg.role != "both"
        self._lora_prefix = "vllm:lora_requests_info"
        self._template, self._hist_texts = self._build_page()
        self._hists = list({id(h.hist): h.hist for h in self._hist_texts}.values())
        self._key: tuple | None = None
        self._page = b""

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
        """The page; reused as long as no value on it changed (see ``exposition.py``)."""
        eng = self.engine
        sched = eng.sched
        stats = sched.stats
        loras = (
            (tuple(sorted(sched.lora_running)), tuple(sorted(sched.lora_waiting)))
            if sched.lora_running or sched.lora_waiting
            else ()
        )
        key = (
            sched.num_running,
            sched.num_waiting,
            len(sched.transferring),
            len(sched.pool.free),
            stats.prefix_queries,
            stats.prefix_hits,
            stats.preemptions,
            stats.prompt_tokens,
            stats.generation_tokens,
            stats.prompt_cached,
            stats.prompt_transferred,
            stats.prompt_uncached,
            *self.success.values(),
            loras,
            *[h.total for h in self._hists],
        )
        if key == self._key:
            return self._page
        self._key = key
        self._page = self._fill(loras).encode()
        return self._page

    def _fill(self, loras: tuple) -> str:
        eng = self.engine
        sched = eng.sched
        stats = sched.stats
        go = floatToGoString
        usage = go(sched.pool.usage())
        deferred = len(sched.transferring)
        cached, transferred = stats.prompt_cached, stats.prompt_transferred
        running, waiting = loras if loras else ((), ())
        lora_line = self._lora_prefix + labels(
            {
                **self._base,
                "max_lora": str(eng.cfg.max_loras),
                "running_lora_adapters": ",".join(running),
                "waiting_lora_adapters": ",".join(waiting),
            }
        )
        values = [
            go(sched.num_running),
            go(sched.num_waiting),
            go(sched.num_waiting - deferred),
            go(deferred),
            usage,
            usage,
            go(stats.prefix_queries),
            go(stats.prefix_hits),
            go(stats.prefix_queries),
            go(stats.prefix_hits),
            go(stats.preemptions),
            go(stats.prompt_tokens),
            go(stats.generation_tokens),
            go(cached),
            go(stats.prompt_tokens - cached - transferred),
            go(cached),
            go(transferred),
            *((go(stats.prompt_uncached), go(transferred)) if self.connector else ()),
            *[go(n) for n in self.success.values()],
            f"{lora_line} {go(time.time())}\n",
            *[h.text() for h in self._hist_texts],
        ]
        return self._template.format(*values)

    def _build_page(self) -> tuple[str, list[HistogramText]]:
        """The page's template (fixed text, ``{}`` for each value ``_fill`` supplies, in the
        same order) and the histogram families, in vLLM's order."""
        cfg = self.engine.cfg
        base = self._base
        lab = labels(base)
        created = floatToGoString(self.created)
        t = Template()

        def gauge(name: str, doc: str) -> None:
            t.text(header(name, doc, "gauge") + f"{name}{lab} ")
            t.slot()
            t.text("\n")

        def counter(name: str, doc: str, series: Sequence[dict[str, str]] = ({},)) -> None:
            sets = [labels({**base, **extra}) for extra in series]
            t.text(header(name + "_total", doc, "counter"))
            for ls in sets:
                t.text(f"{name}_total{ls} ")
                t.slot()
                t.text("\n")
            t.text(header(name + "_created", doc, "gauge"))
            t.text("".join(f"{name}_created{ls} {created}\n" for ls in sets))

        gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        name = "vllm:num_requests_waiting_by_reason"
        t.text(
            header(
                name,
                "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
                "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA "
                "budget, KV transfer, blocked status). Sum of all reasons equals "
                "vllm:num_requests_waiting.",
                "gauge",
            )
        )
        for reason in ("capacity", "deferred"):
            t.text(f"{name}{labels({**base, 'reason': reason})} ")
            t.slot()
            t.text("\n")
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        gauge(
            "vllm:gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use "
            "vllm:kv_cache_usage_perc instead.",
        )
        for name, doc in (
            ("vllm:prefix_cache_queries",
             "Prefix cache queries, in terms of number of queried tokens."),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
            ("vllm:gpu_prefix_cache_queries",
             "GPU prefix cache queries, in terms of number of queried tokens. DEPRECATED."),
            ("vllm:gpu_prefix_cache_hits",
             "GPU prefix cache hits, in terms of number of cached tokens. DEPRECATED."),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
            ("vllm:prompt_tokens", "Number of prefill tokens processed."),
            ("vllm:generation_tokens", "Number of generation tokens processed."),
            ("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."),
        ):  # fmt: skip
            counter(name, doc)
        counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            [{"source": s} for s in ("local_compute", "local_cache_hit", "external_kv_transfer")],
        )
        if self.connector:  # vLLM has these only with a KV connector (--kv-transfer-config)
            counter(
                "vllm:external_prefix_cache_queries",
                "External prefix cache queries from KV connector cross-instance cache "
                "sharing, in terms of number of queried tokens.",
            )
            counter(
                "vllm:external_prefix_cache_hits",
                "External prefix cache hits from KV connector cross-instance cache sharing, "
                "in terms of number of cached tokens.",
            )
        counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [{"finished_reason": r} for r in self.success],
        )
        t.text(header("vllm:lora_requests_info", "Running stats on lora requests.", "gauge"))
        t.slot()  # labels name the adapters; the value is the time of the last change
        info = {
            "block_size": str(cfg.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": str(cfg.enable_prefix_caching),
            "gpu_memory_utilization": "0.9",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(cfg.num_blocks),
        }
        name = "vllm:cache_config_info"
        t.text(
            header(name, "Information of the LLMEngine CacheConfig", "gauge")
            + f"{name}{labels({**base, **info})} 1.0\n"
        )
        texts = []
        for hist, name, doc in self._histogram_families():
            texts.append(HistogramText(hist, name, doc, hist.bounds, base, self.created))
            t.slot()
        return t.compile(), texts

    def _histogram_families(self) -> list[tuple[Histogram, str, str]]:
        return [
            (self.ttft, "vllm:time_to_first_token_seconds",
             "Histogram of time to first token in seconds."),
            (self.itl, "vllm:inter_token_latency_seconds",
             "Histogram of inter-token latency in seconds."),
            (self.itl, "vllm:time_per_output_token_seconds",
             "Histogram of time per output token in seconds. DEPRECATED: Use "
             "vllm:inter_token_latency_seconds instead."),
            (self.e2e, "vllm:e2e_request_latency_seconds",
             "Histogram of e2e request latency in seconds."),
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
        ]  # fmt: skip
