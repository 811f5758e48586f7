"""Why the collectives take their time: transfer (the collective itself) or skew (waiting for a
late rank), per phase and per communication category, with the rule that decided it.

A matched call's time splits into transfer (the last arriver's duration: it waited for no one)
and waiting (the rest of each earlier rank's duration; cross_rank/matching.py). Transfer is then
set against a **zero-skew baseline**: what a call of that op and size takes on this machine with
no one late, from a sweep (`commprobe bench collectives --json`, passed as `--calibration`) or,
where there is none, the trace's own fastest calls (10th percentile per op and size bucket). A
uniformly slower transport cannot be told from the trace alone (every call is slower, its p10
too): the rule names which baseline was used.

Classes (shares of the phase's exposed communication, averaged over ranks):
    transfer-dominated   transfer >= 2/3         skew-dominated   waiting >= 2/3
    mixed                neither                 inconclusive     under half the calls matched
                                                                  (one rank's trace, ranks missing)
Causes, flagged only above a bar measured against this machine's run-to-run noise
(`commprobe bench diagnosis`; docs/accuracy.md):
    skew           waiting >= SKEW_BAR of end-to-end time and one rank stands out as its cause (the
                   culprit, straggler.py: a lead over every other rank, beyond the noise); or, with no culprit, arrival jitter: waiting >= SPREAD_BAR,
                   >= 2/3 of the communication, and steady over the calls (coefficient of variation
                   <= STEADY_CV; the machine's own bursts, a few long waits, vary more). With two
                   ranks each pausing 0..D at random, waiting cannot pass 1/4 of the time.
    slow-transfer  the fastest tenth of the calls >= SLOW_RATIO x the calibration's fastest tenth at
                   their sizes (a slower transport raises the floor; noise moves the median), the
                   excess over the calibration's median >= SLOW_BAR of end-to-end time; only with a
                   calibration
The culprit's own time is compared with the other ranks' median per window (compute, other work,
copies, idle = time outside any recorded op): what it does while the others wait.
"""

from __future__ import annotations

import math

import numpy as np

from commprobe.common.vocab import CATEGORY_LABEL as LABEL
from commprobe.common.vocab import COMM_CATS

from . import straggler
from .straggler import stands_out

DOMINATES = 2 / 3
MIN_MATCHED = 0.5
SKEW_BAR = 0.25
SPREAD_BAR = 0.15
STEADY_CV = 1.75  # two ranks pausing 0..D at random before each call: waits vary with CV sqrt(2) = 1.41
SLOW_RATIO = 2.0
SLOW_BAR = 0.1
TRACE_PERCENTILE = 10
DOING = ("compute", "other", "memcpy", "idle")


def backend_of(manifest: dict | None, rows: list[dict]) -> str | None:
    b = (manifest or {}).get("backend")
    if isinstance(b, list):
        b = b[0] if len(b) == 1 else None
    if b:
        return str(b)
    names = {r["backend"] for r in rows}
    return names.pop() if len(names) == 1 else None


def lookup(rows: list[dict], backend: str, op: str, world: int, nbytes: np.ndarray,
           field: str = "time_us") -> np.ndarray:
    """Per call, the calibration's `field` at that size (log-log interpolation, clamped to the
    calibration's ends); NaN where it has no row for the op."""
    pts = [r for r in rows if r["backend"] == backend and r["op"] == op and (r["world"] in (0, world))]
    if not pts:
        return np.full(len(nbytes), np.nan)
    by = {}
    for r in pts:
        by.setdefault(r["bytes"], []).append(r.get(field) or r["time_us"])
    xs = np.log(np.array(sorted(by), float))
    ys = np.log(np.array([float(np.median(by[b])) for b in sorted(by)]))
    x = np.log(np.maximum(nbytes, 1.0))
    return np.where(np.isnan(nbytes), np.nan, np.exp(np.interp(x, xs, ys)))


