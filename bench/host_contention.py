"""A contended host against a healthy calibration: healthy runs of the diagnosis bench's tp2 layout
(probe/bench/diagnosis.py), alternately quiet and beside one spinning process (A B A B ...), each
analyzed against one quiet calibration run. Per run: the other work the host telemetry measured
(cores), the transfer's fastest tenth over the calibration's (the slow-transfer evidence), the cause
named, and whether a slower transport was withheld because the host was contended.

    python bench/host_contention.py [--pairs 5] [--backend dda] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    from commprobe.analyzers.analysis import analyze
    from commprobe.probe.bench.diagnosis import _phase, _run

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--backend", default="dda")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="commprobe-contention-"))
    print(f"runs in {root}", flush=True)
    _run("tp2", a.backend, None, root / "calibration", 120)
    rows = []
    for i in range(a.pairs):
        for busy in (False, True):
            d = root / f"{i}-{'busy' if busy else 'quiet'}"
            spin = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            try:
                _run("tp2", a.backend, None, d, 120)
            finally:
                if spin:
                    spin.kill()
                    spin.wait()
            c = _phase(analyze(d, calibration=root / "calibration"), "tp2")["communication_cause"]
            rows.append({"run": d.name, "busy": busy, "other_cores": c["host"]["other_cores"],
                         "contended": c["host"]["contended"], "floor_ratio": c.get("transfer_floor_vs_baseline"),
                         "cause": c["cause"], "withheld": "slow_transfer_withheld" in c})
            r = rows[-1]
            print(f"{r['run']:>8}  other work {r['other_cores']:.2f} cores  contended {r['contended']!s:5}  "
                  f"floor {r['floor_ratio'] or 0:.2f}x  cause {r['cause']:<13} withheld {r['withheld']}", flush=True)
    for busy in (False, True):
        sel = [r for r in rows if r["busy"] == busy]
        print(f"{'beside a busy process' if busy else 'quiet':>22}: other work {min(r['other_cores'] for r in sel):.2f}-"
              f"{max(r['other_cores'] for r in sel):.2f} cores, floor ratio median "
              f"{statistics.median(r['floor_ratio'] or 0 for r in sel):.2f}x "
              f"({min(r['floor_ratio'] or 0 for r in sel):.2f}-{max(r['floor_ratio'] or 0 for r in sel):.2f}), "
              f"slow transfer withheld {sum(r['withheld'] for r in sel)} of {len(sel)}, named "
              f"{sum(r['cause'] == 'slow-transfer' for r in sel)}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
