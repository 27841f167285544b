"""The prefill signals the autoscaler reads per replica: prompt tokens the gateway sent that
have not had their first byte (counted per endpoint, every worker's sum, added up over
gateways) and the engine's time to first token from its histogram between two scrapes (held
while busy, 0 when idle, absent for an engine without the histogram)."""

from __future__ import annotations

import time

import pytest

from llmplane.gateway.registry import EndpointState
from llmplane.gateway.request import InferenceRequest
from llmplane.gateway.scheduler.framework import SchedulingContext
from llmplane.gateway.scheduler.precise_prefix import PROMPT_TOKENS
from llmplane.gateway.scraper import apply_metrics, parse_metrics
from llmplane.gateway.tokens import sent_prompt_tokens
from llmplane.gateway.workers.inflight import InflightTable
from llmplane.gateway.workers.scrapes import ScrapeTable, apply_row, encode_row
from llmplane.gateway.workers.shm import Locks
from llmplane.operator.signals import Snapshot
from llmplane.runtime.endpoint import Endpoint

LABELS = '{engine="0",model_name="tiny"}'


def vllm_page(waiting: int, running: int, ttft_sum: float | str, ttft_count: int) -> bytes:
    """The lines of a vLLM /metrics page the scraper reads, the TTFT histogram among them (its
    buckets too: they must not be taken for the sum or the count)."""
    return (
        f"# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{LABELS} {waiting}.0\n"
        f"vllm:num_requests_running{LABELS} {running}.0\n"
        f"vllm:kv_cache_usage_perc{LABELS} 0.1\n"
        f"# TYPE vllm:time_to_first_token_seconds histogram\n"
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.5",model_name="tiny"}} 1.0\n'
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="tiny"}} '
        f"{ttft_count}.0\n"
        f"vllm:time_to_first_token_seconds_count{LABELS} {ttft_count}.0\n"
        f"vllm:time_to_first_token_seconds_sum{LABELS} {ttft_sum}\n"
        f"vllm:time_to_first_token_seconds_created{LABELS} 1.7e9\n"
    ).encode()


def scrape(state: EndpointState, page: bytes, sent: int = 0, engine: str = "vllm") -> None:
    apply_metrics(state, parse_metrics(page, engine), time.monotonic(), sent)


def test_ttft_is_the_mean_of_the_first_tokens_since_the_scrape_before() -> None:
    state = EndpointState(Endpoint("10.0.0.1:8000", engine="vllm"))
    scrape(state, vllm_page(0, 0, 0.0, 0))
    assert state.ttft == 0.0  # reported, nothing yet
    scrape(state, vllm_page(2, 3, 0.0, 0), sent=5)
    assert state.ttft == 0.0  # busy, no first token yet: nothing to hold
    scrape(state, vllm_page(1, 3, 3.0, 2), sent=4)
    assert state.ttft == pytest.approx(1.5)  # two first tokens, 3 s between them
    scrape(state, vllm_page(1, 3, 3.0, 2), sent=4)
    assert state.ttft == pytest.approx(1.5)  # held while requests wait or run
    scrape(state, vllm_page(0, 1, 3.0, 2), sent=0)
    assert state.ttft == pytest.approx(1.5)  # held while one still runs
    scrape(state, vllm_page(0, 0, 3.5, 3), sent=0)
    assert state.ttft == pytest.approx(0.5)  # the one first token since then
    scrape(state, vllm_page(0, 0, 3.5, 3), sent=0)
    assert state.ttft == 0.0  # idle: never a stale reading that blocks scale-down
    scrape(state, vllm_page(0, 0, 3.5, 3), sent=1)
    assert state.ttft == 0.0  # a request just sent: nothing to hold either
    scrape(state, vllm_page(0, 1, 0.25, 1), sent=1)
    assert state.ttft == 0.0  # counters went back (a restart): from 0 again
    scrape(state, vllm_page(0, 1, 1.25, 2), sent=1)
    assert state.ttft == pytest.approx(1.0)


