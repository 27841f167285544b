"""The gateway's lock-free request-path metrics render as Prometheus text like
prometheus_client's own (parsed back with prometheus_client's parser); the access sink writes
whole lines."""

from __future__ import annotations

import os
import select

from prometheus_client.parser import text_string_to_metric_families

from llmplane.gateway.observability import AccessSink, GatewayMetrics
from llmplane.testing import eventually


def samples(m: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_counters_and_histograms_render_cumulative_buckets():
    m = GatewayMetrics()
    m.requests.labels("llama", "ModelRoute/default/r", "10.0.0.1:8000", "200").inc()
    m.requests.labels("llama", "ModelRoute/default/r", "10.0.0.1:8000", "200").inc()
    m.prompt_tokens.labels("llama").inc(12)
    for v in (0.004, 0.01, 0.3, 500.0):  # a bound itself falls in its own bucket (le)
        m.e2e.labels("llama").observe(v)
    m.scheduling.observe(0.00012)
    got = samples(m)
    labels = (("endpoint", "10.0.0.1:8000"), ("model", "llama"), ("route", "ModelRoute/default/r"), ("status", "200"))  # fmt: skip
    assert got[("llmplane_gateway_requests_total", labels)] == 2
    assert got[("llmplane_gateway_prompt_tokens_total", (("model", "llama"),))] == 12
    bucket = "llmplane_gateway_request_duration_seconds_bucket"
    assert got[(bucket, (("le", "0.005"), ("model", "llama")))] == 1
    assert got[(bucket, (("le", "0.01"), ("model", "llama")))] == 2
    assert got[(bucket, (("le", "0.25"), ("model", "llama")))] == 2
    assert got[(bucket, (("le", "0.5"), ("model", "llama")))] == 3
    assert got[(bucket, (("le", "160.0"), ("model", "llama")))] == 3
    assert got[(bucket, (("le", "+Inf"), ("model", "llama")))] == 4
    assert got[("llmplane_gateway_request_duration_seconds_count", (("model", "llama"),))] == 4
    assert (
        abs(got[("llmplane_gateway_request_duration_seconds_sum", (("model", "llama"),))] - 500.314)
        < 1e-9
    )
    sched = "llmplane_gateway_scheduling_duration_seconds_bucket"
    assert got[(sched, (("le", "0.0001"),))] == 0 and got[(sched, (("le", "0.0002"),))] == 1


def test_access_record_times_in_milliseconds_to_the_microsecond():
    from llmplane.gateway.context import RequestContext
    from llmplane.gateway.http_server import Headers, HttpRequest

    request = HttpRequest(None, "POST", "/v1/completions", "/v1/completions", Headers(), b"{}", "1.1", True, False)  # type: ignore[arg-type]  # fmt: skip
    ctx = RequestContext(request)
    ctx.waited, ctx.ttft = 0.0004995, 2.5
    record = ctx.access_record(0.0123456789, None, None)
    assert record["total_ms"] == 12.346 and record["queued_ms"] == 0.5
    assert record["ttft_ms"] == 2500.0 and "prompt_tokens" not in record


async def test_the_access_sink_writes_whole_lines_in_order_in_writes_of_at_most_pipe_buf():
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)  # (a pipe too full for a write fails the test, not hangs)
    sink = AccessSink(write)
    lines = [bytes([97 + i % 26]) * size for i in range(4) for size in (10, 700, 3000, 9000)]
    received = []

    def drain() -> None:  # each write as it arrived: at most PIPE_BUF, or one longer line
        while True:
            try:
                chunk = os.read(read, 1 << 16)
            except BlockingIOError:
                return
            assert len(chunk) <= select.PIPE_BUF or chunk.count(b"\n") == 1, len(chunk)
            assert chunk.endswith(b"\n")
            received.append(chunk)

    try:
        for line in lines:
            sink.add(line)
            drain()
        assert sink.timer is not None  # what fits in one write waits for the timer
        await eventually(lambda: sink.timer is None, 5, what="the timer's write")
        drain()
    finally:
        os.close(read)
        os.close(write)
    assert b"".join(received).split(b"\n") == [*lines, b""]
