"""Invariants every analysis must keep, on every input: checked over the real inputs the suite has
(tests/test_invariants.py) and over whatever a user names here.

    python bench/invariants.py [INPUT ...]      # default: every real trace in tests/data/traces

Per rank and phase: exposed time per category plus idle is the window time (work that overlaps
across categories is counted once per category it belongs to, so the sum may exceed e2e only by
such overlap, never fall short of it); the windows do not overlap (no event in two windows) unless
the analysis reports overlapping windows; their total is no longer than the rank's span of work;
every rank names the rule that chose its rank and its windows; the share of its work inside the
windows is reported. Per phase: the verdict agrees with its shares (communication-bound above the
threshold, host/launch-bound only on an idle device, compute-bound only where computation is the
largest work and the timeline is at least half busy), and 'largest' is the largest share. For
Kineto JSON inputs the device work inside the windows is also counted from the raw events (json,
gzip) and must equal the reported share.

Per matched collective (check_waits, over the calls and waits the analysis computed from): the
rank named last is the last arriver by the time the analysis names (`collectives.arrival_rule`:
the latest start on one clock, starts within the clock's resolution of it counting as one arrival
of which the first to leave is named; the shortest time in the call where the clocks are several), it
waited 0, and every rank's wait is its time in the call beyond the last arriver's, from that same
time; the straggler, `times_last` and the caused waiting are those per-call facts summed.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "data" / "traces"
TOL = 1e-6  # relative
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}


def real_inputs() -> list[Path]:
    """Every real input shipped with the repository: one per directory of rank traces, one per file."""
    return [REAL / "facebookresearch-param", *sorted((REAL / "hta").glob("*.json.gz")),
            *sorted((REAL / "hpcgroup-pipit").glob("*.sqlite")), *sorted((REAL / "amd").glob("*.gz"))]


def check(result: dict, raw: Path | None = None) -> list[str]:
    """The violations of the invariants in one analysis (empty: all hold). `raw`: the input, for the
    raw-event count of work inside the windows where it is Kineto JSON."""
    bad: list[str] = []
    thr = result["threshold"]
    for r in result["ranks"]:
        who = f"rank {r['rank']}"
        if not r.get("rank_rule"):
            bad.append(f"{who}: names no rank rule")
        rule = r.get("phase_rule") or {}
        if not rule.get("windows_from"):
            bad.append(f"{who}: names no window rule")
        if "busy_in_windows_pct" not in rule:
            bad.append(f"{who}: does not report the share of its work inside its windows")
        spans = sorted((a, b) for sp in r["windows"].values() for a, b in sp)
        overlaps = sum(1 for (a0, b0), (a1, b1) in zip(spans, spans[1:]) if a1 < b0 - 1e-6)
        if overlaps and not rule.get("overlapping_windows"):
            bad.append(f"{who}: {overlaps} windows overlap and the analysis does not say so")
        for ph, p in r["phases"].items():
            e2e = p["e2e_us"]
            parts = sum(c["exposed_us"] for c in p["categories"].values()) + p["idle_us"]
            if parts < e2e * (1 - TOL) - 1e-6:
                bad.append(f"{who} {ph}: exposed + idle = {parts:.3f} µs < e2e {e2e:.3f} µs (time unaccounted)")
            if spans and e2e > (spans[-1][1] - spans[0][0]) * (1 + TOL) + 1e-6:
                bad.append(f"{who} {ph}: e2e {e2e:.3f} µs is longer than the rank's windows' span")
    for ph, p in result["phases"].items():
        shares = p["exposed_share"]
        cands = {**shares, "idle": p["idle_share"]}
        if "largest" in p and cands[p["largest"]] < max(cands.values()) - 1e-12:
            bad.append(f"{ph}: 'largest' is {p['largest']} but {max(cands, key=cands.get)} is larger")
        v = p["verdict"]
        if v in ("communication-bound", "imbalance-bound", "communication/imbalance-bound") and not p["exposed_comm_share"] > thr:
            bad.append(f"{ph}: {v} at {p['exposed_comm_share']:.1%} (threshold {thr:.0%})")
        cause = p.get("communication_cause") or {}
        told = cause and cause.get("class") != "inconclusive"
        if told:  # transfer and waiting were told apart: the verdict follows the larger part
            t, w = cause["transfer_share"], cause["wait_share"]
            if abs(t + w - cause["exposed_us_per_window"] / max(cause["e2e_us_per_window"], 1e-9)) > 1e-6:
                bad.append(f"{ph}: transfer {t:.1%} + waiting {w:.1%} is not the exposed communication")
            if v == "communication-bound" and w > thr and not t > thr:
                bad.append(f"{ph}: communication-bound while waiting ({w:.0%}) is above the threshold and transfer "
                           f"({t:.0%}) is not")
            if v == "imbalance-bound" and t > thr and not w > thr:
                bad.append(f"{ph}: imbalance-bound while transfer ({t:.0%}) is above the threshold and waiting is not")
            culprit = cause.get("culprit")
            if culprit is not None and cause["wait_caused_by"].get(str(culprit), 0) < 0.5:
                bad.append(f"{ph}: culprit rank {culprit} caused under half the waiting")
        if v == "host/launch-bound" and not p["idle_share"] > 0.5:
            bad.append(f"{ph}: host/launch-bound with the device idle only {p['idle_share']:.0%}")
        if v == "compute-bound":
            top = max(shares, key=shares.get)
            if top not in ("compute", "other") or p["idle_share"] > 0.5:
                bad.append(f"{ph}: compute-bound but the largest work is {top} and idle is {p['idle_share']:.0%}")
        if v == "unknown" and not p.get("notes"):
            bad.append(f"{ph}: unknown without a reason")
    if raw is not None and raw.is_file() and raw.name.endswith((".json", ".json.gz")) and len(result["ranks"]) == 1:
        bad += _raw_inside(result["ranks"][0], raw, result["origin_ns"])
    return bad


def check_waits(result: dict, calls: dict, waits: dict) -> list[str]:
    """The straggler, the last arrivers and the waits agree, call by call (one time source)."""
    from commprobe.analyzers.cross_rank.matching import CAUSALITY_TOL_US, CLOCK, _global_keys

    coll = result["collectives"]
    rule = coll.get("arrival_rule")
    if not rule:
        return ["collectives: names no arrival rule"]
    bad: list[str] = []
    hosts = {r["identity"].get("host") for r in result["ranks"]} - {None, ""}
    aligned = result.get("align") == "collective-end"
    if rule == CLOCK and len(hosts) > 1 and not aligned:
        bad.append(f"collectives: arrival read from start times on {len(hosts)} hosts' clocks")
    keys = _global_keys(calls)
    where = {r: {k: j for j, k in enumerate(keys[r].tolist())} for r in calls}
    offsets = {int(r): v for r, v in coll["offsets_us"].items()}
    latest_by_key: dict[int, float] = {}
    for q, c in calls.items():
        for k, t in zip(keys[q].tolist(), (c.start - offsets.get(q, 0.0)).tolist()):
            latest_by_key[k] = max(latest_by_key.get(k, t), t)
    last_count = {r: 0 for r in calls}
    caused = {r: 0.0 for r in calls}
    caused_in = {r: 0.0 for r in calls}
    squares_in = {r: 0.0 for r in calls}
    calls_in = 0
    waited = {r: 0.0 for r in calls}
    wins = {rk["rank"]: sorted((a, b) for sp in rk["windows"].values() for a, b in sp) for rk in result["ranks"]}
    inside = {r: [any(a <= t < b for a, b in wins.get(r, ())) for t in c.start] for r, c in calls.items()}
    for r, c in calls.items():
        if r not in waits:
            continue
        w, _, last, h, _ = waits[r]
        dur = c.end - c.start
        for j in range(len(c)):
            lr = int(last[j])
            if lr < 0:
                continue
            jl = where[lr].get(int(keys[r][j]))
            if jl is None:
                bad.append(f"rank {r} call {j}: its last arriver {lr} has no call of its key")
                continue
            dl = calls[lr].end[jl] - calls[lr].start[jl]
            truth = max(0.0, dur[j] - dl)
            if abs(w[j] - truth) > 1e-6 * max(1.0, dur[j]):
                bad.append(f"rank {r} call {j}: waited {w[j]:.3f} µs, but its time beyond the last arriver's is "
                           f"{truth:.3f} µs")
            if rule == CLOCK:
                mine, theirs = c.start[j] - offsets.get(r, 0.0), calls[lr].start[jl] - offsets.get(lr, 0.0)
                # arrivals within the clock's resolution of the latest are one: the first of them to leave is last
                latest = latest_by_key[int(keys[r][j])]
                if theirs < latest - CAUSALITY_TOL_US - 1e-6:
                    bad.append(f"rank {r} call {j}: rank {lr} named last entered at {theirs:.3f} µs, before the "
                               f"latest arrival ({latest:.3f})")
                elif mine >= latest - CAUSALITY_TOL_US and c.end[j] - offsets.get(r, 0.0) < \
                        calls[lr].end[jl] - offsets.get(lr, 0.0) - 1e-6:
                    bad.append(f"rank {r} call {j}: arrived with rank {lr} named last and left before it")
            elif dur[j] < dl - 1e-6:
                bad.append(f"rank {r} call {j}: {dur[j]:.3f} µs in the call, shorter than rank {lr} named last "
                           f"({dl:.3f}), with arrival from durations")
            if lr == r:
                last_count[r] += 1
                if w[j] > 1e-9:
                    bad.append(f"rank {r} call {j}: named last and waited {w[j]:.3f} µs")
            caused[lr] += w[j] - h[j]
            caused[r] += h[j]
            if inside[r][j]:  # the straggler is named from the calls inside the windows (the verdict's scope)
                caused_in[lr] += w[j] - h[j]
                caused_in[r] += h[j]
                calls_in += 1
                if w[j] > 0:
                    squares_in[lr] += (w[j] - h[j]) ** 2
                    squares_in[r] += h[j] ** 2
            waited[r] += w[j]
    rows = {row["rank"]: row for row in coll["ranks"]}
    for r in calls:
        row = rows.get(r)
        if row is None:
            continue
        if row["times_last"] != last_count[r]:
            bad.append(f"rank {r}: times_last {row['times_last']} but last in {last_count[r]} calls")
        if abs(row["caused_wait_us"] - caused[r]) > 1e-6 * max(1.0, caused[r]):
            bad.append(f"rank {r}: caused {row['caused_wait_us']:.3f} µs of waiting, {caused[r]:.3f} per call")
        if abs(row["wait_us"] - waited[r]) > 1e-6 * max(1.0, waited[r]):
            bad.append(f"rank {r}: waited {row['wait_us']:.3f} µs, {waited[r]:.3f} per call")
    top = max(caused_in.values(), default=0.0)
    total = sum(caused_in.values())
    sr = coll.get("straggler_rule") or {}
    if coll["straggler"] is not None and caused_in.get(coll["straggler"], 0.0) < top - 1e-6 * max(1.0, top):
        bad.append(f"straggler rank {coll['straggler']} caused {caused_in[coll['straggler']]:.3f} µs in the windows, "
                   f"another {top:.3f}")
    if sr.get("lead_needed") is None and total > 0:
        bad.append("names no straggler rule")
    elif total > 1e-6:  # one rule: named exactly when the top rank's lead is enough and beyond the noise
        ranked = sorted(caused_in.values(), reverse=True) + [0.0]
        lead_ok = ranked[1] <= 0 or top / ranked[1] >= sr["lead_needed"] - 1e-9
        diff = top - ranked[1]
        tops = sorted(caused_in, key=lambda k: -caused_in[k])[:2]
        var = sum(squares_in[k] for k in tops) - diff * diff / max(1, calls_in)
        z = diff / var ** 0.5 if var > 1e-9 * max(1.0, diff * diff) else None
        noise_ok = z is None and calls_in > 1 or z is not None and z >= sr["z_needed"]
        near = z is not None and abs(z - sr["z_needed"]) < 1e-3 or ranked[1] > 0 and abs(
            top / ranked[1] - sr["lead_needed"]) < 1e-6
        if not near and (coll["straggler"] is not None) != (lead_ok and noise_ok):
            bad.append(f"straggler {coll['straggler']} against the rule: the top rank caused {top / total:.1%} of the "
                       f"waiting, {'no runner-up' if ranked[1] <= 0 else f'{top / ranked[1]:.2f}x the next'}, "
                       f"{'no spread' if z is None else f'{z:.2f} standard errors'}")
    return bad


def check_all(path) -> list[str]:
    """Every invariant of one input: the result's own, and its per-call waits."""
    from commprobe.analyzers.analysis import analyze_with_calls

    result, red = analyze_with_calls(path)
    return check(result, Path(path)) + check_waits(result, red.calls, red.waits)


