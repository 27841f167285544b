"""``ollama://tag``: nothing to download here; the ollama engine pulls the tag itself.

The model path is the tag (llmaz renders it as the model name of ``ollama run``).
"""

from __future__ import annotations

from pathlib import Path


def tag_path(tag: str) -> Path:
    return Path(tag)