def call_baselines(calls: dict, waits: dict, calibration: list[dict] | None,
                   manifest: dict | None) -> tuple[dict, dict, dict]:
    """Per rank, two arrays parallel to its calls: each call's zero-skew transfer time (the
    calibration's median at its size, µs; NaN where none is known) and its floor (the calibration's
    fastest tenth); and how they were found."""
    out = {r: np.full(len(c), np.nan) for r, c in calls.items()}
    floor = {r: np.full(len(c), np.nan) for r, c in calls.items()}
    backend = backend_of(manifest, calibration) if calibration else None
    if calibration and backend:
        for r, c in calls.items():
            if not len(c):
                continue
            ops = c.op()
            for op in set(ops.tolist()):
                sel = ops == op
                sizes = c.bytes[sel].astype(float)
                gs = int(np.median(c.group_size[sel])) if sel.any() else 0
                out[r][sel] = lookup(calibration, backend, op, gs or len(calls), sizes)
                floor[r][sel] = lookup(calibration, backend, op, gs or len(calls), sizes, "p10_us")
        return out, floor, {
            "source": "sweep", "backend": backend,
            "rule": f"zero-skew baseline: this machine's calibration of {backend} (a `commprobe bench collectives` "
                    f"sweep, or a healthy run of the same job), its median and its fastest tenth at each call's size"}
    # the trace's own fastest matched calls per (op, size bucket)
    samples: dict[tuple, list] = {}
    keyed = {}
    for r, c in calls.items():
        if not len(c):
            continue
        ops = c.op()
        bucket = np.where(c.bytes > 0, np.ceil(np.log2(np.maximum(c.bytes, 1))), -1).astype(np.int64)
        keyed[r] = list(zip(ops.tolist(), bucket.tolist()))
        if r in waits:
            for key, t in zip(keyed[r], waits[r][1].tolist()):
                if key[1] >= 0 and not math.isnan(t):  # a known size, a matched call
                    samples.setdefault(key, []).append(t)
    table = {k: float(np.percentile(v, TRACE_PERCENTILE)) for k, v in samples.items()}
    for r, keys in keyed.items():
        out[r] = np.array([table.get(k, np.nan) for k in keys], float)
        floor[r] = out[r].copy()
    why = "with no sweep of this machine" if not calibration else "the sweep names no backend of this trace"
    return out, floor, {
        "source": "trace", "backend": None,
        "rule": f"zero-skew baseline: this trace's own fastest calls ({TRACE_PERCENTILE}th percentile of transfer per "
                f"op and size bucket), {why}: a slower transport cannot be told from this machine's floor, so none "
                f"is flagged"}


FLOOR_BINS = 4  # per octave: the floor ratio's histogram, log2 from -8 to +8


def _empty() -> dict:
    return {"calls": 0, "matched": 0, "baseline_calls": 0, "log_ratio_sum": 0.0, "wait_sq_sum": 0.0,
            "floor_hist": {}, "wait_by_last": {}, "wait_by_last_sq": {}, "carried_us": 0.0}


