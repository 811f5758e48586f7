"""Bundle or traces in, one versioned JSON result out (`commprobe.analysis/1`): the
facade over the readers, the per-rank pipeline and the cross-rank step, in the shape of HTA's
TraceAnalysis.

The result holds, per rank and phase, end-to-end time and per-category total and exposed
time; the collectives matched across ranks with transfer vs straggler wait; message-size
buckets; unclassified names; and per phase a verdict with its numbers and recommendations.
Reports and the gate read only this result. The JSON Schema is analyzers/analysis.schema.json.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import numpy as np

from commprobe.common.bundle import (
    FLIGHT_RECORDER,
    MANIFEST,
    BundleError,
    job_of,
    read_manifest,
    read_timings,
    single_manifest,
    sub_bundles,
    telemetry_path,
    unprofiled_medians,
)
from commprobe.common.errors import InputError
from commprobe.common.vocab import WORK_CATEGORIES

from . import calibration as readcal  # the one calibration reader (the parameters below are named calibration)
from . import latency
from .cross_rank import cause, headroom
from .cross_rank.identity import assign, compile_rank_from
from .cross_rank.rank_map import map_ranks
from .cross_rank.reduce import Reduced, reduce_ranks, renamed_traffic
from .cross_rank.traffic import attach as attach_traffic
from .cross_rank.traffic import call_times
from .per_rank.classify import load_rules
from .readers import remote
from .readers.coordinates import table as name_table
from .readers.files import RankSet, front_end_files, split_traces, trace_files
from .readers.model import TraceError
from .readers.stages import group_files

SCHEMA = "commprobe.analysis/1"


def _telemetry(path: Path, manifest: dict | None, origin_ns: int) -> dict | None:
    """The bundle's telemetry as series on the run's clock, or None outside a bundle."""
    f = telemetry_path(path, manifest)
    if f is None:
        return None
    from .readers.telemetry import read_series

    return read_series(f, origin_ns)


def host_of(path: Path, manifest: dict | None) -> dict | None:
    """How contended the host was while a bundle's ranks ran (readers/telemetry.host_contention), or
    None without its telemetry; the analysis's verdicts and the gate both read it here."""
    f = telemetry_path(path, manifest)
    if f is None:
        return None
    from .readers.telemetry import host_contention

    return host_contention(f)


ALIGNMENTS = ("base", "collective-end")  # clocks: baseTimeNanoseconds, or the ends of matched collectives


def _timings(path: Path) -> dict | None:
    """A bundle's timings.json (our router's counts ride in it), or None."""
    try:
        return read_timings(Path(path))
    except (BundleError, OSError, ValueError):
        return None


def analyze(path: str | Path, **kw) -> dict:
    """The analysis result (see `analyze_with_calls`)."""
    return analyze_with_calls(path, **kw)[0]


