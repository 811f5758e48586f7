"""Verdicts and advice: per phase, is it communication-, compute- or host/launch-bound, which
axis dominates, and what to do about it. Reads the per-rank breakdowns and the matched
collectives the other analyzers computed; the words a user acts on live here and only here.
"""

from __future__ import annotations

from commprobe.common.vocab import AXIS_OF, COMM_CATS, WORK_CATEGORIES, Verdict
from commprobe.common.vocab import CATEGORY_LABEL as LABEL

IDLE_BOUND = 0.5  # a device idle more than this share of a phase is host/launch-bound
PHASE_ORDER = ("prefill", "decode", "mixed", "cached", "idle-step", "step", "trace")


def axis_note(cat: str, provenance: dict) -> str:
    """How the category's axis was decided, in words a user can check: '' when declared."""
    src = provenance.get(cat) or {}
    if not src or set(src) == {"declared"}:
        return ""
    if set(src) == {"inferred"}:
        return " (axis inferred from the op: no process group in the trace names it)"
    if set(src) == {"unknown"}:
        return " (axis unknown: name the process groups to attribute it)"
    return " (axis partly inferred from the op)"


def _source(cat: str, provenance: dict) -> str | None:
    src = provenance.get(cat) or {}
    return None if not src else next(iter(src)) if len(src) == 1 else "mixed"


def _graph_state(graphs: dict, rows: list[dict]) -> str:
    states = {graphs.get(r["rank"], {}).get("state", "none") for r in rows}
    for s in ("capture-only", "replays-without-kernels", "replays"):
        if s in states:
            return s
    return "none"


_DIRECTION_WORDS = {"H2D": "host to device (H2D)", "D2H": "device to host (D2H)", "D2D": "device to device (D2D)",
                    "peer": "peer to peer", "memset": "memsets", "other": "copies of unknown direction"}


def copy_direction_of(rows: list[dict]) -> str:
    """The copy direction with the most time over the ranks (their device_work counts), in words."""
    total: dict[str, float] = {}
    for r in rows:
        for d, us in (r.get("device_work") or {}).get("copy_us_by_direction", {}).items():
            total[d] = total.get(d, 0.0) + us
    if not total:
        return _DIRECTION_WORDS["other"]
    top = max(total, key=total.get)
    return f"{_DIRECTION_WORDS[top]}, {total[top] / sum(total.values()):.0%} of copy time"


def phase_summary(ranks: list[dict], threshold: float, matched: dict, buckets: list[dict],
                  provenance: dict | None = None, graphs: dict | None = None) -> dict:
    provenance, graphs = provenance or {}, graphs or {}
    out = {}
    names = sorted({p for r in ranks for p in r["phases"]},
                   key=lambda p: PHASE_ORDER.index(p) if p in PHASE_ORDER else len(PHASE_ORDER))
    for phase in names:
        rows = [r for r in ranks if phase in r["phases"]]
        shares = {c: 0.0 for c in WORK_CATEGORIES}
        idle = 0.0
        for r in rows:
            p = r["phases"][phase]
            e2e = p["e2e_us"] or 1.0
            for c, v in p["categories"].items():
                shares[c] += v["exposed_us"] / e2e / len(rows)
            idle += p["idle_us"] / e2e / len(rows)
        e2e_max = max(r["phases"][phase]["e2e_us"] for r in rows)
        device = any(r["timeline"] == "device" for r in rows)
        comm_share = sum(shares[c] for c in COMM_CATS)
        top_comm = max(COMM_CATS, key=lambda c: shares[c])
        graph = _graph_state(graphs, rows)
        way = None
        notes = []
        if graph == "capture-only":
            notes.append("the trace records CUDA/HIP graph capture but no replay: profile serving steps, not the capture")
        elif graph == "replays-without-kernels":
            notes.append("the trace records graph replays but not the kernels they ran (most replays are followed by "
                         "no kernel): the device's time cannot be told from it; profile with the graph's kernels recorded")
        if notes:
            verdict, dominant, share = Verdict.UNKNOWN, "unknown", 0.0
            summary = f"{phase}: no verdict: {notes[0]}"
        elif device and idle > IDLE_BOUND:
            verdict, dominant, share = Verdict.HOST, "idle", idle
            summary = (f"{phase} is host/launch-bound: the device is idle {idle:.0%} of the window "
                       f"(exposed communication {comm_share:.0%})")
        elif comm_share > threshold:
            verdict, dominant, share = Verdict.COMMUNICATION, top_comm, shares[top_comm]
            summary = (f"{phase} is communication-bound: exposed communication is {comm_share:.0%} of end-to-end "
                       f"latency (threshold {threshold:.0%}), {LABEL[top_comm]} {shares[top_comm]:.0%}"
                       f"{axis_note(top_comm, provenance)}")
        elif device and shares["memcpy"] > max(shares["compute"], shares["other"]):
            way = copy_direction_of(rows)
            verdict, dominant, share = Verdict.DATA_MOVEMENT, "memcpy", shares["memcpy"]
            summary = (f"{phase} is data-movement-bound: copies and memsets are {shares['memcpy']:.0%} of end-to-end "
                       f"latency, more than compute ({shares['compute']:.0%}); mostly {way}"
                       f" (exposed communication {comm_share:.0%})")
        else:
            top = max(("compute", "memcpy", "other"), key=lambda c: shares[c])
            verdict, dominant, share = Verdict.COMPUTE, top, shares[top]
            summary = (f"{phase} is compute-bound: exposed communication is {comm_share:.0%} of end-to-end latency "
                       f"(threshold {threshold:.0%}); {LABEL[top]} {shares[top]:.0%}")
        out[phase] = {
            "ranks": len(rows),
            "windows": max(r["phases"][phase]["windows"] for r in rows),
            "e2e_us_max": e2e_max,
            "e2e_us_per_window": e2e_max / max(1, rows[0]["phases"][phase]["windows"]),
            "exposed_share": shares,
            "exposed_comm_share": comm_share,
            "idle_share": idle,
            "verdict": str(verdict),
            "dominant": dominant,
            "axis": AXIS_OF.get(dominant),
            "axis_source": _source(dominant, provenance),
            "dominant_share": share,
            "summary": summary,
            "notes": notes,
            "graphs": graph,
            "recommendations": [] if notes else recommend(phase, shares, idle, device, threshold, matched, buckets,
                                                          provenance, graph, copies=way if verdict is Verdict.DATA_MOVEMENT
                                                          else None),
        }
    return out


