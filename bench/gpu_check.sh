#!/usr/bin/env bash
# Run bench/gpu_check.py on a lent GPU machine (the `device` tool), in one call.
# That machine has torch, numpy, rich, pytest and nvidia-ml-py but not msgspec, typer, plotly,
# isal or safetensors, and reaches no registry: fetch those as wheels here first, into .whl/
# (ignored by git, so pass it in `carry`):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#       msgspec typer plotly isal safetensors click shellingham typing_extensions narwhals packaging
# then run:  device run  command="bash bench/gpu_check.sh"  carry=[".whl"]  timeout_s=540
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --find-links .whl --no-deps msgspec typer plotly isal safetensors \
    click shellingham narwhals 2>&1 | tail -2 || true
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2 || true  # commprobe.* names
export PYTHONPATH="$PWD" OUT="${OUT:-$PWD/gpu-check}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 bench/gpu_check.py 2>&1 | tee "$OUT/gpu_check.log"
python3 bench/gpu_graph_check.py 2>&1 | tee "$OUT/gpu_graph_check.log"