def accumulate(rk: dict, phase: str, cat: str, sel: np.ndarray, waits: tuple, base: np.ndarray,
               floor: np.ndarray | None = None) -> None:
    """Add a rank's calls `sel` (in the phase's windows, of category `cat`) to its phase's
    `comm_calls[cat]`: calls, matched, transfer against the baseline (log ratios) and its floor
    (a histogram), and waiting per rank that caused it: the last arriver, and the waiter itself
    for the part it spent in the call after the last arriver had left (`held`, matching.match)."""
    acc = rk["phases"][phase].setdefault("comm_calls", {}).setdefault(cat, _empty())
    wait, transfer, last, held, carried = waits[:5]
    m = sel & ~np.isnan(transfer)
    acc["calls"] += int(sel.sum())
    acc["matched"] += int(m.sum())
    b = m & ~np.isnan(base) & (base > 0) & (transfer > 0)
    acc["baseline_calls"] += int(b.sum())
    acc["log_ratio_sum"] += float(np.log(transfer[b] / base[b]).sum())
    if floor is not None:  # each call's transfer over the calibration's floor at its size, binned (log2)
        f = m & ~np.isnan(floor) & (floor > 0) & (transfer > 0)
        if f.any():
            bins = np.clip(np.floor((np.log2(transfer[f] / floor[f]) + 8) * FLOOR_BINS), 0, 16 * FLOOR_BINS - 1)
            for k, count in zip(*np.unique(bins.astype(np.int64), return_counts=True)):
                acc["floor_hist"][str(int(k))] = acc["floor_hist"].get(str(int(k)), 0) + int(count)
    acc["wait_sq_sum"] += float(np.square(wait[m]).sum())
    w = m & (wait > 0)
    if w.any():
        who, at = np.unique(last[w], return_inverse=True)
        at = at.reshape(-1)
        theirs = wait[w] - held[w]
        sq = acc.setdefault("wait_by_last_sq", {})  # per call squared: the lead's spread (straggler.py)
        for rank, us, us2 in zip(who.tolist(), np.bincount(at, theirs).tolist(), np.bincount(at, theirs ** 2).tolist()):
            acc["wait_by_last"][str(rank)] = acc["wait_by_last"].get(str(rank), 0.0) + us
            sq[str(rank)] = sq.get(str(rank), 0.0) + us2
        own = float(held[w].sum())
        if own > 0:
            me = str(rk["rank"])
            acc["wait_by_last"][me] = acc["wait_by_last"].get(me, 0.0) + own
            sq[me] = sq.get(me, 0.0) + float(np.square(held[w]).sum())
        # the part of it the transport carried over from the previous call's uneven exit
        acc["carried_us"] = acc.get("carried_us", 0.0) + float(np.nan_to_num(carried[w]).sum())


def _doing(rows: list[dict], phase: str, culprit: int) -> dict:
    """The culprit's time per window minus the other ranks' median, per kind of work and idle."""
    def per_window(r, what):
        p = r["phases"][phase]
        v = p["idle_us"] if what == "idle" else p["categories"][what]["exposed_us"]
        return v / max(1, p["windows"])

    mine = next(r for r in rows if r["rank"] == culprit)
    others = [r for r in rows if r["rank"] != culprit]
    return {w: per_window(mine, w) - float(np.median([per_window(o, w) for o in others])) for w in DOING} if others else {}


def _classify(transfer: float, wait: float, matched_share: float, ranks: int) -> str:
    if ranks < 2 or matched_share < MIN_MATCHED:
        return "inconclusive"
    total = transfer + wait
    if total <= 0:
        return "inconclusive"
    return ("skew-dominated" if wait >= DOMINATES * total else
            "transfer-dominated" if transfer >= DOMINATES * total else "mixed")


def calibrated(baseline: dict | None) -> bool:
    """Whether the baseline is a calibration of this machine: only then is a slower transport
    flagged (the trace's own fastest calls cannot tell one). It is judged on the floor, not the
    median: a slower transport makes every call slower, the fastest too, while a noisy one (gloo
    here: its calls fall in a fast and a slow mode, in proportions that change from run to run by up
    to 3.5x at the median) moves the median and leaves the floor."""
    return bool(baseline) and baseline.get("source") == "sweep"


def _tenth(hist: dict[int, int]) -> float | None:
    """The 10th percentile of a floor-ratio histogram (the lower edge of its bin)."""
    total = sum(hist.values())
    if not total:
        return None
    seen = 0
    for k in sorted(hist):
        seen += hist[k]
        if seen >= 0.1 * total:
            return 2.0 ** (k / FLOOR_BINS - 8)
    return None


