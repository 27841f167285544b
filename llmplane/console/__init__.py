"""The web console: static files served by the gateway and the JSON they read (api.py), the
fleet picture it shares with ``llmplane up``'s status line (fleet.py), and per-second request
statistics for its charts (stats.py)."""
