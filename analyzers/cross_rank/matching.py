"""Collectives matched across ranks: transfer vs waiting for a straggler; message-size buckets.

Calls (per_rank/calls.py) are matched across ranks by their keys. For each matched call the rank
that arrives last determines the transfer time (its own duration: it did not wait); every other
rank's duration beyond that is waiting for the straggler, who is named.

A key is one whole collective when as many ranks hold it as its group has members (`expected`):
the group's recorded size, at most the ranks present (a world group of 8 seen on 2 ranks' traces
pairs those 2), or every rank where no size is recorded. Several groups of one axis (TP pairs of a
TP x EP job) are matched each within its own ranks; a key several groups share under one name
(more holders than members) is left unmatched rather than paired across groups that never meet.
"""

from __future__ import annotations

import numpy as np

from commprobe.common.vocab import bus_factor

from ..per_rank.calls import Calls, group_starts
from ..per_rank.sampling import thin
from .straggler import Standing, stands_out


def _global_keys(calls_by_rank: dict[int, Calls]) -> dict[int, np.ndarray]:
    """Per rank, int64 match keys on one numbering of (group, op) pairs for the whole run."""
    table: dict[tuple, int] = {}
    out = {}
    for r, c in calls_by_rank.items():
        lut = np.array([table.setdefault(p, len(table)) for p in c.pairs], np.int64)
        out[r] = (lut[c.pair] << 32) + c.k if len(c) else np.zeros(0, np.int64)
    return out


def _expected(key: np.ndarray, gsize: np.ndarray, nr: int) -> tuple[np.ndarray, ...]:
    """(order, first, count, expected, recorded): the calls sorted by key (stable: rank order within
    a key), where each key's run begins, how many calls hold it, and how many should: its recorded
    group size (`recorded`, the largest its calls record, 0 for none) capped at the ranks present,
    or every rank without one."""
    order = np.argsort(key, kind="stable")
    first = group_starts(key[order])
    count = np.diff(np.r_[first, len(key)])
    if not len(first):
        return order, first, count, count, count
    gs = np.maximum.reduceat(gsize[order], first) if len(gsize) else np.zeros(len(first), np.int64)
    return order, first, count, np.where(gs > 0, np.minimum(gs, nr), nr), gs


def align_offsets(calls_by_rank: dict[int, Calls]) -> dict[int, float]:
    """Per-rank clock offsets (µs) that make matched collectives end together (median)."""
    ranks = sorted(calls_by_rank)
    if not ranks:
        return {}
    keys = _global_keys(calls_by_rank)
    ref = calls_by_rank[ranks[0]]
    out = {ranks[0]: 0.0}
    for r in ranks[1:]:
        _, a, b = np.intersect1d(keys[ranks[0]], keys[r], assume_unique=True, return_indices=True)
        out[r] = float(np.median(calls_by_rank[r].end[b] - ref.end[a])) if len(a) else 0.0
    return out


CLOCK, DURATIONS = "clock", "durations"
CAUSALITY_TOL_US = 1.0  # clock resolution: an end this much before another rank's start is a clock's doing
CLOCK_BROKEN_SHARE = 0.9  # of matched calls ending before another rank entered them: the clocks are not one


