"""commprobe's analyzers at another git ref (A) against this checkout (B), side by side.

    python bench/analyzer_ab.py --ref HEAD~1 [--rounds 5] [--generate-mb 200] [PATH ...]

For each input, A and B alternate (A B A B ..., `--rounds` each), every run in a fresh
process that imports only the analyzers (no editable-install hooks: `python -S` with the tree's
folders mapped to `commprobe.*` and site-packages on the path), timing `analyze()` (imports
excluded) and reading the process's peak RSS (VmHWM). Reports medians and B/A (of the medians,
the median of each round's ratio, the best runs' ratio, and CPU time's). The generated
input is bench/analyzer_vs_hta.py's 8-rank set. Used to hold a change to "within 10 % of
before" on speed and memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("analyzers", "common")

CHILD = """
import json, sys, time
from commprobe.analyzers.analysis import analyze
t, c = time.perf_counter(), time.process_time()
r = analyze(sys.argv[1])
dt, dc = time.perf_counter() - t, time.process_time() - c
hwm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
import commprobe.analyzers as a
print(json.dumps({"s": dt, "cpu": dc, "rss": hwm, "bytes": r["source"]["uncompressed_bytes"], "from": a.__path__[0]}))
"""


def shim(tree: Path, where: Path) -> Path:
    """A folder whose commprobe/ maps the tree's package folders (namespace package, no hooks)."""
    pkg = where / "commprobe"
    pkg.mkdir(parents=True)
    for p in PACKAGES:
        if (tree / p).is_dir():
            (pkg / p).symlink_to(tree / p)
    return where


def run(shim_dir: Path, path: Path) -> dict:
    env_path = ":".join([str(shim_dir), *site.getsitepackages()])
    r = subprocess.run([sys.executable, "-S", "-c", CHILD, str(path)], capture_output=True, text=True,
                       env={"PYTHONPATH": env_path, "HOME": str(Path.home()), "PATH": os.environ.get("PATH", "")},
                       timeout=3600)
    if r.returncode:
        raise SystemExit(f"analyze failed under {shim_dir}: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", required=True, help="git ref of A (B is this checkout)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--generate-mb", type=float, default=0.0, help="also an 8-rank generated set of this many MB")
    ap.add_argument("paths", nargs="*")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="commprobe-ab-"))
    try:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tmp / "a"), args.ref], check=True)
        a, b = shim(tmp / "a", tmp / "shim-a"), shim(ROOT, tmp / "shim-b")
        paths = [Path(p) for p in args.paths]
        if args.generate_mb:
            sys.path.insert(0, str(ROOT / "bench"))
            from analyzer_vs_hta import generate

            gen = tmp / "generated"
            generate(gen, 8, args.generate_mb / 8)
            paths.append(gen)
        print("| input | MB | A s | B s | B/A time | paired | best | B/A CPU | A peak MB | B peak MB | B/A memory |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|")
        for p in paths:
            runs = {"A": [], "B": []}
            for _ in range(args.rounds):
                runs["A"].append(run(a, p))
                runs["B"].append(run(b, p))
            assert runs["A"][0]["from"] != runs["B"][0]["from"], "A and B loaded the same code"
            med = {k: (statistics.median(x["s"] for x in v), statistics.median(x["rss"] for x in v) / 1e6)
                   for k, v in runs.items()}
            mb = runs["B"][0]["bytes"] / 1e6
            # the machine's speed drifts: each round's B/A (runs side by side) and the best runs' ratio too
            paired = statistics.median(b["s"] / a["s"] for a, b in zip(runs["A"], runs["B"]))
            best = min(x["s"] for x in runs["B"]) / min(x["s"] for x in runs["A"])
            cpu = statistics.median(x["cpu"] for x in runs["B"]) / statistics.median(x["cpu"] for x in runs["A"])
            print(f"| {p.name} | {mb:.1f} | {med['A'][0]:.3f} | {med['B'][0]:.3f} | {med['B'][0] / med['A'][0]:.2f} | "
                  f"{paired:.2f} | {best:.2f} | {cpu:.2f} | {med['A'][1]:.0f} | {med['B'][1]:.0f} | "
                  f"{med['B'][1] / med['A'][1]:.2f} |", flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp / "a")], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