def recommend(phase, shares, idle, device, threshold, matched, buckets, provenance=None, graph="none",
              copies: str | None = None) -> list[str]:
    """Advice per phase. Axis-specific advice only for an axis the trace declares or its ops imply
    (a category exists only then); communication of unknown axis gets no axis's advice."""
    provenance = provenance or {}
    recs = []
    tp = shares["tp_allreduce"]
    if tp > threshold / 2:
        sizes = [b for b in buckets if b["category"] == "tp_allreduce"]
        if sizes:
            med = sorted(sizes, key=lambda b: -b["count"])[0]
            if med["bucket_bytes"] <= 1 << 20:
                recs.append(f"TP allreduce{axis_note('tp_allreduce', provenance)} takes {tp:.0%} of {phase} with "
                            f"≤{med['bucket_bytes'] // 1024} KiB messages "
                            f"(median {med['median_us']:.0f} µs): small allreduces are latency-bound; a one-shot DDA "
                            f"allreduce (commprobe --backend dda) replaces the ring's many hops with one read per peer")
            else:
                recs.append(f"TP allreduce{axis_note('tp_allreduce', provenance)} takes {tp:.0%} of {phase} at "
                            f"{med['bucket_bytes'] >> 20} MiB messages: use a "
                            f"two-shot allreduce or overlap it with the next layer's compute")
    if shares["ep_all_to_all"] > threshold / 2:
        recs.append(f"EP all-to-all{axis_note('ep_all_to_all', provenance)} is exposed for "
                    f"{shares['ep_all_to_all']:.0%} of {phase}: overlap dispatch/combine "
                    f"with expert compute (micro-batch overlap, low-latency all-to-all kernels)")
    if shares["cp_ring"] > threshold / 2:
        recs.append(f"CP ring steps are exposed for {shares['cp_ring']:.0%} of {phase}: overlap the next block's "
                    f"send/recv with attention on the current one, or switch pass-KV/pass-Q")
    for r in matched.get("ranks", []):
        comm = r["transfer_us"] + r["wait_us"]
        if (comm > 0 and r["wait_us"] > r["transfer_us"] and matched.get("straggler") is not None
                and r["rank"] != matched["straggler"]):
            s = matched["straggler"]
            recs.append(f"rank {r['rank']} spends {r['wait_us'] / comm:.0%} of its communication time waiting for rank "
                        f"{s} (the straggler): fix rank {s}'s imbalance before tuning collectives")
            break
    other = provenance.get("other_comm") or {}
    if shares["other_comm"] > threshold / 2 and other.get("unknown"):
        recs.append(f"communication of unknown axis (p2p send/recv or collectives on unnamed groups) is exposed for "
                    f"{shares['other_comm']:.0%} of {phase}: give the process groups names or descriptions that say "
                    f"tp/cp/ep/pp/dp, so the time can be attributed to an axis")
    if copies:
        what = {"host to device": "keep weights and KV cache resident on the device, pin host buffers and copy "
                                  "asynchronously on a side stream, overlapping compute",
                "device to host": "take results off the device less often: .item()/.cpu()/.tolist() in the step loop "
                                  "each copy and synchronise",
                "device to device": "copies inside the device (contiguous(), cat, dtype casts): fuse them into the "
                                    "kernels or keep layouts that need none",
                "peer": "peer copies: route them through the collective library (NVLink/XGMI) or overlap them",
                "memsets": "memsets: reuse zeroed buffers instead of clearing them every step"}
        advice = next((v for k, v in what.items() if copies.startswith(k)), "find what copies and why in the trace")
        recs.append(f"copies take {shares['memcpy']:.0%} of {phase}, mostly {copies}: {advice}")
    if device and idle > IDLE_BOUND:
        if graph == "replays":  # it already replays graphs: the idle is between replays, not launch overhead
            recs.append(f"the device is idle {idle:.0%} of {phase} although the step replays CUDA/HIP graphs: the "
                        f"host between replays (scheduling, sampling, input preparation) is the bottleneck")
        else:
            recs.append(f"the device is idle {idle:.0%} of {phase}: launch overhead dominates; capture the step in a "
                        f"CUDA/HIP graph or fuse small kernels")
    return recs
