"""Several gateway processes on one port with one routing state (``llmplane gateway
--workers N``): ``supervisor.py`` forks and replaces them, ``share.py`` is what they share
(``inflight.py`` counts, ``buckets.py`` token buckets, ``metrics.py`` one /metrics). See
docs/gateway.md, "Workers"."""