def arrival_rule(calls_by_rank: dict[int, Calls], hosts: dict[int, str | None],
                 offsets: dict[int, float] | None = None) -> tuple[str, str]:
    """Which time tells who arrived last at a collective, and why: the best evidence the set has.

    `clock`: the ranks' start times, where they are on one clock (one host; or the user's
    --align collective-end put them on one) and no matched call contradicts it. `durations`:
    where the ranks ran on several hosts (each host its own clock: a multi-node Nsight
    collection, torchrun agents on several machines) or nearly every matched call ends on a rank
    before another entered it (impossible on one clock for a collective every rank must enter) and
    one offset per rank puts them back in order (what an op that returns early does not do):
    the calls are taken to end together, so the rank that spent the least time in a call
    arrived last. Either way the waits are computed from the same time (matching.match)."""
    offsets = offsets or {}
    named = {h for h in hosts.values() if h}
    if len(named) > 1 and not offsets:
        return DURATIONS, (f"ranks on {len(named)} hosts, whose clocks are not one: arrival from each rank's time in "
                           f"the call (the calls taken to end together); held and carried waiting cannot be told")
    broken, full = _out_of_order(calls_by_rank, offsets)
    # An op that returns before its collective completes (gloo's c10d::allreduce_ enqueues and
    # returns, its thread's gloo:all_reduce is the collective; NCCL's host ops) ends before a later
    # rank enters without any clock's doing. A clock's doing puts nearly every call out of order,
    # and one offset per rank (the calls' ends aligned) puts them back.
    if full and broken >= CLOCK_BROKEN_SHARE * full and not offsets:
        again, _ = _out_of_order(calls_by_rank, align_offsets(calls_by_rank))
        if again <= (1 - CLOCK_BROKEN_SHARE) * full:
            return DURATIONS, (f"{broken} of {full} matched calls end on a rank before another rank entered them, "
                               f"and one offset per rank (the calls' ends aligned) puts {broken - again} back in "
                               f"order: the traces' clocks are not one; arrival from each rank's time in the call "
                               f"(the calls taken to end together); held and carried waiting cannot be told")
    where = (" (aligned at collective ends)" if offsets else f" (one host: {next(iter(named))})" if named else
             " (no host recorded: taken as one)")
    odd = (f"; {broken} of {full} matched calls end on a rank before another entered them, which no one offset "
           f"per rank explains (ops that return before their collective completes, as gloo's c10d op and NCCL's "
           f"host ops do)" if broken else "")
    why = "the ranks' start times on one clock" + where + odd
    return CLOCK, why


def _out_of_order(calls_by_rank: dict[int, Calls], offsets: dict[int, float]) -> tuple[int, int]:
    """(matched calls that end on a rank before another rank entered them, matched calls) on the
    ranks' clocks less `offsets`."""
    ranks = sorted(calls_by_rank)
    if len(ranks) < 2:
        return 0, 0
    keys = _global_keys(calls_by_rank)
    key = np.concatenate([keys[r] for r in ranks])
    start = np.concatenate([calls_by_rank[r].start - offsets.get(r, 0.0) for r in ranks])
    end = np.concatenate([calls_by_rank[r].end - offsets.get(r, 0.0) for r in ranks])
    gsize = np.concatenate([calls_by_rank[r].group_size for r in ranks]).astype(np.int64)
    order, first, count, expected, _ = _expected(key, gsize, len(ranks))
    if not len(first):
        return 0, 0
    late = np.maximum.reduceat(start[order], first)
    early = np.minimum.reduceat(end[order], first)
    full = (count == expected) & (count >= 2)
    return int((full & (early < late - CAUSALITY_TOL_US)).sum()), int(full.sum())


