"""Check the README's two commands, as a user runs them (issue 58): `commprobe calibrate`, then a
fresh run of the job (`commprobe profile --backend gloo,dda`, both backends in one launch) whose
gloo half predicts its dda half (`plan --from RUN/gloo --what-if backend=dda --calibration CAL`)
and the other way round; per try, whether the prediction is within --goal of the measured TTIT
median and whether its interval holds it. Tries are fresh: each calibrates anew.

K (`calibrate --rounds`) is chosen from the same tries: each calibration runs --rounds rounds, and
its first k rounds (k in --ks) are scored as a calibration of k rounds (their own cross-validation,
written into a directory of links to those rounds), so every k is scored on the same runs.

    python bench/calibrate_check.py [--tries 5] [--rounds 7] [--runs 3] [--ks 3,5,7] [--goal 0.10] [--keep DIR] [--json OUT]

Runs the CLI in subprocesses (the installed entry point, as a user would). Time nothing else
beside it on the same cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

JOB = ["--preset", "tiny", "--tp", "2", "--steps", "16", "--prompt-len", "16", "--repeats", "10"]
PHASE, METRIC = "decode", "ttit"


def cli(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "commprobe.probe.cli", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"commprobe {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    return r


def subset(cal: Path, k: int) -> Path:
    """A calibration of `cal`'s first k rounds: links to them and their own cross-validation."""
    from commprobe.plan.intervals import cross_validate
    from commprobe.probe.calibrate import Calibration, write

    doc = json.loads((cal / "calibration.json").read_text())
    out = cal.parent / f"{cal.name}-k{k}"
    if out.exists():
        return out
    out.mkdir()
    for r in doc["rounds"][:k]:
        (out / r["dir"]).symlink_to((cal / r["dir"]).resolve())
    c = Calibration(job=doc["job"], backends=doc["backends"], rounds=k, done=doc["rounds"][:k])  # cut to k rounds
    write(out, c, "ok")
    write(out, c, "ok", cross_validate(out))
    return out


def one_try(work: Path, rounds: int, ks: list[int], runs: int) -> list[dict]:
    """Calibrate, then `runs` fresh launches of the job under both backends; each launch's run of
    one backend predicts the other's, from the calibration's first k rounds."""
    from commprobe.common.bundle import unprofiled_medians

    cal = work / "cal"
    if not (cal / "calibration.json").is_file():
        cli("calibrate", *JOB, "--backend", "gloo,dda", "--rounds", str(rounds), "--out", str(cal))
    launches = []
    for j in range(runs):
        run = work / f"run{j + 1}"
        if not (run / "manifest.json").is_file():
            cli("profile", *JOB, "--backend", "gloo,dda", "--out", str(run))
        launches.append(run)
    rows = []
    for k in ks:
        c = cal if k == rounds else subset(cal, k)
        for src, dst in (("gloo", "dda"), ("dda", "gloo")):
            for j, run in enumerate(launches):
                doc = json.loads(cli("plan", "--from", str(run / src), "--what-if", f"backend={dst}", "--calibration",
                                     str(c), "--json").stdout)
                p = doc["phases"][PHASE]
                rows.append({"k": k, "from": src, "to": dst, "run": j + 1, "basis": p.get("basis"),
                             "predicted_ms": p["predicted_ms"], "low_ms": p["low_ms"], "high_ms": p["high_ms"],
                             "from_calls_ms": p.get("from_calls_ms"), "measured_ms": unprofiled_medians(run / dst)[METRIC]})
    return rows


def _inside(r: dict, x: float) -> bool:
    return r["low_ms"] is not None and r["low_ms"] <= x <= r["high_ms"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=3, help="Fresh measured launches per try.")
    ap.add_argument("--ks", default="3,5,7")
    ap.add_argument("--goal", type=float, default=0.10)
    ap.add_argument("--keep")
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args()
    ks = sorted({int(k) for k in a.ks.split(",") if int(k) <= a.rounds})
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="commprobe-calcheck-"))
    rows = []
    for t in range(a.tries):
        d = work / f"try{t + 1}"
        d.mkdir(parents=True, exist_ok=True)
        got = one_try(d, a.rounds, ks, a.runs)
        for r in got:  # the try's truth: the target's median over its fresh launches
            r["try"] = t + 1
            r["truth_ms"] = statistics.median(x["measured_ms"] for x in got if x["k"] == r["k"] and x["to"] == r["to"])
            iv = "–" if r["low_ms"] is None else f"{r['low_ms']:.3f}-{r['high_ms']:.3f}"
            print(f"try {t + 1} k={r['k']} run {r['run']} {r['from']} -> {r['to']} ({r['basis']}): predicted "
                  f"{r['predicted_ms']:.3f} ms ({iv}; calls {r['from_calls_ms'] or 0:.3f}), measured {r['measured_ms']:.3f}, "
                  f"median of the try's runs {r['truth_ms']:.3f}", flush=True)
        rows.extend(got)
    print(f"\n| k | switch | one run: within {a.goal:.0%} | one run: inside the interval | median of the try's "
          f"predictions vs its runs' median: within {a.goal:.0%} | errors (per try) | interval holds that median |")
    print("|---|---|---|---|---|---|---|")
    for k in ks:
        for src, dst in (("gloo", "dda"), ("dda", "gloo")):
            sel = [r for r in rows if r["k"] == k and r["from"] == src]
            one = sum(abs(r["predicted_ms"] / r["measured_ms"] - 1) <= a.goal for r in sel)
            inside = sum(_inside(r, r["measured_ms"]) for r in sel)
            tries = sorted({r["try"] for r in sel})
            errs, holds = [], 0
            for t in tries:
                mine = [r for r in sel if r["try"] == t]
                pred = statistics.median(r["predicted_ms"] for r in mine)
                errs.append(pred / mine[0]["truth_ms"] - 1)
                holds += _inside(sorted(mine, key=lambda r: r["predicted_ms"])[len(mine) // 2], mine[0]["truth_ms"])
            within = sum(abs(e) <= a.goal for e in errs)
            print(f"| {k} | {src} → {dst} | {one}/{len(sel)} | {inside}/{len(sel)} | {within}/{len(tries)} | "
                  f"{', '.join(f'{e:+.0%}' for e in errs)} | {holds}/{len(tries)} |")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(rows, indent=1))
    print(f"bundles: {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