def test_an_engine_without_the_histogram_reports_no_ttft() -> None:
    state = EndpointState(Endpoint("10.0.0.1:8000", engine="llamacpp"))
    scrape(state, b"llamacpp:requests_processing 2\nllamacpp:requests_deferred 0\n", 2, "llamacpp")
    assert state.has_load_metrics and state.ttft == -1.0
    # vLLM's page without it (an older engine): not reported either.
    vllm = EndpointState(Endpoint("10.0.0.2:8000", engine="vllm"))
    scrape(vllm, vllm_page(0, 0, 0.0, 0))
    scrape(vllm, b"vllm:num_requests_running 0\n")
    assert vllm.ttft == -1.0
    # A broken or hostile page: NaN or Inf are no reading (never a replica count from them).
    for bad in ("NaN", "+Inf"):
        scrape(vllm, vllm_page(1, 1, 0.0, 0), sent=1)
        scrape(vllm, vllm_page(1, 1, bad, 1), sent=1)
        assert vllm.ttft == -1.0, bad
        scrape(vllm, vllm_page(1, 1, 1.0, 2), sent=1)
        assert vllm.ttft == 0.0, bad  # the first good page after it starts again


def test_ttft_reaches_the_workers_that_do_not_scrape() -> None:
    table = ScrapeTable(4)
    scraped = EndpointState(Endpoint("10.0.0.1:8000", engine="vllm"))
    scrape(scraped, vllm_page(0, 2, 0.0, 0), sent=2)
    scrape(scraped, vllm_page(0, 2, 2.4, 3), sent=2)
    table.write(1, encode_row(scraped))
    follower = EndpointState(Endpoint("10.0.0.1:8000", engine="vllm"))
    _, data = table.row(1).read(0)
    apply_row(follower, data)
    assert follower.ttft == pytest.approx(0.8)
    assert follower.kv_usage == 0.1  # the fields after it still in place


def test_prefill_tokens_are_every_workers_sum() -> None:
    table = InflightTable(2, 8, Locks())
    endpoint = Endpoint("10.0.0.1:8000")
    a, b = table.state(endpoint, 0), table.state(endpoint, 1)
    a.add_prefill_tokens(1500)
    b.add_prefill_tokens(700)
    assert (a.prefill_tokens, b.prefill_tokens) == (2200, 2200)
    b.add_prefill_tokens(-700)  # its first byte came back
    assert a.prefill_tokens == 1500
    b.add_prefill_tokens(300)
    table.clear(0)  # a reaped worker's requests died with it
    assert (a.prefill_tokens, b.prefill_tokens) == (300, 300)
    plain = EndpointState(endpoint)  # one process: its own count
    plain.add_prefill_tokens(42)
    assert plain.prefill_tokens == 42


def test_the_prompt_size_sent_is_estimated_without_parsing_more() -> None:
    prompt = "long prompt text " * 100  # 1,700 bytes
    body = f'{{"model": "tiny", "prompt": "{prompt}", "max_tokens": 2}}'.encode()
    request = InferenceRequest("/v1/completions", {}, body)
    assert sent_prompt_tokens(request, None) == -(-len(body) // 4)  # the body: not extracted
    assert request.prompt == prompt.encode()
    assert sent_prompt_tokens(request, None) == 425  # the prompt once extracted: 1,700 / 4
    sched = SchedulingContext("tiny")
    assert sent_prompt_tokens(request, sched) == 425
    sched.cache[PROMPT_TOKENS] = 391  # tokenized by the precise prefix scorer: exact
    assert sent_prompt_tokens(request, sched) == 391


def test_gateways_prefill_tokens_add_up_and_ttft_is_one_reading() -> None:
    """Each gateway counts the prompts it sent; TTFT is the engine's, read by each."""
    snapshot = Snapshot()
    for tokens, ttft in ((3000, 0.75), (1200, 0.5)):
        snapshot.add(
            {
                "workloads": {
                    "default/pd-prefill": {
                        "replicas": {"10.0.0.1:8080": {"prefill_tokens": tokens, "ttft": ttft}},
                        "requestsSeen": 1,
                        "held": 0,
                    }
                }
            }
        )
    assert snapshot.replica_signals("default/pd-prefill") == {
        "10.0.0.1:8080": {"prefill_tokens": 4200.0, "ttft": 0.75}
    }