def _raw_dumps(directory: Path) -> dict[int, dict]:
    """Each rank's dump read plainly (json, or pickle of a file the caller trusts: its own test files),
    keyed by the trailing number of the file name."""
    import pickle
    import re

    out = {}
    for p in sorted(directory.iterdir()):
        m = re.search(r"(\d+)(?:\.fr)?(?:\.pkl|\.json)?$", p.name)
        if not p.is_file() or not m or p.name.endswith((".stacks.json", ".groups.json", ".log")):
            continue
        data = p.read_bytes()
        try:
            doc = pickle.loads(data) if data[:1] == b"\x80" else json.loads(data)
        except Exception:  # noqa: BLE001 - not a dump
            continue
        if isinstance(doc, dict) and isinstance(doc.get("entries"), list):
            out[int(m.group(1))] = doc
    return out


def _raw_progress(doc: dict, pg: str) -> tuple[int, int]:
    """(last enqueued, last completed) in a group from one raw dump: its entries' sequence numbers
    and states, and its pg_status (keyed by pg_id), whichever says more."""
    ids = {str(e.get("pg_id")) for e in doc["entries"] if e.get("process_group", [None])[0] == pg}
    enq = comp = 0
    for e in doc["entries"]:
        if e.get("process_group", [None])[0] == pg and not e.get("is_p2p"):
            enq = max(enq, int(e["collective_seq_id"]))
            if e.get("retired") or e.get("state") == "completed":
                comp = max(comp, int(e["collective_seq_id"]))
    for k, st in (doc.get("pg_status") or {}).items():
        if k in ids or (not ids and k == pg):
            enq = max(enq, int(st.get("last_enqueued_collective", 0)))
            comp = max(comp, int(st.get("last_completed_collective", 0)))
    return enq, max(comp, 0)


