"""Analyses of a fixed list of inputs, written as JSON with the elapsed time removed, so a
refactor can be checked byte for byte: run it before and after into two directories and diff
them (`diff -r`). Inputs: the shared real traces, a generated rank set (bench/rankset.py) and
whatever run bundles are named on the command line.

    python bench/analysis_snapshot.py OUT_DIR [EXTRA_INPUT ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from commprobe.analyzers.analysis import analyze

SHARED = Path(__file__).resolve().parents[1] / "tests" / "data" / "traces"
INPUTS = [
    SHARED / "facebookresearch-param",
    SHARED / "hta" / "nccl_parser_config_nccl_data.json.gz",
    SHARED / "hta" / "trace_filter_sampled_rank-0.json.gz",
    SHARED / "hta" / "amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    SHARED / "hta" / "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    SHARED / "hpcgroup-pipit" / "perlmutter-cloverleaf-cuda.sqlite",
    SHARED / "hpcgroup-pipit" / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite",
]


def _strip(o):
    if isinstance(o, dict):
        return {k: _strip(v) for k, v in o.items() if k != "elapsed_s"}
    if isinstance(o, list):
        return [_strip(v) for v in o]
    return o


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for p in [*INPUTS, *map(Path, sys.argv[2:])]:
        name = p.name.replace(".", "_")
        try:
            res = _strip(analyze(p))
        except Exception as e:  # noqa: BLE001 - recorded: a refusal must stay the same refusal
            res = {"error": f"{type(e).__name__}: {e}"}
        (out / f"{name}.json").write_text(json.dumps(res, indent=1, sort_keys=True, default=str))
        print(p, "error" if "error" in res else "ok")


if __name__ == "__main__":
    main()