def _one(rows: list[dict], phase: str, cats: tuple[str, ...], baseline: dict | None = None,
         host: dict | None = None) -> dict:
    """Numbers and class for the phase's communication in `cats` (one category, or all)."""
    n = len(rows)
    e2e = sum(r["phases"][phase]["e2e_us"] / max(1, r["phases"][phase]["windows"]) for r in rows) / n
    exposed = wait = 0.0
    calls = matched = base_calls = 0
    log_ratio = 0.0
    wait_sum = wait_sq = carried = 0.0
    hist: dict[int, int] = {}
    caused: dict[str, float] = {}
    squares: dict[str, float] = {}
    for r in rows:
        p = r["phases"][phase]
        wn = max(1, p["windows"])
        for c in cats:
            exposed += p["categories"][c]["exposed_us"] / wn / n
            wait += p["categories"][c].get("exposed_wait_us", 0.0) / wn / n
            acc = (p.get("comm_calls") or {}).get(c)
            if acc:
                calls += acc["calls"]
                matched += acc["matched"]
                base_calls += acc["baseline_calls"]
                log_ratio += acc.get("log_ratio_sum", 0.0)
                for k, count in (acc.get("floor_hist") or {}).items():
                    hist[int(k)] = hist.get(int(k), 0) + count
                for who, us in acc["wait_by_last"].items():
                    caused[who] = caused.get(who, 0.0) + us
                    wait_sum += us
                for who, us2 in (acc.get("wait_by_last_sq") or {}).items():
                    squares[who] = squares.get(who, 0.0) + us2
                wait_sq += acc.get("wait_sq_sum", 0.0)
                carried += acc.get("carried_us", 0.0)
    transfer = max(0.0, exposed - wait)
    matched_share = matched / calls if calls else 0.0
    # how steady the waiting is over the calls: its coefficient of variation (a few long waits,
    # the machine's bursts, vary far more than a wait at every call)
    mean_w = wait_sum / matched if matched else 0.0
    cv = math.sqrt(max(0.0, wait_sq / matched - mean_w ** 2)) / mean_w if matched and mean_w > 0 else None
    ratio = math.exp(log_ratio / base_calls) if base_calls else None  # geometric mean of transfer / baseline
    floor_ratio = _tenth(hist)
    excess = transfer * max(0.0, 1 - 1 / ratio) if ratio else 0.0
    total_caused = sum(caused.values())
    shares = {k: v / total_caused for k, v in sorted(caused.items(), key=lambda kv: -kv[1])} if total_caused else {}
    standing = stands_out(caused, squares, matched)
    culprit = int(standing.name) if standing.name is not None else None
    cls = _classify(transfer, wait, matched_share, n)
    windows = max(1, rows[0]["phases"][phase]["windows"])
    caused_us = {k: v / windows for k, v in sorted(caused.items(), key=lambda kv: -kv[1])}
    out = {"class": cls, "e2e_us_per_window": e2e, "exposed_us_per_window": exposed,
           "transfer_us_per_window": transfer, "wait_us_per_window": wait,
           "transfer_share": transfer / e2e if e2e else 0.0, "wait_share": wait / e2e if e2e else 0.0,
           "calls": calls, "matched_share": matched_share, "transfer_vs_baseline": ratio,
           "excess_transfer_share": excess / e2e if e2e else 0.0, "wait_caused_by": shares,
           "wait_caused_us_per_window": caused_us, "wait_cv": cv, "culprit": culprit,
           "culprit_lead": None if standing.lead is None else round(standing.lead, 3),
           "culprit_z": None if standing.z is None else round(standing.z, 2),
           "transfer_floor_vs_baseline": floor_ratio,
           # of the waiting, what the last arriver's later exit from the previous collective explains:
           # made by the transport (gloo's uneven exits: 38-77 % of its waiting, DDA's mostly 2-20 %), not by a slow rank;
           # shown, not yet part of the class
           "wait_carried_share": min(1.0, carried / wait_sum) if wait_sum > 0 else None}
    causes = []
    if cls != "inconclusive" and e2e:
        ws = wait / e2e
        steady = cv is not None and cv <= STEADY_CV
        if (ws >= SKEW_BAR if culprit is not None else ws >= SPREAD_BAR and cls == "skew-dominated" and steady):
            causes.append({"cause": "skew", "rank": culprit, "share": ws, "us_per_window": wait})
        if calibrated(baseline) and floor_ratio is not None and floor_ratio >= SLOW_RATIO and excess / e2e >= SLOW_BAR:
            if (host or {}).get("contended"):  # a busy host slows a CPU transport as a slower link would
                out["slow_transfer_withheld"] = {"share": excess / e2e, "ratio": ratio, "floor_ratio": floor_ratio}
            else:
                causes.append({"cause": "slow-transfer", "share": excess / e2e, "us_per_window": excess, "ratio": ratio})
    causes.sort(key=lambda c: -c["share"])
    out["causes"] = causes
    if culprit is not None:
        out["culprit_doing"] = _doing(rows, phase, culprit)
    return out


