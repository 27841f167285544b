"""The engines' KV-cache events (``events``), the gateway's subscriptions to them
(``subscriber``) and the index of the blocks each replica holds (``index``), which the
``precise-prefix-cache`` scorer reads."""
