"""Telemetry samples (the probe's telemetry.jsonl) as time series on the traces' clock.

The probe stamps every sample with Unix nanoseconds from the same clock as the traces'
`baseTimeNanoseconds`, so a sample at t_ns sits at (t_ns - origin_ns) / 1000 µs on the
analysis's timeline, where the phases' windows are. Series are thinned to at most
MAX_POINTS points each so a long run's report stays small.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

MAX_POINTS = 2000
# A host is contended where other work took at least this many cores on average while the ranks ran
# and the host had (nearly) no core free: runs of the reference model here measure 0.00-0.04 cores
# of other work quiet, 0.67-0.74 beside one busy process (bench/RESULTS.md, "A contended host").
CONTENDED_CORES = 0.1
SATURATED = 0.9
CHUNK_NS = 1_000_000_000  # other_cores_max: over stretches of at least a second (the counters tick at 10 ms)


def _records(path: Path) -> tuple | None:
    """The file's lines parsed (None for a line that is not JSON), or None where it cannot be read:
    parsed once per file state for both readers below (an analysis reads the series and the host's
    contention; the gate the contention again)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return _parsed(str(path), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=4)
def _parsed(path: str, mtime_ns: int, size: int) -> tuple | None:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append(None)
    return tuple(out)


def _nums(xs) -> list:
    return [x for x in xs if isinstance(x, (int, float))]