def diagnose(rows: list[dict], phase: str, baseline: dict | None, host: dict | None = None) -> dict:
    """The phase's communication cause: over all its communication, and per category that has
    time (each category is one axis's groups). `host`: how contended the host was while the ranks
    ran (readers/telemetry.host_contention); on a contended host no slower transport is named."""
    out = _one(rows, phase, COMM_CATS, baseline, host)
    by = {}
    for c in COMM_CATS:
        if any(r["phases"][phase]["categories"][c]["exposed_us"] > 0 for r in rows):
            one = _one(rows, phase, (c,), baseline, host)
            by[c] = {k: v for k, v in one.items() if k != "e2e_us_per_window"}
    out["by_category"] = by
    for cause in out["causes"]:  # the axis a cause is on: the category with most of it
        key = "wait_us_per_window" if cause["cause"] == "skew" else "transfer_us_per_window"
        if by:
            cause["category"] = max(by, key=lambda c: by[c][key] * (1 if cause["cause"] == "skew" else max(
                0.0, 1 - 1 / (by[c]["transfer_vs_baseline"] or 1e9))))
    out["cause"] = out["causes"][0]["cause"] if out["causes"] else "none"
    out["baseline"] = baseline or {}
    if host is not None:
        out["host"] = host
        out["host_notes"] = host_notes(out, host)
    out["rule"] = (f"transfer = the last arriver's time in each matched call, waiting = the rest; class by share of "
                   f"exposed communication (≥ {DOMINATES:.0%} transfer or waiting dominates; under {MIN_MATCHED:.0%} "
                   f"of calls matched: inconclusive); skew flagged at ≥ {SKEW_BAR:.0%} of end-to-end time with one "
                   f"rank standing out as its cause ({straggler.RULE}), or ≥ {SPREAD_BAR:.0%} without one if steady "
                   f"over the calls (coefficient of variation ≤ {STEADY_CV}); "
                   + (f"slow transfer where the fastest tenth of the calls is ≥ {SLOW_RATIO:.2g}× the calibration's "
                      f"fastest tenth and the excess ≥ {SLOW_BAR:.0%} of end-to-end time"
                      if calibrated(baseline) else "slow transfer not flagged: no calibration of this machine"))
    return out


def host_words(host: dict, whose: str = "the ranks") -> str:
    """How contended the host was, in words (readers/telemetry.host_contention's numbers): the
    phase notes and the gate say it alike."""
    return (f"other work took {host['other_cores']:.2f} of the host's {host['cores']} cores while {whose} ran "
            f"(the host {host['busy_cores'] / host['cores']:.0%} busy"
            + (f", {host['steal_cores']:.2f} cores stolen by the hypervisor" if host["steal_cores"] >= 0.01 else "")
            + ")")