def match(calls_by_rank: dict[int, Calls], offsets: dict[int, float] | None = None,
          rule: str = CLOCK) -> dict:
    """Calls with the same key on every rank are one collective; the last to arrive sets the
    transfer time, the rest of each rank's duration is waiting, caused by the last arriver, except
    `held`: a rank that stays in the call after the last arriver has left, for longer than it had
    waited for it, was delayed inside the call itself (stopped, descheduled after arriving); that
    excess is caused by itself. (Arrival times alone would blame the last arriver for a stop that
    lands after arrival: a starved vLLM worker, 166 µs of waiting then 6.3 ms stopped in the call.
    A stay shorter than the wait is the waiter's wake-up lag: a CP rank waking 0.3-1.9 ms late
    after 5-7 ms waits for a host-stalled peer.) `carried`: the part of the waiting not held that
    the last arriver's later exit from the waiter's previous collective explains: skew the
    transport itself made, which a faster backend takes away with its transfer (measured: 73-77 %
    of gloo's waiting here, 3-5 % of DDA's).

    Who arrived last is read from the time `rule` names (arrival_rule), and the waits from the same
    time: on one clock (`clock`), the last start (starts within CAUSALITY_TOL_US of it are one
    arrival: of those, the rank that left first), each rank's wait its time in the call beyond the
    last arriver's (its lead plus its later exit, both on that clock); from `durations` (the calls
    taken to end together), the shortest time in the call, so the last arriver waits 0 and every
    other rank its time beyond it: who is named last, the waits and the culprit agree by
    construction (bench/invariants.py holds it per call). Held and carried need exits on one
    clock: under `durations` they are 0.

    `_waits` holds, per rank, (wait, transfer, last, held, carried) arrays parallel to its calls:
    NaN where unmatched, and `last` the rank that arrived last at the call (-1 where unmatched)."""
    offsets = offsets or {r: 0.0 for r in calls_by_rank}
    ranks = sorted(calls_by_rank)
    keys = _global_keys(calls_by_rank)
    key = np.concatenate([keys[r] for r in ranks]) if ranks else np.zeros(0, np.int64)
    rank_pos = np.concatenate([np.full(len(calls_by_rank[r]), i) for i, r in enumerate(ranks)]) if ranks else key
    start = np.concatenate([calls_by_rank[r].start - offsets.get(r, 0.0) for r in ranks]) if ranks else np.zeros(0)
    dur = np.concatenate([calls_by_rank[r].end - calls_by_rank[r].start for r in ranks]) if ranks else np.zeros(0)
    gsize = np.concatenate([calls_by_rank[r].group_size for r in ranks]).astype(np.int64) if ranks else key
    order, first, size, expected, recorded = _expected(key, gsize, len(ranks))  # members of a key in rank order
    full = (size == expected) & (size >= 2)
    wait = np.full(len(key), np.nan)
    transfer = np.full(len(key), np.nan)
    held = np.full(len(key), np.nan)
    carried = np.full(len(key), np.nan)
    last_rank = np.full(len(key), -1, np.int64)
    nr = len(ranks)
    per = {"transfer_us": np.zeros(nr), "wait_us": np.zeros(nr), "calls": np.zeros(nr, np.int64),
           "times_last": np.zeros(nr, np.int64), "caused_wait_us": np.zeros(nr), "held_us": np.zeros(nr),
           "carried_us": np.zeros(nr)}
    matched = int(full.sum())
    member_calls = 0
    per["caused_sq"] = np.zeros(nr)
    for n in np.unique(size[full]).tolist():  # one pass per group size: members as a (calls x n) array
        sel = full & (size == n)
        members = order[(first[sel][:, None] + np.arange(n)[None, :]).reshape(-1)].reshape(-1, n)
        member_calls += members.size
        if rule == CLOCK:
            # arrivals within the clock's resolution are one arrival (DDA's ranks, released together,
            # enter 0.01-0.1 µs apart, an order the profiler cannot tell): of them, the rank that left
            # first sets the transfer, and the others' longer stays are their own (held)
            arr = start[members]
            tied = arr >= arr.max(axis=1, keepdims=True) - CAUSALITY_TOL_US
            pick = np.argmin(np.where(tied, arr + dur[members], np.inf), axis=1)  # first of equal exits
        else:
            pick = np.argmax(-dur[members], axis=1)
        last = members[np.arange(len(members)), pick]
        t = np.repeat(dur[last], n)
        m = members.reshape(-1)
        w = np.maximum(0.0, dur[m] - t)
        # after the last arriver had left: up to the wait before it, the waiter's wake-up lag (its
        # futex or poll backoff, the scheduler; measured up to a third of the wait), beyond, its own delay
        late = np.clip(start[m] + dur[m] - np.repeat(start[last] + dur[last], n), 0.0, w)
        h = np.maximum(0.0, 2 * late - w)  # late - (w - late): what the wait before it cannot explain
        if rule != CLOCK:  # exits on several clocks: neither can be told
            h = np.zeros_like(w)
        wait[m], transfer[m], held[m] = w, t, h
        skew = _exit_skew(key, rank_pos, start + dur, np.repeat(rank_pos[last], n), m)
        carried[m] = np.clip(np.nan_to_num(skew, nan=0.0), 0.0, w - h) if rule == CLOCK else 0.0
        last_rank[m] = np.repeat(np.asarray(ranks, np.int64)[rank_pos[last]], n)
        by_last = np.repeat(rank_pos[last], n)
        per["transfer_us"] += np.bincount(rank_pos[m], dur[m] - w, nr)
        per["wait_us"] += np.bincount(rank_pos[m], w, nr)
        per["calls"] += np.bincount(rank_pos[m], minlength=nr)
        per["times_last"] += np.bincount(rank_pos[last], minlength=nr)
        per["held_us"] += np.bincount(rank_pos[m], h, nr)
        per["carried_us"] += np.bincount(rank_pos[m], carried[m], nr)
        per["caused_wait_us"] += np.bincount(by_last, w - h, nr) + np.bincount(rank_pos[m], h, nr)
        per["caused_sq"] += np.bincount(by_last, (w - h) ** 2, nr) + np.bincount(rank_pos[m], h * h, nr)
    rows = [{"rank": r, "transfer_us": float(per["transfer_us"][i]), "wait_us": float(per["wait_us"][i]),
             "calls": int(per["calls"][i]), "times_last": int(per["times_last"][i]),
             "caused_wait_us": float(per["caused_wait_us"][i]), "held_us": float(per["held_us"][i]),
             "carried_us": float(per["carried_us"][i])}
            for i, r in enumerate(ranks)]
    # with 3 or more ranks, a key whose calls record no group size was taken as one collective of every
    # rank holding it: two groups sharing a name (the TP pairs of a TP x DP job named by axis) cannot be told apart
    unsized = int((full & (recorded == 0)).sum()) if nr >= 3 else 0
    standing = stands_out({r: float(per["caused_wait_us"][i]) for i, r in enumerate(ranks)},
                          {r: float(per["caused_sq"][i]) for i, r in enumerate(ranks)}, member_calls) \
        if matched else Standing(None, None, 0.0, None, None)
    bounds = np.cumsum([0] + [len(calls_by_rank[r]) for r in ranks])
    waits = {r: tuple(a[bounds[i]:bounds[i + 1]] for a in (wait, transfer, last_rank, held, carried))
             for i, r in enumerate(ranks)}
    return {"matched_calls": matched, "arrival_rule": rule, "ranks": rows, "straggler": standing.name,
            "straggler_rule": standing.rule(),
            "offsets_us": {str(r): offsets.get(r, 0.0) for r in ranks}, "_waits": waits,
            **({"group_rule": f"{unsized} of {matched} matched call(s) record no group size: each was taken as one "
                              "collective of every rank holding its key (group name, op, order), which two groups of "
                              "one name would share (the TP pairs of a TP x DP job, named by their axis alone); calls "
                              "of such groups cannot be told apart here"} if unsized else {})}