def analyze_with_calls(path: str | Path, *, rules_file: str | None = None, threshold: float = 0.2,
                       align: str = "base", jobs: int = 1, scheduler: str | None = None, rank_from: str | None = None,
                       calibration: str | Path | None = None) -> tuple[dict, Reduced]:
    """Map each rank's trace to a summary (cross_rank/rank_map.py; `jobs` > 1: in that many worker processes;
    `scheduler`: on that Dask cluster), then reduce across ranks. The result does not depend on
    where the map ran. `calibration`: the zero-skew baseline that tells a slow transport from its
    floor, a sweep of this machine's collectives or a healthy run of the same job (calibration_rows).
    Returns (result, the reduce's Reduced: per rank its collective calls on the run's clock and
    their per-call facts, what a trace export draws beside the result; cross_rank/reduce.py)."""
    t0 = time.perf_counter()
    url = remote.is_url(path)  # an fsspec URL: traces only (a bundle is a local directory)
    path = path if url else Path(path)
    if not 0 < threshold < 1:
        raise TraceError(f"threshold must be between 0 and 1, got {threshold}")
    if align not in ALIGNMENTS:
        raise TraceError(f"unknown --align {align!r} ({', '.join(ALIGNMENTS)})")
    if jobs < 1:
        raise TraceError(f"jobs must be >= 1, got {jobs}")
    manifest = None if url else single_manifest(path)
    rules = load_rules(rules_file) if rules_file else []
    ranks, calls, unknown, files, nbytes, origins, traffic = [], {}, {}, [], 0, {}, {}
    links: dict[str, int] = {}
    graphs: dict[int, dict] = {}
    formats: dict[str, int] = {}
    notes: list[str] = []
    axis_reasons: dict[str, str] = {}
    compile_rank_from(rank_from)  # a bad pattern is one line before any file is read
    sweep = calibration_rows(calibration) if calibration else None
    cal_source = "; ".join(str(c) for c in readcal.paths_of(calibration)) if calibration else None
    rank_set = RankSet(path)
    files_in, other_docs = trace_files(path), []
    if len(files_in) > 1 or (not url and Path(path).is_dir()):  # a directory: other documents beside the traces
        files_in, other_docs = split_traces(files_in)
        if not files_in:
            raise TraceError(f"{path}: no traces: {len(other_docs)} JSON file(s), none a trace ("
                             + "; ".join(f"{Path(d['file']).name}: {d['why']}" for d in other_docs[:3]) + ")")
    files_in, merges = group_files(files_in)  # one rank's per-stage files: one unit; an engine's merge: aside
    other_docs += merges
    first = [f[0] if isinstance(f, tuple) else f for f in files_in]
    coords = name_table([remote.name_of(f) if url else Path(f).name for f in first])
    summaries = list(map_ranks(files_in, rules, jobs, scheduler, rank_from, coords))
    chosen = assign([{**s.reader.get("identity", {"file": Path(s.path).name}), "label": s.path} for s in summaries],
                    rank_from)
    notes += chosen.notes
    for s, rank in zip(summaries, chosen.ranks):
        s.rank = s.breakdown["rank"] = rank
        s.breakdown["rank_rule"] = chosen.rule
        ident = s.reader.get("identity") or {}
        s.breakdown["identity"] = {k: ident.get(k) for k in ("host", "pid", "device") if ident.get(k) is not None}
    for s in summaries:
        rank_set.add(s.rank, s.path, s.distributed)
        ranks.append(s.breakdown)
        calls[s.rank] = s.calls
        graphs[s.rank] = s.graphs
        for k, v in s.links.items():
            links[k] = links.get(k, 0) + v
        origins[s.rank] = s.origin_ns
        files.append(s.path)
        nbytes += s.uncompressed_bytes
        formats[s.reader["format"]] = formats.get(s.reader["format"], 0) + 1
        notes += [n for n in s.reader.get("notes", ()) if n not in notes]
        if s.axis_notes:
            axis_reasons[f"rank {s.rank}"] = "; ".join(s.axis_notes)
        for name, n in s.unknown_names.items():
            unknown[name] = unknown.get(name, 0) + n
        traffic[s.rank] = s.traffic
    ranks.sort(key=lambda r: r["rank"])
    skipped = [{"file": f, "why": "an engine's front-end process (vLLM API server): no rank, no device work"}
               for f in front_end_files(path)]
    if skipped:
        notes.append(f"{len(skipped)} front-end trace(s) kept apart, not ranks: "
                     + ", ".join(Path(s['file']).name for s in skipped))
    if other_docs:
        notes.append(f"{len(other_docs)} file(s) beside the traces skipped: "
                     + "; ".join(f"{Path(d['file']).name} ({d['why']})" for d in other_docs))
    skipped += other_docs
    red = reduce_ranks(ranks, calls, origins, graphs, align=align, threshold=threshold, sweep=sweep,
                       manifest=manifest, cal_source=cal_source, host=None if url else host_of(path, manifest))
    origin = red.origin
    ep = int(((manifest or {}).get("world") or {}).get("ep") or 0) if isinstance(manifest, dict) else 0
    traffic = renamed_traffic(traffic, red.instances)  # under the groups the calls were matched under
    red.traffic = attach_traffic(red.phases, traffic, _timings(path) if ep > 1 and not url else None, ep,
                                 call_times(red.calls, red.waits) if any(traffic.values()) else None)
    return {
        "schema": SCHEMA,
        "source": {"path": str(path), "files": sorted(files), "bundle": manifest is not None, "rank_rule": chosen.rule,
                   "uncompressed_bytes": nbytes, "formats": dict(sorted(formats.items())), "reader_notes": notes,
                   "skipped": skipped},
        "manifest": manifest,
        "threshold": threshold,
        "align": align,
        "ranks": ranks,
        "phases": red.phases,
        "collectives": red.matched,
        "message_sizes": red.buckets,
        "axis_provenance": red.provenance,
        "axes_by_category": red.axes,
        "axis_reasons": dict(sorted(axis_reasons.items())),
        "kernel_links": links,
        "graphs": {str(r): g for r, g in sorted(graphs.items())},
        "origin_ns": origin,
        "telemetry": None if url else _telemetry(path, manifest, origin),
        "unclassified": {"count": sum(unknown.values()),
                         "names": [{"name": n, "count": c} for n, c in sorted(unknown.items(), key=lambda kv: -kv[1])[:50]]},
        "headroom": red.room,
        "elapsed_s": time.perf_counter() - t0,
    }, red


