"""Simulated vLLM model server: vLLM's API, metrics and engine behaviour without a GPU.

Run it with ``python -m llmplane.sim --model NAME --port 0`` (see docs/sim.md).
"""
