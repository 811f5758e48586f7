"""The interval every prediction carries, from the calibration's own run-to-run spread (issue 58).

A `commprobe calibrate` directory holds K rounds of the same job under each backend. Each round's
run of backend A predicts its run of B beside it, calibrated on the other K-1 rounds (never on the
round predicted): K errors (measured / predicted) per pair and phase, made exactly as a user's
prediction is made. A later prediction P from that calibration carries the interval

    P x exp(mean +- t(0.95, K-1) x sd x sqrt(1 + 1/K))      (log errors; a 90 % prediction interval)

which holds where the errors are log-normal and the machine stays as it was while calibrated; the
mean of the errors (a bias) moves the interval, not the prediction. Under three errors no interval
is given: the spread of two is not an estimate. A calibration that is not a `calibrate` directory
(one bundle per backend, a sweep) gives no interval, and the prediction says so.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from commprobe.analyzers import calibration as readcal
from commprobe.common.bundle import read_manifest, sub_bundles, unprofiled_medians
from commprobe.common.errors import InputError

LEVEL = 0.90
MIN_ERRORS = 3
# Student's t, one-sided 0.95 (a two-sided 90 % interval), by degrees of freedom
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812,
        12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697}
RULE = (f"{LEVEL:.0%} prediction interval from the calibration's rounds: each round's run of one backend predicted "
        "from the other rounds against its measured run of the other backend; the log errors' mean +- t x sd x "
        "sqrt(1 + 1/K)")
THIN = ("no interval: the calibration holds no repeated rounds of this job under both backends, too thin to say "
        "how far the prediction can be off (a single run per backend carries that run's noise into the prediction "
        "unseen); "
        "`commprobe calibrate --backend {own},{target}` with this job's options runs them")


def t95(df: int) -> float:
    """t(0.95, df): the table's value at the largest tabulated df not above it (the wider one), and
    toward the normal's 1.645 beyond 30."""
    if df > 30:
        return 1.645 + (_T95[30] - 1.645) * 30 / df
    return _T95[max((k for k in _T95 if k <= df), default=1)]


def interval(predicted: float, errors: list[float]) -> tuple[float, float] | None:
    """(low, high) around `predicted` from errors (measured / predicted); None under MIN_ERRORS."""
    logs = [math.log(e) for e in errors if e > 0]
    k = len(logs)
    if k < MIN_ERRORS:
        return None
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = t95(k - 1) * sd * math.sqrt(1 + 1 / k)
    return predicted * math.exp(mean - half), predicted * math.exp(mean + half)


def _rounds(root: Path, doc: dict) -> list[dict[str, Path]]:
    """Per round, {backend: its one-backend bundle}."""
    out = []
    for r in doc["rounds"]:
        d = root / r["dir"]
        subs = sub_bundles(read_manifest(d)) or {}
        out.append({b: d / s for b, s in subs.items()})
    return out


def cross_validate(root: str | Path) -> dict:
    """Per pair "A->B" and phase: each round's prediction of B from its A run, calibrated on the
    other rounds, beside B's measured un-profiled time in that round."""
    from commprobe.analyzers.analysis import analyze
    from commprobe.analyzers.whatif import predict

    root = Path(root)
    doc = readcal.calibrate_doc(root)
    if doc is None:
        return {}
    rounds = _rounds(root, doc)
    pairs: dict[str, dict[str, list[dict]]] = {}
    for i, runs in enumerate(rounds):
        others = ",".join(str(root / r["dir"]) for j, r in enumerate(doc["rounds"]) if j != i)
        for a, src in runs.items():
            for b, dst in runs.items():
                if a == b:
                    continue
                try:
                    pred = predict(analyze(src, calibration=others), src, f"backend={b}")
                except InputError:
                    continue
                measured = unprofiled_medians(dst)
                for ph, row in pred["phases"].items():
                    m, p = measured.get(row.get("metric")), row.get("predicted_ms")
                    if m and p:
                        calls = row.get("from_calls_ms") or (p if row.get("basis") == "calls" else None)
                        pairs.setdefault(f"{a}->{b}", {}).setdefault(ph, []).append(
                            {"round": i + 1, "basis": row.get("basis"), "predicted_ms": p, "measured_ms": m,
                             "error": m / p, "calls_predicted_ms": calls, "calls_error": m / calls if calls else None})
    summary = {pair: {ph: _summary(rows) for ph, rows in by.items()} for pair, by in pairs.items()}
    return {"rule": "each round predicted from the other rounds (never from itself)", "pairs": pairs,
            "summary": summary}


def _summary(rows: list[dict]) -> dict:
    """A pair's phase over the rounds: the median error (measured / predicted - 1) and the interval
    a prediction from this calibration carries, relative to it (None under MIN_ERRORS)."""
    errors = [r["error"] for r in rows]
    iv = interval(1.0, errors)
    return {"rounds": len(errors), "median_error": statistics.median(errors) - 1,
            "within_10pct": sum(abs(e - 1) <= 0.10 for e in errors),
            "relative_interval": None if iv is None else [iv[0] - 1, iv[1] - 1]}


def attach(doc: dict, calibration, kind: str) -> dict:
    """Give each phase of a prediction `low_ms` and `high_ms` (None where the calibration cannot
    tell), `interval` (how it was made) and a note where it is missing. `kind`: the switch's kind
    (a layout change or one op switched is not what the rounds cross-validated)."""
    docs = readcal.calibrate_docs(calibration)
    own = doc.get("own_backend")
    target = (doc.get("switch") or {}).get("backend")
    # the errors of the rule each phase was predicted by: its calibration's measured median (the
    # rounds' own "error" where they were predicted so), or the calls' figure ("calls_error")
    errors: dict[tuple[str, str], list[float]] = {}
    rounds = 0
    for _, d in docs:
        rounds += len(d.get("rounds") or [])
        for ph, rows in ((d.get("cross_validation") or {}).get("pairs") or {}).get(f"{own}->{target}", {}).items():
            for r in rows:
                if r.get("basis") == "measured" and r.get("error"):
                    errors.setdefault((ph, "measured"), []).append(float(r["error"]))
                if r.get("calls_error"):
                    errors.setdefault((ph, "calls"), []).append(float(r["calls_error"]))
    usable = kind == "backend" and (doc.get("switch") or {}).get("what") == "backend"
    missing = False
    for ph, row in doc["phases"].items():
        p = row.get("predicted_ms")
        errs = errors.get((ph, row.get("basis") or "calls"), [])
        iv = interval(p, errs) if usable and p else None
        row["low_ms"], row["high_ms"] = iv if iv else (None, None)
        row["interval"] = ({"level": LEVEL, "errors": len(errs), "rounds": rounds, "basis": row.get("basis"),
                            "rule": RULE} if iv else None)
        missing |= bool(p) and iv is None
    if missing:
        if not usable:
            why = ("no interval: a layout change is not what the calibration's rounds cross-validate"
                   if kind == "layout" else "no interval: one op switched is not what the calibration's rounds "
                   "cross-validate (a whole backend is)")
        elif docs:
            why = (f"no interval for some phases: the calibration's rounds give fewer than {MIN_ERRORS} predictions of "
                   f"{target} from {own} there")
        else:
            why = THIN.format(own=own or "A", target=target or "B")
        doc.setdefault("notes", []).append(why)
    return doc


__all__ = ["interval", "cross_validate", "attach", "RULE", "LEVEL"]
