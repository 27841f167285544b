"""llmplane: declare LLMs in YAML, run their model servers, route OpenAI traffic to the best replica."""

from pathlib import Path as _Path

from llmplane import native as _native

__version__ = "0.1.0"

# The gateway's hot path compiled by Cython when built from the current sources (llmplane/native.py).
_native.install(__name__, _Path(__file__).parent)
