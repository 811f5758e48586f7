"""Fit a machine's profile from what commprobe measured on it: sweeps and profile bundles.

- **Links** from `commprobe bench collectives --json` rows (allreduce, 2 ranks): a least-
  squares line t = a + S b over the sizes, per backend, read through that backend's
  algorithm at n = 2: the ring (gloo, NCCL) pays 2a per call, so alpha = a/2 and B = 1/b;
  DDA one-shot pays one alpha, so alpha = a, B = 1/b.
- **Time-sharing** from `commprobe bench time-sharing --json` (probe/bench/timeshare.py:
  more ranks than cores against one rank per core, side by side): per work size, the extra
  per collective call beyond the ranks/cores factor, against the interval between calls; a
  curve the cost model interpolates, not a fitted form.
- **Stragglers** from the same bundles: per phase, the median over runs of what the ranks
  were blocked in collectives beyond the model's transfer time, over the model's compute and
  overhead (fitted first): the wait for the slowest peer, proportional to the work between
  calls.
- **Compute** from bundles (manifest + timings.json): per run and phase, the un-profiled
  median time minus the blocked communication the ranks measured is compute. The model's
  own roofline then fixes the effective memory bandwidth (decode steps: weight-bound), the
  effective FLOP rate (prefill: FLOP-bound) and a per-layer overhead (the interpreter), by
  alternating least squares on those three unknowns. Efficiencies are then 1: the fitted
  rates *are* what this machine reaches.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np

from commprobe.analyzers import calibration as readcal
from commprobe.common.bundle import (
    BundleError,
    read_manifest,
    read_timings,
    require_manifest,
    sub_bundles,
    timing_samples,
)

from .costmodel import Layout, Options, Workload, _phase, rates
from .hardware import Hardware, Link, PlanError

RING_BACKENDS = ("gloo", "nccl", "rccl", "mpi")


def fit_links(rows: list[dict]) -> dict[str, Link]:
    """{"ring": Link, "dda": Link} from sweep rows of 2-rank allreduces (whichever backends are present)."""
    out: dict[str, Link] = {}
    for kind, backends in (("ring", RING_BACKENDS), ("dda", ("dda",))):
        pts = [(r["bytes"], r["time_us"]) for r in rows
               if r.get("op") == "allreduce" and r.get("world") == 2 and r.get("backend") in backends]
        if len(pts) < 2:
            continue
        x, y = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)
        w = 1 / y  # relative errors: small messages count as much as large ones
        a, b = np.polyfit(x, y, 1, w=w)[::-1]
        a, b = max(float(a), 0.1), max(float(b), 1e-9)
        out[kind] = Link(a / 2 if kind == "ring" else a, 1 / b / 1e3)
    return out


def fit_time_sharing(rows: list[dict]) -> list[tuple[float, float]]:
    """[(interval µs, extra µs per call per extra rank per core)] from `commprobe bench
    time-sharing --json` rows, or []. Repeated benchmarks count by their median per work size.
    DDA's rows are used when there are any (the reference runs' backend here)."""
    rows = [r for r in rows if r.get("bench") == "time-sharing"]
    if any(r.get("backend") == "dda" for r in rows):
        rows = [r for r in rows if r.get("backend") == "dda"]
    pts: dict[tuple, list[tuple[float, float]]] = {}
    for r in rows:
        pts.setdefault((r["work_bytes"], r["world"], r["cores"]), []).append((r["interval_us"], r["extra_us"]))
    return sorted((statistics.median(x for x, _ in v), statistics.median(y for _, y in v)) for v in pts.values())


def read_run(path: Path) -> dict:
    """One bundle's facts for calibration and validation."""
    from commprobe.reference_impl.config import ModelConfig

    m = require_manifest(path)
    if sub_bundles(m):
        raise PlanError(f"{path}: has one bundle per backend; pass one of them ({', '.join(sub_bundles(m))})")
    samples = timing_samples(read_timings(path))
    known = set(ModelConfig.__dataclass_fields__)
    model = ModelConfig(**{k: v for k, v in m["model"].items() if k in known})
    world = m["world"]
    med = {n: statistics.median(x) for n, x in samples.items()}
    run = m["run"]
    return {"path": str(path), "model": model, "layout": Layout(world["tp"], world.get("cp", 1), world.get("ep", 1)),
            "backend": m["backend"], "batch": run["batch"], "prompt_len": run["prompt_len"],
            "decode_steps": run["decode_steps"], "ttft_ms": med["ttft_ms"], "ttit_ms": med["ttit_ms"],
            "prefill_comm_share": sum(v for n, v in med.items() if n.startswith("prefill_comm_share/")),
            "decode_comm_share": sum(v for n, v in med.items() if n.startswith("decode_comm_share/"))}


