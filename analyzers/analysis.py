"""Bundle or traces in, one versioned JSON result out (`commprobe.analysis/1`).

The result holds, per rank and phase, end-to-end time and per-category total and exposed
time; the collectives matched across ranks with transfer vs straggler wait; message-size
buckets; unclassified names; and per phase a verdict with its numbers and recommendations.
Reports and the gate read only this result. The JSON Schema is analyzers/analysis.schema.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from . import collectives as coll
from .attribution import rank_breakdown
from .classify import CATEGORIES, classify, load_rules
from .trace import TraceError, iter_traces

SCHEMA = "commprobe.analysis/1"
COMM_CATS = ("tp_allreduce", "cp_ring", "ep_all_to_all", "other_comm")
AXIS_OF = {"tp_allreduce": "tp", "cp_ring": "cp", "ep_all_to_all": "ep", "other_comm": "other"}
LABEL = {"tp_allreduce": "TP allreduce", "cp_ring": "CP ring attention", "ep_all_to_all": "EP all-to-all",
         "other_comm": "other communication", "compute": "compute", "memcpy": "memcpy", "other": "other"}
IDLE_BOUND = 0.5


def _read_manifest(path: Path) -> dict | None:
    """A bundle directory's manifest.json, or None when `path` is not a bundle."""
    m = path / "manifest.json" if path.is_dir() else None
    if m is None or not m.exists():
        return None
    try:
        return json.loads(m.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{m}: unreadable manifest ({e})") from None


def _bundle_manifest(path: Path) -> dict | None:
    doc = _read_manifest(path)
    if doc is None:
        return None
    if doc.get("sub_bundles"):
        subs = ", ".join(doc["sub_bundles"])
        raise TraceError(f"{path} holds one bundle per backend ({subs}): analyze one of them, "
                         f"or compare two with `commprobe compare`")
    return doc


def _telemetry(path: Path, manifest: dict | None, origin_ns: int) -> dict | None:
    """The bundle's telemetry as series on the run's clock, or None outside a bundle."""
    if not manifest or not manifest.get("telemetry"):
        return None
    from .telemetry import read_series

    f = (path / manifest["telemetry"]).resolve()
    return read_series(f, origin_ns) if f.exists() else None


def analyze(path: str | Path, *, rules_file: str | None = None, threshold: float = 0.2,
            align: str = "base") -> dict:
    t0 = time.perf_counter()
    path = Path(path)
    if not 0 < threshold < 1:
        raise TraceError(f"threshold must be between 0 and 1, got {threshold}")
    manifest = _bundle_manifest(path) if path.exists() else None
    rules = load_rules(rules_file) if rules_file else []
    ranks, calls, unknown, files, nbytes, origins = [], {}, {}, [], 0, {}
    for t in iter_traces(path):  # one rank in memory at a time
        cls = classify(t, rules)
        ranks.append(rank_breakdown(t, cls))
        calls[t.rank] = coll.primary_calls(t, cls)
        origins[t.rank] = t.origin_ns
        files.append(t.path)
        nbytes += t.uncompressed_bytes
        for name, n in cls.unknown_names.items():
            unknown[name] = unknown.get(name, 0) + n
        del t, cls
    ranks.sort(key=lambda r: r["rank"])
    origin = min(origins.values())
    for r, cs in calls.items():  # one clock for the run: the earliest rank's base
        shift = (origins[r] - origin) / 1000.0
        cs.start += shift
        cs.end += shift
    for rk in ranks:  # windows and timelines on the run's clock too (µs since `origin_ns`)
        shift = (origins[rk["rank"]] - origin) / 1000.0
        rk["windows"] = {ph: [[a + shift, b + shift] for a, b in sp] for ph, sp in rk["windows"].items()}
        for seg in rk["segments"].values():
            seg["start_us"] += shift
    offsets = coll.align_offsets(calls) if align == "collective-end" else None
    matched = coll.match(calls, offsets)
    waits = matched.pop("_waits")
    _phase_waits(ranks, calls, waits)
    buckets = coll.size_buckets(calls, waits)
    phases = _phase_summary(ranks, threshold, matched, buckets)
    return {
        "schema": SCHEMA,
        "source": {"path": str(path), "files": sorted(files), "bundle": manifest is not None,
                   "uncompressed_bytes": nbytes},
        "manifest": manifest,
        "threshold": threshold,
        "align": align,
        "ranks": ranks,
        "phases": phases,
        "collectives": matched,
        "message_sizes": buckets,
        "origin_ns": origin,
        "telemetry": _telemetry(path, manifest, origin),
        "unclassified": {"count": sum(unknown.values()),
                         "names": [{"name": n, "count": c} for n, c in sorted(unknown.items(), key=lambda kv: -kv[1])[:50]]},
        "elapsed_s": time.perf_counter() - t0,
    }


def _phase_waits(ranks: list[dict], calls: dict, waits: dict) -> None:
    """Per rank, phase and communication category: `exposed_wait_us`, the part of the exposed time
    spent waiting for a straggler (matched calls that start in the phase's windows; on a host
    timeline all of a collective's time is exposed, on a device the wait is capped by the
    category's exposed time)."""
    for rk in ranks:
        r = rk["rank"]
        for phase, spans in rk["windows"].items():
            cats = rk["phases"][phase]["categories"]
            for c in COMM_CATS:
                cats[c]["exposed_wait_us"] = 0.0
            if not spans:
                continue
            lo = np.array([a for a, _ in spans])
            hi = np.array([b for _, b in spans])
            rc = calls.get(r)
            if rc is None or not len(rc) or r not in waits:
                continue
            k = np.searchsorted(lo, rc.start, side="right") - 1
            inside = (k >= 0) & (rc.start < hi[np.maximum(k, 0)]) & (waits[r][0] > 0)  # NaN (unmatched) is not > 0
            cat = rc.category()
            for name in COMM_CATS:
                sel = inside & (cat == name)
                if sel.any():
                    cats[name]["exposed_wait_us"] += float(waits[r][0][sel].sum())
            for c in COMM_CATS:
                cats[c]["exposed_wait_us"] = min(cats[c]["exposed_wait_us"], cats[c]["exposed_us"])


def _phase_summary(ranks: list[dict], threshold: float, matched: dict, buckets: list[dict]) -> dict:
    out = {}
    names = sorted({p for r in ranks for p in r["phases"]}, key=lambda p: ["prefill", "decode", "step", "trace"].index(p)
                   if p in ("prefill", "decode", "step", "trace") else 9)
    for phase in names:
        rows = [r for r in ranks if phase in r["phases"]]
        shares = {c: 0.0 for c in CATEGORIES[:7]}
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
        if device and idle > IDLE_BOUND:
            verdict, dominant, share = "host/launch-bound", "idle", idle
            summary = (f"{phase} is host/launch-bound: the device is idle {idle:.0%} of the window "
                       f"(exposed communication {comm_share:.0%})")
        elif comm_share > threshold:
            verdict, dominant, share = "communication-bound", top_comm, shares[top_comm]
            summary = (f"{phase} is communication-bound: exposed communication is {comm_share:.0%} of end-to-end "
                       f"latency (threshold {threshold:.0%}), {LABEL[top_comm]} {shares[top_comm]:.0%}")
        else:
            top = max(("compute", "memcpy", "other"), key=lambda c: shares[c])
            verdict, dominant, share = "compute-bound", top, shares[top]
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
            "verdict": verdict,
            "dominant": dominant,
            "axis": AXIS_OF.get(dominant),
            "dominant_share": share,
            "summary": summary,
            "recommendations": _recommend(phase, shares, idle, device, threshold, matched, buckets),
        }
    return out