def host_notes(d: dict, host: dict) -> list[str]:
    """What a contended host leaves untold: a slower transport (withheld), and whether a late rank
    was slow or waiting for a core."""
    if not host.get("contended"):
        return []
    busy = host_words(host)
    out = []
    w = d.get("slow_transfer_withheld")
    if w:
        out.append(f"transfer ran {w['ratio']:.1f}× the calibration ({w['floor_ratio']:.1f}× at its fastest tenth), "
                   f"but {busy}: a slower transport cannot be told from a contended host, so none is named; profile "
                   f"again with the host to itself")
    if any(c["cause"] == "skew" for c in d["causes"]):
        out.append(f"{busy}: a late rank may have been waiting for a core rather than slow itself")
    elif not w:
        out.append(f"{busy}: every time measured here includes waiting for a core")
    return out


def lead_in_noise(d: dict) -> bool:
    """No culprit, though one rank's lead over the others is large enough: it is the noise test
    that fails (a few long waits), not the lead; the words must not say "spread over ranks"."""
    lead = d.get("culprit_lead")
    return d.get("culprit") is None and d.get("culprit_z") is not None and (
        lead is None or lead >= straggler.LEAD_NEEDED)


def no_culprit_words(d: dict) -> str:
    """Why no rank is named, for the verdict's summary."""
    if lead_in_noise(d):
        top, share = next(iter(d["wait_caused_by"].items()))
        return (f"rank {top} caused {share:.0%} of the waiting, but in too few calls to tell a slow rank from the "
                f"noise ({d['culprit_z']:.1f} standard errors, {straggler.Z_NEEDED:g} needed): capture more steps")
    return "the waiting is spread over ranks (arrival jitter, no one slow rank)"


def describe(d: dict) -> str:
    """The split in words: for summaries, the terminal and the report."""
    if d["class"] == "inconclusive":
        why = ("one rank's trace: no call can be matched" if d["matched_share"] == 0
               else f"{d['matched_share']:.0%} of calls matched")
        return f"transfer vs waiting cannot be told ({why})"
    s = f"transfer {d['transfer_share']:.0%}, waiting {d['wait_share']:.0%} of end-to-end"
    if d.get("culprit") is not None and d["wait_share"] > 0:
        s += f" (rank {d['culprit']} caused {d['wait_caused_by'].get(str(d['culprit']), 0):.0%} of the waiting)"
    elif d["wait_caused_by"] and d["wait_share"] > 0 and lead_in_noise(d):
        top, share = next(iter(d["wait_caused_by"].items()))
        s += f" (rank {top} caused {share:.0%} of the waiting, in too few calls to tell from the noise)"
    elif d["wait_caused_by"] and d["wait_share"] > 0:
        s += " (waiting spread over ranks: " + ", ".join(
            f"rank {k} {v:.0%}" for k, v in list(d["wait_caused_by"].items())[:4]) + ")"
    if d.get("wait_carried_share") and d["wait_share"] > 0 and d["wait_carried_share"] >= 0.05:
        s += f"; {d['wait_carried_share']:.0%} of the waiting carried over by the transport's uneven exits"
    if d.get("transfer_vs_baseline"):
        s += f"; transfer {d['transfer_vs_baseline']:.1f}× the baseline"
    return s


def doing_words(doing: dict) -> str:
    """What the culprit does with its time, in words: the kinds it spends more on than the others."""
    words = {"compute": "compute", "other": "other work", "memcpy": "copies",
             "idle": "time outside any recorded op (host stall, sleep, I/O)"}
    more = [(w, us) for w, us in sorted(doing.items(), key=lambda kv: -kv[1]) if us > 0]
    if not more:
        return "no more recorded work than the others"
    return ", ".join(f"{us:.0f} µs more {words[w]}" for w, us in more[:2]) + " per window than the others' median"


def label(cat: str) -> str:
    return LABEL.get(cat, cat)
