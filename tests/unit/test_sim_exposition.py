"""The sim's hand-built Prometheus text (``sim/exposition.py``) is what prometheus_client
writes for the same family, byte for byte: a histogram with escaped HELP and label values,
empty, observed, and again after more observations (its cached text must follow)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Histogram as ClientHistogram

from llmplane.sim.exposition import HistogramText
from llmplane.sim.metrics import TTFT_BUCKETS, Histogram

NAME = "vllm:time_to_first_token_seconds"
DOC = 'Histogram of time "to" first\\token\nin seconds.'
LABELS = {"engine": "0", "model_name": 'm"x\\y\nz'}


def test_histogram_text_is_prometheus_clients_byte_for_byte() -> None:
    registry = CollectorRegistry()
    reference = ClientHistogram(
        NAME, DOC, list(LABELS), buckets=TTFT_BUCKETS, registry=registry
    ).labels(**LABELS)
    ours = Histogram(TTFT_BUCKETS)
    text = HistogramText(ours, NAME, DOC, TTFT_BUCKETS, LABELS, reference._created)
    assert text.text() == generate_latest(registry).decode()
    for batch in ((0.0005, 0.003, 0.2, 0.2), (3.0, 5000.0, 0.001)):
        for value in batch:
            reference.observe(value)
            ours.observe(value)
        assert text.text() == generate_latest(registry).decode()