def read_series(path: Path, origin_ns: int) -> dict:
    """{"series": {label: {"unit", "t_us": [...], "v": [...]}}, "samples": n, "errors": n} from a JSONL file."""
    series: dict[str, dict] = {}
    bad = n = 0
    prev_ctx: dict[str, tuple[float, int]] = {}
    prev_bytes: dict[str, tuple[float, float]] = {}

    def rate(label: str, t: float, total_bytes) -> None:
        """A cumulative byte counter as GB/s between successive samples."""
        if not isinstance(total_bytes, (int, float)):
            return
        if label in prev_bytes and t > prev_bytes[label][0] and total_bytes >= prev_bytes[label][1]:
            t0, b0 = prev_bytes[label]
            add(label, "GB/s", t, (total_bytes - b0) / ((t - t0) * 1e3))
        prev_bytes[label] = (t, total_bytes)

    def add(label: str, unit: str, t: float, v) -> None:
        if isinstance(v, (int, float)):
            s = series.setdefault(label, {"unit": unit, "t_us": [], "v": []})
            s["t_us"].append(t)
            s["v"].append(float(v))

    recs = _records(path)
    if recs is None:
        return {"series": {}, "samples": 0, "errors": 0}
    for rec in recs:
        try:
            t = (int(rec["t_ns"]) - origin_ns) / 1000.0
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        n += 1
        src = rec.get("source")
        if src == "host":
            util = _nums(rec.get("cpu_util_pct") or [])
            if util:
                add("host CPU utilization (mean of cores)", "%", t, sum(util) / len(util))
            for r, d in sorted((rec.get("ranks") or {}).items()):
                if not isinstance(d, dict):
                    continue
                add(f"rank {r} RSS", "MB", t, (d.get("rss_bytes") or 0) / 1e6 if "rss_bytes" in d else None)
                ctx = d.get("ctx_involuntary")
                if isinstance(ctx, int):
                    if r in prev_ctx and t > prev_ctx[r][0]:
                        add(f"rank {r} involuntary context switches", "/s", t,
                            (ctx - prev_ctx[r][1]) / ((t - prev_ctx[r][0]) / 1e6))
                    prev_ctx[r] = (t, ctx)
        elif src in ("nvidia", "amd"):
            for d in rec.get("devices") or []:
                if not isinstance(d, dict):
                    continue
                g = d.get("gpu")
                if src == "nvidia":
                    add(f"GPU {g} SM utilization", "%", t, d.get("sm_util_pct"))
                    add(f"GPU {g} memory utilization", "%", t, d.get("mem_util_pct"))
                    add(f"GPU {g} power", "W", t, d.get("power_w"))
                    for key, what in (("pcie_tx_kBps", "PCIe TX"), ("pcie_rx_kBps", "PCIe RX")):
                        v = d.get(key)
                        add(f"GPU {g} {what}", "GB/s", t, v / 1e6 if isinstance(v, (int, float)) else None)
                    for key, what in (("nvlink_tx_KiB", "NVLink TX"), ("nvlink_rx_KiB", "NVLink RX")):
                        v = d.get(key)
                        rate(f"GPU {g} {what}", t, v * 1024 if isinstance(v, (int, float)) else None)
                else:
                    act = d.get("activity") if isinstance(d.get("activity"), dict) else {}
                    add(f"GPU {g} activity", "%", t, act.get("gfx_activity"))
                    for key, what in (("xgmi_read_KB", "XGMI read"), ("xgmi_write_KB", "XGMI write")):
                        v = d.get(key)
                        rate(f"GPU {g} {what}", t, v * 1000 if isinstance(v, (int, float)) else None)
    for s in series.values():
        k = len(s["t_us"])
        if k > MAX_POINTS:
            step = -(-k // MAX_POINTS)
            s["t_us"], s["v"] = s["t_us"][::step], s["v"][::step]
    return {"series": series, "samples": n, "errors": bad}


def host_contention(path: Path) -> dict | None:
    """How much of the host's CPUs other work took while every rank ran: over successive host
    samples that list the same ranks with their CPU time, (the host's busy CPU time - its interrupt
    time - the ranks' - the sampler's) / elapsed, in cores, and the hypervisor's steal the same way.
    Interrupt time is no process's: the ranks' own loopback traffic (gloo's TCP) makes some of it, so
    it is left out rather than counted as other work. A contended host
    slows a CPU transport (gloo, DDA on shared memory) and a rank's launches as a slower link or a
    slow rank would, so the cause analysis reads this before naming either.

    None where the samples do not carry the counters (older bundles), see fewer ranks than the
    host ran (torchrun's sampler sees its own rank, and says how many ran there: `ranks_on_host`),
    or no interval has every rank."""
    recs = _records(path)
    if recs is None:
        return None
    prev = None
    elapsed = other = steal = busy = 0.0
    chunk = [0.0, 0.0]  # elapsed, other work: the busiest stretch of at least CHUNK_NS
    worst = None
    intervals = 0
    cores = None
    for rec in recs:
        cur = _host_counters(rec)
        if cur is None:
            prev = None
            continue
        if prev is not None and cur["ranks"] == prev["ranks"] and cur["t"] > prev["t"]:
            # not clipped per interval: the counters tick at 10 ms, so a 50 ms interval reads +-20 % of a
            # core either way, and clipping the negative ones would add that noise up as other work
            dt = cur["t"] - prev["t"]
            o = (cur["busy"] - prev["busy"]) - (cur["irq"] - prev["irq"]) - (cur["own"] - prev["own"])
            elapsed, other, steal = elapsed + dt, other + o, steal + max(0.0, cur["steal"] - prev["steal"])
            busy += max(0.0, cur["busy"] - prev["busy"])
            chunk = [chunk[0] + dt, chunk[1] + o]
            if chunk[0] >= CHUNK_NS:
                worst = max(worst or 0.0, chunk[1] / chunk[0])
                chunk = [0.0, 0.0]
            intervals += 1
        prev, cores = cur, cur["cores"]
    if not intervals:
        return None
    out = {"other_cores": max(0.0, other) / elapsed,
           "other_cores_max": max(0.0, worst) if worst is not None else max(0.0, other) / elapsed,
           "steal_cores": steal / elapsed, "busy_cores": busy / elapsed, "cores": cores, "seconds": elapsed / 1e9,
           "intervals": intervals}
    out["contended"] = bool(cores) and out["other_cores"] >= CONTENDED_CORES and out["busy_cores"] >= SATURATED * cores
    out["rule"] = (f"other work = (host busy CPU time - interrupts' - the ranks' - the sampler's) / elapsed, over the "
                   f"samples that saw every rank (the hypervisor's steal is part of it); contended where it is >= "
                   f"{CONTENDED_CORES:g} cores while the host was >= {SATURATED:.0%} busy: a rank then waits for a core")
    return out


def _host_counters(rec) -> dict | None:
    """One host sample's cumulative counters, or None where it lacks any of them."""
    if not isinstance(rec, dict) or rec.get("source") != "host":
        return None
    ranks = rec.get("ranks")
    busy, st, t = rec.get("cpu_busy_ns"), rec.get("cpu_steal_ns"), rec.get("t_ns")
    if not (isinstance(ranks, dict) and ranks and all(isinstance(x, int) for x in (busy, st, t))):
        return None
    if len(ranks) < (rec.get("ranks_on_host") or 0):  # ranks here it did not sample (torchrun): their CPU is not other work
        return None
    own, pids = 0, set()
    for d in ranks.values():
        if not (isinstance(d, dict) and isinstance(d.get("cpu_ns"), int)):
            return None
        own += d["cpu_ns"]
        pids.add(d.get("pid"))
    s = rec.get("sampler")
    if isinstance(s, dict) and isinstance(s.get("cpu_ns"), int) and s.get("pid") not in pids:
        own += s["cpu_ns"]
    irq = rec.get("cpu_irq_ns")
    return {"t": t, "busy": busy, "steal": st, "irq": irq if isinstance(irq, int) else 0, "own": own,
            "ranks": frozenset(pids),
            "cores": rec.get("cores") if isinstance(rec.get("cores"), int) else len(rec.get("cpu_util_pct") or [])}