def check_hang(result: dict, directory: Path) -> list[str]:
    """A hang diagnosis against the raw dumps: the root causes come first, every consequence names a
    root; a rank named missing at a sequence number holds no record of it; a rank named stalled left
    undone what a peer completed; 'none completed' is said only where no member completed it; an
    all-to-all is never a size mismatch while what the group sends equals what it receives."""
    bad = []
    raw = _raw_dumps(directory)
    roots = result["findings"]
    keys = {(f["group"], f["seq"]) for f in roots}
    for f in roots:
        if f.get("role") not in ("root", None):
            bad.append(f"{f['group']} seq {f['seq']}: listed among the roots as a {f.get('role')}")
        for c in f.get("consequences", ()):
            if c.get("role") != "consequence" or (c["blocked_by"]["group"], c["blocked_by"]["seq"]) not in keys:
                bad.append(f"{c['group']} seq {c['seq']}: a consequence without its root")
    for f in [x for r in roots for x in (r, *r.get("consequences", ()))]:
        pg, s = f["group"], f["seq"]
        prog = {r: _raw_progress(raw[r], pg) for r in f["ranks"] if r in raw}
        for m in f["missing"]:
            if f["kind"] in ("missing_rank", "device_stalled") and m in prog and prog[m][0] >= s:
                bad.append(f"group {f['ranks']} seq {s}: rank {m} named missing, its records hold seq {prog[m][0]}")
        for r, q in f.get("stalled", {}).items():
            done = max((c for _, c in prog.values()), default=0)
            if int(r) in prog and (prog[int(r)][1] >= q or done < q):
                bad.append(f"group {f['ranks']}: rank {r} named stalled at seq {q}: it completed "
                           f"{prog[int(r)][1]}, its peers {done}")
        if f["kind"] == "stuck_in_transfer" and any(c >= s for _, c in prog.values()):
            bad.append(f"group {f['ranks']} seq {s}: 'none completed', yet a member completed it")
        if f["kind"] == "size_mismatch" and "all_to_all" in str(f["op"]) and "receives" not in f["summary"]:
            bad.append(f"group {f['ranks']} seq {s}: an all-to-all called a size mismatch by its uneven inputs")
    return bad