def _exit_skew(key: np.ndarray, rank_pos: np.ndarray, end: np.ndarray, last_pos: np.ndarray,
               m: np.ndarray) -> np.ndarray:
    """Per member call `m` (global indices, calls concatenated rank by rank in start order): how
    much later its last arriver left the waiter's previous collective than the waiter did (NaN
    where the waiter has no previous call or the last arriver has no call of that key)."""
    dense = np.unique(key, return_inverse=True)[1].reshape(-1).astype(np.int64)
    nkeys = int(dense.max()) + 1 if len(dense) else 1
    combined = rank_pos.astype(np.int64) * nkeys + dense
    order = np.argsort(combined, kind="stable")
    prev = m - 1
    ok = (prev >= 0) & (rank_pos[np.maximum(prev, 0)] == rank_pos[m])
    want = last_pos * nkeys + dense[np.maximum(prev, 0)]
    at = np.minimum(np.searchsorted(combined[order], want), len(order) - 1)
    j = order[at]
    ok &= combined[j] == want
    return np.where(ok, end[j] - end[np.maximum(prev, 0)], np.nan)


def cost(calls: Calls, waits: tuple) -> np.ndarray:
    """Per call, what it costs a step as its backend's doing: its transfer and the waiting its
    transport carried over (`carried`); a call no other rank matched, its whole duration. What a
    backend switch replaces (cross_rank/headroom.py) and each size bucket's `mean_cost_us`.
    The transfer is the last arriver's time in the call, but a rank that left before the last
    arriver did (gloo's uneven exit) spent only its own: counting the last arriver's would count
    the difference twice, here and as the waiting it carries into this rank's next call (a
    gloo TP=2 call costed 4.67 ms on a rank whose longest call took 4.36 ms)."""
    tr, carried = waits[1], waits[4]
    dur = calls.end - calls.start
    return np.where(np.isnan(tr), dur, np.minimum(tr, dur) + np.nan_to_num(carried))