def _recommend(phase, shares, idle, device, threshold, matched, buckets) -> list[str]:
    recs = []
    tp = shares["tp_allreduce"]
    if tp > threshold / 2:
        sizes = [b for b in buckets if b["category"] == "tp_allreduce"]
        if sizes:
            med = sorted(sizes, key=lambda b: -b["count"])[0]
            if med["bucket_bytes"] <= 1 << 20:
                recs.append(f"TP allreduce takes {tp:.0%} of {phase} with ≤{med['bucket_bytes'] // 1024} KiB messages "
                            f"(median {med['median_us']:.0f} µs): small allreduces are latency-bound; a one-shot DDA "
                            f"allreduce (commprobe --backend dda) replaces the ring's many hops with one read per peer")
            else:
                recs.append(f"TP allreduce takes {tp:.0%} of {phase} at {med['bucket_bytes'] >> 20} MiB messages: use a "
                            f"two-shot allreduce or overlap it with the next layer's compute")
    if shares["ep_all_to_all"] > threshold / 2:
        recs.append(f"EP all-to-all is exposed for {shares['ep_all_to_all']:.0%} of {phase}: overlap dispatch/combine "
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
    if device and idle > IDLE_BOUND:
        recs.append(f"the device is idle {idle:.0%} of {phase}: launch overhead dominates; capture the step in a "
                    f"CUDA/HIP graph or fuse small kernels")
    return recs


def analyze_backends(path: str | Path) -> dict[str, dict] | None:
    """A bundle with one sub-bundle per backend: {backend: analysis}, in the run's order; else None."""
    p = Path(path)
    subs = (_read_manifest(p) or {}).get("sub_bundles") or {}
    return {b: analyze(p / d) for b, d in subs.items()} or None


def load_result(path: str | Path) -> dict:
    """An analysis JSON file, or anything `analyze` accepts."""
    p = Path(path)
    if p.is_file() and p.suffix == ".json":
        try:
            doc = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            doc = None
        if isinstance(doc, dict) and doc.get("schema", "").startswith("commprobe.analysis/"):
            if doc["schema"] != SCHEMA:
                raise TraceError(f"{p}: analysis schema {doc['schema']} is not {SCHEMA}")
            return doc
    return analyze(p)


def compare(a: dict, b: dict) -> dict:
    """B against A per phase, category and message size; ratios are B / A (> 1: B slower)."""
    def ratio(x, y):
        return y / x if x else None

    phases = {}
    for ph in sorted(set(a["phases"]) & set(b["phases"])):
        pa, pb = a["phases"][ph], b["phases"][ph]
        cats = {}
        for c in CATEGORIES[:7]:
            ea = pa["exposed_share"][c] * pa["e2e_us_per_window"]
            eb = pb["exposed_share"][c] * pb["e2e_us_per_window"]
            cats[c] = {"a_us": ea, "b_us": eb, "ratio": ratio(ea, eb)}
        phases[ph] = {"a_e2e_us": pa["e2e_us_per_window"], "b_e2e_us": pb["e2e_us_per_window"],
                      "ratio": ratio(pa["e2e_us_per_window"], pb["e2e_us_per_window"]),
                      "a_verdict": pa["verdict"], "b_verdict": pb["verdict"], "categories": cats}
    ka = {(r["op"], r["bucket_bytes"]): r for r in a["message_sizes"]}
    sizes = []
    for r in b["message_sizes"]:
        o = ka.get((r["op"], r["bucket_bytes"]))
        if o:
            sizes.append({"op": r["op"], "bucket_bytes": r["bucket_bytes"], "a_median_us": o["median_us"],
                          "b_median_us": r["median_us"], "ratio": ratio(o["median_us"], r["median_us"])})
    return {"schema": "commprobe.compare/1", "a": a["source"]["path"], "b": b["source"]["path"],
            "phases": phases, "message_sizes": sizes}
