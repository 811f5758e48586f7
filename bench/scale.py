"""How analysis scales with ranks: --jobs 1 against --jobs 2 against a real local Dask cluster
(2 workers), side by side (A B C A B C ..., medians of whole `commprobe analyze` commands), the
three JSONs compared, and the driver's peak RSS on many small ranks against one rank's.

    python bench/scale.py [--ranks 32] [--mb-per-rank 30] [--rounds 3] [--many 256]

Needs `pip install 'commprobe[cluster]'`. The set is bench/rankset.py's (known truth), written
to a temporary directory and removed at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hostile import PROBE  # noqa: E402  (peak RSS from VmHWM, as every bench here)
from rankset import generate  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.test_scale import _dask_cluster, _stop  # noqa: E402  (the same cluster the test starts)


def analyze_cmd(path: Path, *extra: str) -> tuple[float, dict, int]:
    """Seconds of a whole `commprobe analyze --json`, its result, and the driver's peak RSS (bytes)."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", PROBE, "analyze", str(path), "--json", *extra],
                       capture_output=True, text=True, timeout=3600)
    dt = time.perf_counter() - t
    if r.returncode:
        raise SystemExit(r.stderr[-2000:])
    rss = int(r.stderr.strip().splitlines()[-1].split()[1]) * 1024
    doc = json.loads(r.stdout)
    doc.pop("elapsed_s")
    return dt, doc, rss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--mb-per-rank", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--many", type=int, default=256, help="ranks of the small-rank set for the driver's memory")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="commprobe-scale-"))
    procs = []
    try:
        t = time.perf_counter()
        info = generate(tmp / "set", args.ranks, args.mb_per_rank, straggler=5, steps=50)
        print(f"generated {args.ranks} ranks, {info['bytes'] / 1e6:.0f} MB in {time.perf_counter() - t:.0f} s", flush=True)
        address, procs = _dask_cluster(tmp)
        modes = {"jobs 1": ["--jobs", "1"], "jobs 2": ["--jobs", "2"], "dask 2 workers": ["--scheduler", address]}
        times: dict[str, list[float]] = {m: [] for m in modes}
        docs = {}
        for _ in range(args.rounds):
            for m, extra in modes.items():
                dt, docs[m], _ = analyze_cmd(tmp / "set", *extra)
                times[m].append(dt)
        same = all(d == docs["jobs 1"] for d in docs.values())
        med = {m: statistics.median(v) for m, v in times.items()}
        print("\n| mode | runs (s) | median s | MB/s | vs jobs 1 |\n|---|---|---|---|---|")
        for m, v in times.items():
            print(f"| {m} | {', '.join(f'{x:.2f}' for x in v)} | {med[m]:.2f} | {info['bytes'] / 1e6 / med[m]:.0f} | "
                  f"{med['jobs 1'] / med[m]:.2f}× |")
        print(f"\nJSON identical across the three modes: {same}; straggler {docs['jobs 1']['collectives']['straggler']}")
        small = generate(tmp / "many", args.many, 0.2, straggler=3, steps=10)
        one = tmp / "one"
        one.mkdir()
        shutil.copy(tmp / "many" / "rank0.trace.json", one / "rank0.trace.json")
        _, _, rss_one = analyze_cmd(one, "--jobs", "1")
        _, _, rss_many = analyze_cmd(tmp / "many", "--jobs", "2")
        print(f"\ndriver peak RSS: one rank {rss_one / 1e6:.0f} MB; {args.many} ranks "
              f"({small['bytes'] / 1e6:.0f} MB) with --jobs 2 {rss_many / 1e6:.0f} MB ({rss_many / rss_one:.2f}×)")
    finally:
        _stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