def calibration_rows(path) -> list[dict]:
    """The calibration's rows (backend, op, bytes, world, time_us, p10_us): a sweep's JSON
    (`commprobe bench collectives --json`), or a healthy run of the same job (a bundle, traces or
    their analysis JSON): its median transfer per op and size, measured as the trace measures
    (profiler spans included, which a sweep leaves out). A bundle of several backends (`profile
    --backend gloo,dda`) gives each backend's rows; several paths (a list, or joined by commas)
    give all their rows: the zero-skew baseline takes the trace's own backend's, the headroom
    (cross_rank/headroom.py) every backend's."""
    paths = readcal.paths_of(path)
    if len(paths) != 1:
        return [row for p in paths for row in calibration_rows(p)]
    p = Path(paths[0])
    key = _cache_key(p)
    if key is not None and key in _ROWS:  # a calibrate's rounds, read once per process (plan/intervals.py)
        return copy.deepcopy(_ROWS[key])
    rows = _calibration_rows(p, path)
    if key is not None:
        _ROWS[key] = copy.deepcopy(rows)
    return rows


_ROWS: dict[tuple, list[dict]] = {}


def _cache_key(p: Path) -> tuple | None:
    """A bundle directory's identity for the rows cache: its path and its manifest's mtime (a bundle
    written again in the same place is read again); None for anything else."""
    try:
        return (str(p.resolve()), (p / MANIFEST).stat().st_mtime_ns) if p.is_dir() else None
    except OSError:
        return None


def _calibration_rows(p: Path, path) -> list[dict]:
    if p.is_dir() and (p / "manifest.json").is_file():
        subs = sub_bundles(read_manifest(p))
        if subs:
            return [row for d in subs.values() for row in calibration_rows(p / d)]
    if p.suffix == ".json" and p.is_file():
        doc = readcal.read_json(p)  # says in one line why it is not one
        if not (isinstance(doc, dict) and str(doc.get("schema", "")).startswith("commprobe.analysis/")):
            return readcal.sweep_rows(doc, p)
    elif not p.exists():
        raise readcal.CalibrationError(f"{path}: no such calibration (a sweep's JSON, or a healthy run's bundle)")
    res = load_result(p)
    backend = cause.backend_of(res.get("manifest"), [])
    outside = headroom.outside_calls(res["ranks"])
    measured = unprofiled_medians(p)  # {} for an analysis JSON
    unprofiled = headroom.unprofiled_ratio(res["ranks"], measured)
    rows = [{"backend": backend or "", "op": b["op"], "bytes": int(b["mean_bytes"]), "world": b["group_size"],
             "time_us": b["median_us"], "p10_us": float(np.percentile(b["samples_us"], 10)) if b["samples_us"] else
             b["median_us"], "count": b["count"], **({"mean_us": b["mean_cost_us"]} if "mean_cost_us" in b else {}),
             "outside_us_per_window": outside, "unprofiled_ratio": unprofiled, "unprofiled_ms": measured, "run": str(p),
             "job": job_of(res.get("manifest"))}
            for b in res["message_sizes"] if b["median_us"] > 0 and b["mean_bytes"] > 0]
    if not rows or not backend:
        raise readcal.CalibrationError(f"{path}: a calibration run needs matched collectives of known size and "
                                           f"its backend (a commprobe bundle)")
    return rows


def analyze_backends(path: str | Path, jobs: int = 1, calibration=None) -> dict[str, dict] | None:
    """A bundle with one sub-bundle per backend: {backend: analysis}, in the run's order; else None."""
    p = Path(path)
    subs = sub_bundles(read_manifest(p))
    return {b: analyze(p / d, jobs=jobs, calibration=calibration) for b, d in subs.items()} or None