def routed_histogram(path: Path) -> np.ndarray | None:
    """Tokens routed to each expert in a profiled MoE run's prefill, per layer ([layers, experts]),
    or None for a dense model. Ranks of one TP group route the same tokens (counted once); EP
    and CP ranks route distinct ones (summed). A property of the weights and the prompt, not
    the layout: a TP run tells what an EP run of the same model and prompt will route."""
    try:
        doc = read_timings(path)
        tp = (read_manifest(path) or {})["world"]["tp"]
    except (BundleError, KeyError, TypeError) as e:
        raise PlanError(f"{path}: not a profile bundle with timings ({e})") from None
    rows = [r["routed_tokens"]["prefill"] for r in doc.get("ranks", []) if r.get("routed_tokens", {}).get("prefill")]
    return np.sum(np.array(rows, float), axis=0) / tp if rows else None


def expert_imbalance(hist: np.ndarray, ep: int) -> float:
    """Rows the busiest EP rank's experts get over the mean, per layer, summed over layers (each
    layer's all-to-all waits for its busiest rank), with rank r holding the r-th contiguous slice
    of experts, as reference_impl/ep.py places them."""
    layers, experts = hist.shape
    if ep <= 1:
        return 1.0
    if experts % ep:
        raise PlanError(f"{experts} experts do not split over EP={ep}")
    loads = hist.reshape(layers, ep, experts // ep).sum(axis=2)
    mean = loads.mean(axis=1).sum()
    return float(loads.max(axis=1).sum() / mean) if mean > 0 else 1.0


def workload_of(run: dict) -> Workload:
    """The reference implementation's work: logits for every prompt token; decode context mid-run."""
    return Workload(run["model"], batch=run["batch"], prompt_len=run["prompt_len"],
                    decode_context=run["prompt_len"] + run["decode_steps"] // 2, full_logits=True)


def options_of(run: dict) -> Options:
    return Options(allreduce="dda" if run["backend"] == "dda" else "ring")


PRIOR = {"flops_per_us": 2e4, "bytes_per_us": 1e4, "overhead_us": 50.0}  # 20 GFLOP/s, 10 GB/s, 50 µs


def fit_compute(runs: list[dict], hw: Hardware, iterations: int = 20) -> Hardware:
    """Effective FLOP rate, memory bandwidth and per-layer overheads (prefill, decode) from the runs.

    With the model's own roofline, each op group is FLOP- or byte-bound at the current
    estimate, so every measured compute time is linear in (1/F, 1/B, o_prefill, o_decode):
    weighted least squares (relative errors) with a weak ridge toward PRIOR, which decides
    only what the runs cannot (a single overhead-bound run says nothing of bandwidth);
    repeated until the bound of each group settles."""
    if not runs:
        raise PlanError("calibration needs at least one profile bundle")
    hw = replace(hw, compute_eff=1.0, mem_eff=1.0, peak_tflops=PRIOR["flops_per_us"] / 1e6,
                 mem_bw_GBps=PRIOR["bytes_per_us"] / 1e3, layer_overhead_us=PRIOR["overhead_us"],
                 prefill_layer_overhead_us=PRIOR["overhead_us"])
    meas = []
    for r in runs:
        meas.append((r, False, r["ttft_ms"] * 1e3 * (1 - r["prefill_comm_share"])))
        meas.append((r, True, r["ttit_ms"] * 1e3 * (1 - r["decode_comm_share"])))
    x0 = np.array([1 / PRIOR["flops_per_us"], 1 / PRIOR["bytes_per_us"], PRIOR["overhead_us"], PRIOR["overhead_us"]])
    for _ in range(iterations):
        rows, ys = [], []
        for r, dec, y in meas:
            cost = _phase(workload_of(r), r["layout"], hw, options_of(r), dec)
            fr, mr, share = rates(hw, r["layout"].world)
            on_host = hw.bytes_per_us / mr
            a = np.zeros(4)
            for _, f, by, n in cost.work.groups:
                if f / fr >= by / mr:
                    a[0] += n * f * share
                else:
                    a[1] += n * by * on_host
            a[3 if dec else 2] = r["model"].n_layers * share
            rows.append(a / y)  # relative error
            ys.append(1.0)
        A, Y = np.array(rows), np.array(ys)
        lam = 1e-3
        D = np.diag(1 / x0)  # the ridge in relative units of each unknown
        x = np.linalg.solve(A.T @ A + lam * D.T @ D, A.T @ Y + lam * D.T @ D @ x0)
        x = np.maximum(x, x0 * 1e-3)
        hw = replace(hw, peak_tflops=1 / x[0] / 1e6, mem_bw_GBps=1 / x[1] / 1e3,
                     prefill_layer_overhead_us=float(x[2]), layer_overhead_us=float(x[3]))
    return hw


def fit_stragglers(runs: list[dict], hw: Hardware) -> Hardware:
    """What the runs' ranks were blocked in collectives beyond the modelled transfer, as a
    fraction of the modelled compute and overhead, per phase (median over runs with
    collectives): the wait for the slowest peer, which a sweep's lock-step loop never shows."""
    frac: dict[bool, list[float]] = {False: [], True: []}
    for r in runs:
        if r["layout"].world < 2:
            continue
        for dec, total_ms, share in ((False, r["ttft_ms"], r["prefill_comm_share"]),
                                     (True, r["ttit_ms"], r["decode_comm_share"])):
            cost = _phase(workload_of(r), r["layout"], hw, options_of(r), dec)
            work = cost.compute_us + cost.overhead_us
            if work > 0:
                frac[dec].append(max(0.0, total_ms * 1e3 * share - sum(cost.exposed_us.values())) / work)
    med = {k: statistics.median(v) if v else 0.0 for k, v in frac.items()}
    return replace(hw, straggler_prefill=med[False], straggler_decode=med[True])


def calibrate(paths: list[str], name: str = "this-machine", devices: int | None = None) -> tuple[Hardware, list[dict]]:
    import os

    rows, runs = [], []
    for p in map(Path, paths):
        if p.is_dir():
            runs.append(read_run(p))
        else:
            doc = readcal.read_json(p)  # the one calibration reader: checked rows, one line otherwise
            shared = readcal.time_sharing_rows(doc)
            rows += shared + (readcal.sweep_rows(doc, p) if not shared else
                              [r for r in map(readcal.collective_row, readcal.listed(doc)) if r is not None])
    links = fit_links(rows)
    if "ring" not in links and "dda" not in links:
        raise PlanError("calibration needs a sweep with 2-rank allreduce rows (commprobe bench collectives --json)")
    intra = links.get("ring") or links["dda"]
    hw = Hardware(name=name, description="calibrated by commprobe plan calibrate (fp32 reference model on CPU)",
                  devices_per_host=devices or os.cpu_count() or 1, peak_tflops=0.02, mem_bw_GBps=10.0,
                  compute_eff=1.0, mem_eff=1.0, links={"intra": intra, "inter": intra, **links}, dtype_bytes=4,
                  mem_bw_scope="host", sources=[f"calibrated from {', '.join(paths)}"])
    hw.time_sharing = fit_time_sharing(rows)
    hw = fit_compute(runs, hw)
    hw = fit_stragglers(runs, hw)
    hw.calibration = {"runs": len(runs), "sweep_rows": len(rows)}
    return hw, runs

