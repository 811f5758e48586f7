"""Collectives matched across ranks: transfer vs waiting for a straggler; message-size buckets.

One event stands for each collective call on a rank, from the best source the trace has: our
own spans, else the device's communication kernels, else the host's collective ops. Calls
are matched across ranks by (process group, op, n-th call). For each matched call the rank
that arrives last determines the transfer time (its own duration: it did not wait); every
other rank's duration beyond that is waiting for the straggler, who is named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .classify import CATEGORIES, COMM_CODES, Classified, bus_factor
from .trace import Trace


@dataclass
class Call:
    key: tuple
    start: float
    end: float
    bytes: float
    op: str
    axis: str
    category: str
    group_size: int


def primary_calls(trace: Trace, cls: Classified) -> list[Call]:
    comm = np.flatnonzero(np.isin(cls.category, COMM_CODES))
    if len(comm) == 0:
        return []
    names = trace.names
    own = [i for i in comm if names[trace.name_id[i]].startswith("commprobe/comm/")]
    dev = trace.is_device()
    if own:
        pick = _outermost(trace, own)  # a user's span around our own counts once
    else:
        dev_comm = [i for i in comm if dev[i] and cls.comm_op[i]]
        host = [i for i in comm if not dev[i] and cls.comm_op[i] and names[trace.name_id[i]] == "record_param_comms"]
        host = host or [i for i in comm if not dev[i] and cls.comm_op[i]]
        pick = dev_comm or _outermost(trace, host)
    counters: dict[tuple, int] = {}
    calls = []
    for i in pick:
        op = cls.comm_op[i] or "unknown"
        group = cls.comm_group[i] or cls.comm_axis[i] or ""
        k = counters.get((group, op), 0)
        counters[(group, op)] = k + 1
        calls.append(Call((group, op, k), float(trace.ts[i]), float(trace.ts[i] + trace.dur[i]), float(cls.comm_bytes[i]),
                          op, cls.comm_axis[i] or "other", CATEGORIES[int(cls.category[i])], int(cls.group_size[i])))
    return calls


def _outermost(trace: Trace, idx: list[int]) -> list[int]:
    """Host ops nest (c10d::allreduce_ inside record_param_comms...): keep the outermost per thread."""
    out, last_end = [], {}
    for i in sorted(idx, key=lambda i: (trace.ts[i], -trace.dur[i])):
        t = trace.lazy.tid(i)
        if trace.ts[i] < last_end.get(t, -math.inf):
            continue
        out.append(i)
        last_end[t] = trace.ts[i] + trace.dur[i]
    return out


def align_offsets(calls_by_rank: dict[int, list[Call]]) -> dict[int, float]:
    """Per-rank clock offsets (µs) that make matched collectives end together (median)."""
    ranks = sorted(calls_by_rank)
    if not ranks:
        return {}
    ref = {c.key: c.end for c in calls_by_rank[ranks[0]]}
    out = {ranks[0]: 0.0}
    for r in ranks[1:]:
        d = [c.end - ref[c.key] for c in calls_by_rank[r] if c.key in ref]
        out[r] = float(np.median(d)) if d else 0.0
    return out


def match(calls_by_rank: dict[int, list[Call]], offsets: dict[int, float] | None = None) -> dict:
    offsets = offsets or {r: 0.0 for r in calls_by_rank}
    ranks = sorted(calls_by_rank)
    by_key: dict[tuple, dict[int, Call]] = {}
    for r in ranks:
        for c in calls_by_rank[r]:
            by_key.setdefault(c.key, {})[r] = c
    per_rank = {r: {"rank": r, "transfer_us": 0.0, "wait_us": 0.0, "calls": 0, "times_last": 0, "caused_wait_us": 0.0}
                for r in ranks}
    matched = 0
    waits_per_call = {}
    for key, group in by_key.items():
        if len(group) < 2 or len(group) != len(ranks):
            continue
        matched += 1
        arrivals = {r: c.start - offsets.get(r, 0.0) for r, c in group.items()}
        last = max(arrivals, key=arrivals.get)
        transfer = group[last].end - group[last].start
        per_rank[last]["times_last"] += 1
        for r, c in group.items():
            d = c.end - c.start
            wait = max(0.0, d - transfer)
            per_rank[r]["transfer_us"] += d - wait
            per_rank[r]["wait_us"] += wait
            per_rank[r]["calls"] += 1
            per_rank[last]["caused_wait_us"] += wait
            waits_per_call[(r, key)] = (wait, transfer)
    straggler = max(per_rank.values(), key=lambda x: x["caused_wait_us"])["rank"] if matched else None
    if straggler is not None and per_rank[straggler]["caused_wait_us"] == 0:
        straggler = None
    return {"matched_calls": matched, "ranks": [per_rank[r] for r in ranks], "straggler": straggler,
            "offsets_us": {str(r): offsets.get(r, 0.0) for r in ranks}, "_waits": waits_per_call}


MAX_SAMPLES = 256  # per bucket, kept in the result for the regression gate's statistics


def thin(x: np.ndarray, k: int, digits: int) -> list[float]:
    """At most k of the samples, evenly spaced in order (keeps drift visible, bounds the JSON)."""
    if len(x) > k:
        x = x[np.linspace(0, len(x) - 1, k).round().astype(int)]
    return [round(float(v), digits) for v in x]


def size_buckets(calls_by_rank: dict[int, list[Call]], waits: dict) -> list[dict]:
    """Per (op, axis, power-of-two size bucket): count, median/p90 latency, algbw, busbw.

    Latency of a matched call is its transfer time (waiting for a straggler is not the
    network's fault); of an unmatched call, its duration.
    """
    groups: dict[tuple, list[tuple[float, float, int]]] = {}
    for r, calls in calls_by_rank.items():
        for c in calls:
            if not (c.bytes > 0):
                continue
            lat = waits[(r, c.key)][1] if (r, c.key) in waits else c.end - c.start
            bucket = 1 << max(0, math.ceil(math.log2(c.bytes)))
            groups.setdefault((c.op, c.axis, c.category, bucket), []).append((lat, c.bytes, c.group_size or len(calls_by_rank)))
    rows = []
    for (op, axis, cat, bucket), xs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][3])):
        lats = np.array([x[0] for x in xs])
        med = float(np.median(lats))
        mean_bytes = float(np.mean([x[1] for x in xs]))
        n = int(np.median([x[2] for x in xs]))
        algbw = mean_bytes / med / 1e3 if med > 0 else 0.0  # bytes/µs -> GB/s
        rows.append({"op": op, "axis": axis, "category": cat, "bucket_bytes": bucket, "count": len(xs),
                     "median_us": med, "p90_us": float(np.percentile(lats, 90)), "mean_bytes": mean_bytes,
                     "group_size": n, "algbw_GBps": algbw, "busbw_GBps": algbw * bus_factor(op, n),
                     "samples_us": thin(lats, MAX_SAMPLES, 3)})
    return rows