def load_result(path: str | Path, jobs: int = 1, calibration=None) -> dict:
    """An analysis JSON file, or anything `analyze` accepts (with `calibration`, as analyze takes it;
    an analysis JSON is analyzed already and cannot take one)."""
    if remote.is_url(path):
        return analyze(path, jobs=jobs, calibration=calibration)
    p = Path(path)
    try:
        is_json = p.suffix == ".json" and p.is_file()
    except OSError:  # unreadable: analyze() names the problem in one line
        is_json = False
    if is_json:
        try:
            doc = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            doc = None
        if isinstance(doc, dict) and doc.get("schema", "").startswith("commprobe.analysis/"):
            if doc["schema"] != SCHEMA:
                raise TraceError(f"{p}: analysis schema {doc['schema']} is not {SCHEMA}")
            if calibration:
                raise TraceError(f"{p}: an analysis JSON is analyzed already and cannot take --calibration: give the "
                                 "run (bundle or traces), or analyze it with --calibration first")
            return doc
    return analyze(p, jobs=jobs, calibration=calibration)


def compare(a: dict, b: dict) -> dict:
    """B against A per phase, category and message size; ratios are B / A (> 1: B slower)."""
    def ratio(x, y):
        return y / x if x else None

    phases = {}
    for ph in sorted(set(a["phases"]) & set(b["phases"])):
        pa, pb = a["phases"][ph], b["phases"][ph]
        cats = {}
        for c in WORK_CATEGORIES:
            ea = pa["exposed_share"][c] * pa["e2e_us_per_window"]
            eb = pb["exposed_share"][c] * pb["e2e_us_per_window"]
            cats[c] = {"a_us": ea, "b_us": eb, "ratio": ratio(ea, eb)}
        ca, cb = pa.get("communication_cause") or {}, pb.get("communication_cause") or {}
        phases[ph] = {"a_e2e_us": pa["e2e_us_per_window"], "b_e2e_us": pb["e2e_us_per_window"],
                      "ratio": ratio(pa["e2e_us_per_window"], pb["e2e_us_per_window"]),
                      "a_verdict": pa["verdict"], "b_verdict": pb["verdict"], "categories": cats,
                      "split": {side: {"class": c.get("class"), "transfer_share": c.get("transfer_share"),
                                       "wait_share": c.get("wait_share"), "culprit": c.get("culprit")}
                                for side, c in (("a", ca), ("b", cb)) if c}}
    ka = {(r["op"], r["bucket_bytes"]): r for r in a["message_sizes"]}
    sizes = []
    for r in b["message_sizes"]:
        o = ka.get((r["op"], r["bucket_bytes"]))
        if o:
            sizes.append({"op": r["op"], "bucket_bytes": r["bucket_bytes"], "a_median_us": o["median_us"],
                          "b_median_us": r["median_us"], "ratio": ratio(o["median_us"], r["median_us"])})
    return {"schema": "commprobe.compare/1", "a": a["source"]["path"], "b": b["source"]["path"],
            "latency": latency.compare(a["source"]["path"], b["source"]["path"]),
            "phases": phases, "message_sizes": sizes}


def report_inputs(path: str | Path, other: str | Path | None = None, calibration=None) -> dict:
    """What `commprobe report` renders, gathered in one place: the analysis (the first backend's of a
    multi-backend bundle), the analyses to compare (per backend, or the two runs `path` and `other`)
    with analysis.compare of each against the first, and the hang diagnosis where the bundle holds
    Flight Recorder records. A bundle that hung before writing any trace has only the latter
    (`result` None). `calibration`: each analysis gets the headroom against it (analyze's)."""
    from .hang import analyze_hang

    hang = None
    if not remote.is_url(path) and (Path(path) / FLIGHT_RECORDER).is_dir():
        hang = analyze_hang(path)
    if other is not None:
        a, b = load_result(path, calibration=calibration), load_result(other, calibration=calibration)
        la, lb = Path(str(path)).name or "A", Path(str(other)).name or "B"
        if la == lb:
            la, lb = f"A: {la}", f"B: {lb}"
        by_label = {la: a, lb: b}
    else:
        try:
            by_label = analyze_backends(path, calibration=calibration) or {}
        except InputError:
            by_label = {}
        if not by_label:
            try:
                by_label = {"": load_result(path, calibration=calibration)}
            except InputError:
                if hang is None:
                    raise
                return {"result": None, "by_label": {}, "comparisons": {}, "hang": hang}
    labels = list(by_label)
    first = by_label[labels[0]]
    comparisons = {lb: compare(first, by_label[lb]) for lb in labels[1:]}
    return {"result": first, "by_label": by_label if len(by_label) > 1 else {}, "comparisons": comparisons,
            "hang": hang}