def _raw_inside(rank: dict, raw: Path, origin_ns: int) -> list[str]:
    """The share of device work (else host ops) inside the rank's windows, counted from the raw JSON."""
    opener = gzip.open if raw.name.endswith(".gz") else open
    with opener(raw, "rt") as f:
        doc = json.load(f)
    if isinstance(doc, dict) and "traceEvents" not in doc:
        return []  # JSON of another producer (rocprofv3): its reader's own tests count it
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    base = (doc.get("baseTimeNanoseconds") or 0) if isinstance(doc, dict) else 0
    xs = [e for e in events if e.get("ph") == "X" and isinstance(e.get("dur"), (int, float))]
    dev = [e for e in xs if e.get("cat") in DEVICE_CATS]
    if not dev or rank["timeline"] != "device" or (rank["phase_rule"].get("device_work_before_first_step") or {}).get(
            "events") or (rank["phase_rule"].get("device_work_after_last_step") or {}).get("events"):
        return []  # work of no step is left out of the timeline: its share is checked where there is none
    shift = (base - origin_ns) / 1000.0
    spans = sorted((a, b) for sp in rank["windows"].values() for a, b in sp)
    busy = _union([(e["ts"] + shift, e["ts"] + e["dur"] + shift) for e in dev])
    total = sum(b - a for a, b in busy)
    inside = sum(max(0.0, min(b, wb) - max(a, wa)) for a, b in busy for wa, wb in _union(spans))
    pct = 100.0 * inside / total if total else 100.0
    got = rank["phase_rule"]["busy_in_windows_pct"]
    return [] if abs(pct - got) < 0.01 else [f"rank {rank['rank']}: {got}% of work inside windows reported, "
                                             f"{pct:.3f}% counted from the raw events"]


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def main() -> int:
    inputs = [Path(a) for a in sys.argv[1:]] or real_inputs()
    failed = 0
    for p in inputs:
        bad = check_all(p)
        failed += bool(bad)
        print(f"{'ok  ' if not bad else 'FAIL'} {p}" + "".join(f"\n     {b}" for b in bad))
    print(f"{len(inputs) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