def size_bucket(nbytes: np.ndarray) -> np.ndarray:
    """The power of two at or above each size (1 below a byte); 0 where the size is unknown."""
    known = np.nan_to_num(np.asarray(nbytes, float), nan=0.0, posinf=0.0, neginf=0.0)  # unknown: bucket 0
    return np.where(known > 0, np.left_shift(1, np.ceil(np.log2(np.maximum(known, 1))).astype(np.int64)), 0)


MAX_SAMPLES = 256  # per bucket, kept in the result for the regression gate's statistics


def size_buckets(calls_by_rank: dict[int, Calls], waits: dict) -> list[dict]:
    """Per (op, axis, power-of-two size bucket): count, median/p90 latency, algbw, busbw.

    Latency of a matched call is its transfer time (waiting for a straggler is not the
    network's fault); of an unmatched call, its duration. `mean_cost_us`: the mean of the latency
    plus the waiting the transport carried over (`carried`): what a call of this backend costs a
    step on average, the figure a backend switch is predicted with (cross_rank/headroom.py).
    """
    kinds: dict[tuple, int] = {}
    cols: dict[str, list] = {"kind": [], "bucket": [], "lat": [], "bytes": [], "n": [], "cost": []}
    for r, c in calls_by_rank.items():
        ok = c.bytes > 0  # NaN compares false: unknown sizes are left out
        if not ok.any():
            continue
        lut = np.array([kinds.setdefault(kd, len(kinds)) for kd in c.kinds], np.int64)
        tr = waits[r][1] if r in waits else np.full(len(c), np.nan)
        lat = np.where(np.isnan(tr), c.end - c.start, tr)
        cols["cost"].append((cost(c, waits[r]) if r in waits else lat)[ok])
        cols["kind"].append(lut[c.kind[ok]])
        cols["bucket"].append(size_bucket(c.bytes[ok]))
        cols["lat"].append(lat[ok])
        cols["bytes"].append(c.bytes[ok])
        cols["n"].append(np.where(c.group_size[ok] > 0, c.group_size[ok], len(calls_by_rank)))
    if not kinds or not cols["kind"]:
        return []
    kind, bucket, lat, nbytes, n, call_cost = (np.concatenate(cols[x])
                                              for x in ("kind", "bucket", "lat", "bytes", "n", "cost"))
    names = list(kinds)
    rows = []
    combo = kind * (1 << 48) + bucket  # buckets are powers of two far below 2^48
    uniq, inverse = np.unique(combo, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")  # samples of a group in call order, rank by rank
    bounds = np.r_[0, np.cumsum(np.bincount(inverse, minlength=len(uniq)))]
    groups = []
    for g, u in enumerate(uniq.tolist()):
        op, axis, cat, src = names[u >> 48]
        groups.append(((op, u & ((1 << 48) - 1)), axis, cat, src, order[bounds[g]:bounds[g + 1]]))
    for (op, b), axis, cat, src, idx in sorted(groups, key=lambda x: x[0]):
        lats = lat[idx]
        med = float(np.median(lats))
        mean_bytes = float(np.mean(nbytes[idx]))
        gs = int(np.median(n[idx]))
        algbw = mean_bytes / med / 1e3 if med > 0 else 0.0  # bytes/µs -> GB/s
        rows.append({"op": op, "axis": axis, "axis_source": src, "category": cat, "bucket_bytes": int(b), "count": len(idx),
                     "median_us": med, "p90_us": float(np.percentile(lats, 90)), "mean_bytes": mean_bytes,
                     "mean_cost_us": float(np.mean(call_cost[idx])),
                     "group_size": gs, "algbw_GBps": algbw, "busbw_GBps": algbw * bus_factor(op, gs),
                     "samples_us": thin(lats, MAX_SAMPLES, 3)})
    return rows
