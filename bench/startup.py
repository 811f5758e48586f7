"""Whole-process `commprobe analyze TRACE --json` time: wall and CPU (user + sys of the child),
for one or more Python environments side by side (A B A B ..., medians), plus where the
start-up goes (`-X importtime`, the largest top-level imports of the last environment).

    python bench/startup.py TRACE [--python /other/venv/bin/python ...] [--hta /hta/venv/bin/python] [--rounds 9]

The current interpreter is always the last side. With --hta, HTA's whole process (import, parse,
get_comm_comp_overlap) on the same trace is a side too. Used for the issue's goals "a 15 MB trace
analysed in well under half a second end to end" and "whole-process analyze >= 10x HTA's".
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HTA = """
import logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1]).get_comm_comp_overlap(visualize=False)
"""


def command(side: str, trace: str, hta_dir: str) -> list[str]:
    if side.startswith("hta:"):
        return [side[4:], "-c", HTA, hta_dir]
    return [side, "-m", "commprobe.probe.cli", "analyze", trace, "--json", "--jobs", "1"]


def once(cmd: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def imports(python: str, trace: str, top: int = 12) -> list[tuple[float, str]]:
    r = subprocess.run([python, "-X", "importtime", "-m", "commprobe.probe.cli", "analyze", trace, "--json", "--jobs",
                        "1"], capture_output=True, text=True, check=True)
    rows = []
    for line in r.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)", line)
        if m and len(m.group(2)) <= 2:  # top level and its direct children
            rows.append((int(m.group(1)) / 1000, m.group(2) + m.group(3)))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--python", action="append", default=[], help="another environment's interpreter (A side)")
    ap.add_argument("--hta", help="an interpreter with HolisticTraceAnalysis installed")
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args()
    sides = [*([f"hta:{a.hta}"] if a.hta else []), *a.python, sys.executable]
    with tempfile.TemporaryDirectory() as hta_dir:  # HTA reads a directory of rank traces
        os.symlink(os.path.abspath(a.trace), os.path.join(hta_dir, os.path.basename(a.trace)))
        for p in sides:
            once(command(p, a.trace, hta_dir))  # warm the page cache and the compiled scanner
        walls: dict[str, list[float]] = {p: [] for p in sides}
        cpus: dict[str, list[float]] = {p: [] for p in sides}
        for _ in range(a.rounds):
            for p in sides:
                w, c = once(command(p, a.trace, hta_dir))
                walls[p].append(w)
                cpus[p].append(c)
    print("| whole process | wall s median (best) | CPU s median (best) |")
    print("|---|---|---|")
    for p in sides:
        print(f"| {p} | {statistics.median(walls[p]):.3f} ({min(walls[p]):.3f}) | "
              f"{statistics.median(cpus[p]):.3f} ({min(cpus[p]):.3f}) |")
    print(f"\nlargest imports ({sides[-1]}), ms cumulative:")
    for ms, name in imports(sides[-1], a.trace):
        print(f"  {ms:7.1f}  {name}")


if __name__ == "__main__":
    main()
