"""All-to-all traffic per phase (EP's, or CP's sequence-parallel attention's): who sends how much to
whom, and whether one rank receives more.

Each rank's trace gives its row and column of every sized all-to-all call (per_rank/traffic.py);
here the calls are lined up across ranks by their match key and each call's matrix (sender x
receiver, bytes) is built from the senders' rows, checked against the receivers' columns.

Routing shows in the dispatch: the bytes an EP rank receives are the tokens routed to its experts.
The combine sends them back (its matrix is the dispatch's transpose), so what a rank *receives* in
the combine is how many tokens it holds, not how many its experts got. A call whose own transpose
follows within a few calls is taken as a dispatch (the rule is named in the result); the phase's imbalance is the
busiest receiver over the mean of the dispatches' summed matrix, or of every call's where no such
pair is seen. The finding is named only from sizes the trace recorded (`IMBALANCE_RULE`); a phase
whose all-to-all calls carry no sizes says so, and the verdict stands on timing alone.
"""

from __future__ import annotations

import statistics
from collections import Counter

import numpy as np

from commprobe.common.vocab import a2a_words

from ..per_rank.attribution import MAX_WINDOWS
from ..per_rank.traffic import a2a_group

# Routing skew: the busiest receiver of the dispatches gets this much over the mean. It is named as
# what makes the all-to-all slow only where the hot rank also caused most of the phase's waiting
# and waiting outweighs transfer there (the cause split of cross_rank/cause.py).
IMBALANCE_RULE = {"imbalance_at_least": 1.25, "hot_rank_wait_share_at_least": 0.5}
MAX_MATRIX_CELLS = 1 << 24  # the per-call matrices' integers held at once (128 MB each for them and their check)
HOT_EXPERT = 1.5  # an expert routed this many times the mean count is named hot


def _placed(members: list[tuple[int, dict]], size: int) -> dict[int, int] | None:
    """Global rank -> group rank: as the source said, else by rank order where the ranks reporting
    are exactly one group (a torch job's world group); None where they cannot be placed."""
    if all(g["grank"] is not None for _, g in members):
        return {r: g["grank"] for r, g in members}
    if len(members) == size:
        return {r: i for i, (r, _) in enumerate(sorted(members, key=lambda m: m[0]))}
    return None


def phase_traffic(per_rank: dict[int, dict], phase: str, routed: dict | None = None,
                  times: dict[str, dict[int, dict]] | None = None) -> dict | None:
    """The phase's all-to-all traffic (the busiest group, by bytes), or None without all-to-all calls.
    `times`: call_times, for the split of the calls' time (time_split)."""
    groups: dict[str, list[tuple[int, dict]]] = {}
    for rank, t in sorted(per_rank.items()):
        for group, g in (t.get(phase) or {}).items():
            groups.setdefault(group, []).append((rank, g))
    if not groups:
        return None
    out = [_group(name, members, (times or {}).get(name)) for name, members in groups.items()]
    best = max(out, key=lambda o: (sum(o.get("received") or [0]), o["calls"]))
    others = [o for o in out if o is not best]
    if others:  # several EP groups (EP x TP): the busiest in full, the others in brief
        best["other_groups"] = [{k: o.get(k) for k in ("group", "ranks", "sizes", "received", "imbalance", "hot_rank")}
                                for o in others]
        _add_note(best, f"{len(others)} other all-to-all group(s) in this phase, shown in brief: " + "; ".join(
            f"{o['group']}" + (f" rank {o['hot_rank']} receives {o['imbalance']:.2f}x the mean"
                               if o.get("imbalance") and o.get("hot_rank") is not None else f" ({o.get('sizes')})")
            for o in others[:4]) + (f"; and {len(others) - 4} more" if len(others) > 4 else ""))
    if routed:
        best["routed"] = routed
    return best


def _rows(g: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A rank's sized calls as arrays: keys, and calls x group ranks sent and received; None where its
    rows differ in length (no one group size)."""
    k = np.asarray(g["k"], np.int64)
    try:
        send, recv = (np.asarray(g[x], np.int64).reshape(len(k), len(g[x][0])) for x in ("send", "recv"))
    except (ValueError, IndexError):
        return None
    return k, send, recv


def _group(name: str, members: list[tuple[int, dict]], times: dict[int, dict] | None = None) -> dict:
    calls = max(g["calls"] for _, g in members)
    unsized = max(g["unsized"] for _, g in members)
    axes = Counter()
    for _, g in members:
        axes.update(g.get("axes") or {})
    base = {"group": name, "axis": axes.most_common(1)[0][0] if axes else "ep", "calls": calls, "unsized_calls": unsized,
            "rule": IMBALANCE_RULE}
    rows = {r: _rows(g) for r, g in members if len(g["send"])}
    even = max(g.get("even", 0) for _, g in members)
    if even:
        base["even_calls"] = even
    if not rows and even and not unsized:
        return {**base, "sizes": "even splits", "imbalance": 1.0, "skew": None, "finding": None,
                "imbalance_rule": "even splits: every receiver gets the same bytes by construction",
                "note": ("every all-to-all call splits its buffer" if even == calls else
                         f"{even} of {calls} all-to-all calls split their buffers") + " "
                        "evenly (no split sizes: a fixed-capacity dispatch, as DeepSpeed-MoE and GShard-style gates "
                        "send): every rank receives the same bytes whatever the routing, so routing skew cannot show "
                        "in the bytes; it shows as tokens dropped or padded at the experts' capacity, which the trace "
                        "does not record"}
    if not rows:
        why = next((g["missing"] for _, g in members if g.get("missing")), None) or (
            "torch 2.x writes them with record_shapes=True, as the c10d op's 'Concrete Inputs'; commprobe's own spans "
            "always carry them")
        return {**base, "sizes": "not recorded", "finding": None,
                "note": f"{unsized or calls} all-to-all call(s) per rank carry no split sizes: who sends how much to "
                        f"whom cannot be told ({why})" + (f"; {even} other(s) split their buffers evenly" if even else "")}
    sizes = Counter(x[1].shape[1] for x in rows.values() if x)
    if not sizes:
        return {**base, "sizes": "recorded", "finding": None, "note": "no rank's split sizes have one group size"}
    size = sizes.most_common(1)[0][0]  # the group's size: as most ranks say
    odd = sorted(r for r, x in rows.items() if not x or x[1].shape[1] != size or x[2].shape[1] != size)
    sized = [(r, g) for r, g in members if r in rows and r not in odd]  # one group's matrix: its own size only
    place = _placed(sized, size)
    if place is None or any(not 0 <= v < size for v in place.values()):
        return {**base, "sizes": "recorded", "finding": None,
                "note": "split sizes recorded, but which group rank each trace is cannot be told"}
    holders = [[r for r, gr in place.items() if gr == i] for i in range(size)]
    ranks = [h[0] if len(h) == 1 else None for h in holders]  # a group rank several groups hold: no one rank
    # a call's matrix needs every group rank's row: keys some holder of each group rank has
    held = [np.unique(np.concatenate([rows[r][0] for r in h])) if h else np.zeros(0, np.int64) for h in holders]
    keys_a = held[0]
    for h in held[1:]:
        keys_a = np.intersect1d(keys_a, h)
    notes = [f"rank(s) {', '.join(map(str, odd))} record groups of another size: left out"] if odd else []
    if even:
        notes.append(f"{even} call(s) split their buffers evenly (no split sizes): left out of the matrix")
    if not len(keys_a):
        return {**base, "sizes": "recorded", "finding": None,
                "note": "; ".join(notes + [f"no call is held by every rank of the group ({sum(1 for h in holders if h)} "
                                           f"of {size} group ranks' traces here): no matrix can be built"])}
    most = max(1, MAX_MATRIX_CELLS // (size * size))  # calls x size x size integers held at once
    if len(keys_a) > most:
        notes.append(f"the matrices cover the first {most} of {len(keys_a)} calls (a group of {size} ranks: "
                     f"{MAX_MATRIX_CELLS:,} pair sizes held at most)")
        keys_a = keys_a[:most]
    keys = keys_a.tolist()
    # calls x sender x receiver (bytes), and the receivers' own view (calls x receiver x sender);
    # several groups of one axis (EP x TP) that hold the same group ranks are summed
    mats = np.zeros((len(keys), size, size), np.int64)
    seen = np.zeros_like(mats)
    for r, _ in sized:
        k, send, recv = rows[r]
        sel = np.isin(k, keys_a)
        pos = np.searchsorted(keys_a, k[sel])
        np.add.at(mats, (pos, place[r]), send[sel])
        np.add.at(seen, (pos, place[r]), recv[sel])
    consistent = bool((seen.transpose(0, 2, 1) == mats).all())
    dispatch, combines = _dispatches(mats)
    picked = dispatch or list(range(len(mats)))
    routed_m = mats[picked].sum(axis=0)
    received = routed_m.sum(axis=0).tolist()
    res = {**base, "sizes": "recorded", "size": size, "ranks": ranks,
           "groups_summed": len(place) // size if len(set(place.values())) < len(place) else 1,
           "sized_calls": len(mats), "matrix": mats.sum(axis=0).tolist(), "consistent": consistent,
           "dispatch_rule": (f"calls whose own transpose follows within {COMBINE_WITHIN} calls (dispatch, then "
                             "combine)" if dispatch else "no call followed by its transpose: every call counted"),
           "dispatch_calls": len(dispatch), "dispatch_matrix": routed_m.tolist() if dispatch else None,
           "received": received}
    if not consistent:
        notes.append("senders' and receivers' sizes disagree (a trace cut short?): the matrix is the senders'")
    if notes:
        res["note"] = "; ".join(notes)
    if not sum(received):
        return {**res, "imbalance": None, "finding": None, "note": "; ".join(notes + ["no call moved any bytes"])}
    mean = sum(received) / size
    hot = max(range(size), key=received.__getitem__)
    imbalance = received[hot] / mean
    cols = mats[picked].sum(axis=1)  # per picked call, what each receiver got
    moved = cols.sum(axis=1) > 0
    per_call = (cols.max(axis=1)[moved] / (cols.sum(axis=1)[moved] / size)).tolist()
    res["_series"] = list(zip((keys[i] for i, m in zip(picked, moved) if m), per_call))  # for the trace export only
    res.update(imbalance=imbalance, cv=statistics.pstdev(received) / mean, hot_group_rank=hot, hot_rank=ranks[hot],
               per_call={"min": min(per_call), "median": statistics.median(per_call), "max": max(per_call)})
    who = f"rank {ranks[hot]}" if ranks[hot] is not None else f"group rank {hot}"
    what = "EP dispatch bytes" if base["axis"] == "ep" else f"{a2a_words(base['axis'])} bytes"
    res["skew"] = (f"{who} receives {imbalance:.2f}x the mean of the {what}"
                   if imbalance >= IMBALANCE_RULE["imbalance_at_least"] else None)
    if times:
        timed = [i for i in range(len(mats)) if keys[i] in times]
        backs = set(combines)
        split = time_split(mats[timed], [i in backs for i in timed], [times[keys[i]] for i in timed], holders[hot])
        if split:
            res["time"] = split
    res["finding"] = None  # named against the phase's waiting (judge), where the time says it costs
    return res


# How much of the calls' transfer the skew's extra bytes can account for (time_split).
EXTRA_BYTES_RULE = ("the same tokens routed evenly over the EP ranks (each sender's bytes spread evenly over the "
                    "receivers; a combine, the transpose). A call moves at the pace of its busiest rank, the larger of "
                    "the bytes it sends to and receives from the other ranks, so its transfer would shrink by 1 - "
                    "busiest(even) / busiest(as routed). An upper bound: a call bound by latency rather than bandwidth "
                    "loses less")


def _moved(mats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per call and rank: the bytes sent to and received from the other ranks (its own share stays local)."""
    off = mats * (1 - np.eye(mats.shape[1], dtype=mats.dtype))
    return off.sum(axis=2), off.sum(axis=1)


def _evened_moved(mats: np.ndarray, combine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """_moved of each call with its tokens routed evenly: a dispatch's rows (what each sender holds)
    spread over every receiver; a combine's columns (what each rank gets back) gathered evenly from
    every sender."""
    size = mats.shape[1]
    held = np.where(combine[:, None], mats.sum(axis=1), mats.sum(axis=2)).astype(float)  # per call, per rank
    own = held * (size - 1) / size  # what a holder moves: all but its own share
    other = (held.sum(axis=1, keepdims=True) - held) / size  # what a rank moves of the others' tokens
    return np.where(combine[:, None], other, own), np.where(combine[:, None], own, other)


def call_times(calls: dict, waits: dict) -> dict[str, dict[int, dict]]:
    """Per all-to-all group and call k (the keys per_rank/traffic.py gives the sizes under): the
    matched call's transfer (µs: the last arriver's time in it, the same for every rank), who
    arrived last, and each rank's wait (cross_rank/matching.py). Unmatched calls are left out."""
    out: dict[str, dict[int, dict]] = {}
    for r, c in calls.items():
        if r not in waits or not len(c):
            continue
        wait, transfer, last = waits[r][0], waits[r][1], waits[r][2]
        for i in np.flatnonzero((c.op() == "all_to_all") & ~np.isnan(wait)).tolist():
            e = out.setdefault(a2a_group(c, i), {}).setdefault(int(c.k[i]), {"transfer": float(transfer[i]),
                                                                              "last": int(last[i]), "wait": {}})
            e["wait"][r] = float(wait[i])
    return out


def time_split(mats, combine: list[bool], times: list[dict], hot: list[int]) -> dict | None:
    """The sized, matched calls' time per rank (µs, summed over the phase's calls, averaged over the
    ranks): transfer, waiting, the waiting for a late hot rank (`hot`: the global ranks that hold
    the hot group rank), and the part of the transfer that routing the same tokens evenly could
    save at most (EXTRA_BYTES_RULE). `mats`: calls x sender x receiver; `combine` marks the calls
    that send tokens back."""
    if not times:
        return None
    mats = np.asarray(mats, np.int64)
    sent, got = _moved(mats)
    busiest = np.maximum(sent.max(axis=1), got.max(axis=1)).astype(float)
    es, eg = _evened_moved(mats, np.asarray(combine, bool))
    even = np.maximum(es.max(axis=1), eg.max(axis=1))
    transfer = np.array([t["transfer"] for t in times])
    extra = np.where(busiest > 0, transfer * np.clip(1 - even / np.where(busiest > 0, busiest, 1), 0, None), 0.0)
    wait = np.array([sum(t["wait"].values()) / (len(t["wait"]) or 1) for t in times])
    on_hot = np.array([t["last"] in hot for t in times])
    return {"calls": len(times), "transfer_us": float(transfer.sum()), "wait_us": float(wait.sum()),
            "wait_for_hot_us": float(wait[on_hot].sum()), "extra_bytes_us_at_most": float(extra.sum()),
            "extra_bytes_rule": EXTRA_BYTES_RULE,
            "extra_bytes_per_call_us": {"min": float(extra.min()), "median": float(np.median(extra)),
                                        "max": float(extra.max())}}


COMBINE_WITHIN = 3  # a dispatch's combine comes within this many calls (Megatron sends the probs between)


def _dispatches(mats: np.ndarray) -> tuple[list[int], list[int]]:
    """(dispatches, their combines): calls whose own transpose follows within COMBINE_WITHIN calls,
    each combine used once. Megatron-Core's all-to-all dispatcher sends the tokens, then their probs
    (same counts, another row size), and after the experts the tokens back: the probs call is
    neither."""
    n = len(mats)
    moved = mats.any(axis=(1, 2))
    tr = mats.transpose(0, 2, 1)
    out, back, used = [], [], set()
    for i in range(n):
        if i in used or not moved[i]:
            continue
        # the next call first; further on only for a call that is not its own transpose (a symmetric
        # exchange, such as every rank sending each the same counts, pairs with any later copy of it)
        j = next((j for j in range(i + 1, min(n, i + 1 + COMBINE_WITHIN))
                  if j not in used and np.array_equal(mats[j], tr[i])
                  and (j == i + 1 or not np.array_equal(mats[i], tr[i]))), None)
        if j is not None:
            out.append(i)
            back.append(j)
            used.update((i, j))
    return out, back


def routed_summary(counts: list[list[int]] | None, ep: int) -> dict | None:
    """Our router's own counts (a bundle's timings: tokens routed to each expert, summed over the
    ranks and layers of a phase): per expert, the hot ones, and what they make each EP rank receive."""
    if not counts or ep < 1:
        return None
    per_expert = [sum(c) for c in zip(*counts)]
    n = len(per_expert)
    if not n or n % ep or not sum(per_expert):
        return None
    mean = sum(per_expert) / n
    per = n // ep
    per_rank = [sum(per_expert[r * per:(r + 1) * per]) for r in range(ep)]
    return {"per_expert": per_expert, "per_rank": per_rank,
            "imbalance": max(per_rank) / (sum(per_rank) / ep),
            "hot_experts": [e for e in sorted(range(n), key=lambda e: -per_expert[e]) if per_expert[e] >= HOT_EXPERT * mean][:4]}


def routed_of(timings: dict | None, ep: int) -> dict[str, dict]:
    """Per phase, routed_summary of a bundle's timings.json (every rank's routed_tokens); {} without."""
    out: dict[str, dict] = {}
    rows = (timings or {}).get("ranks") if isinstance(timings, dict) else None
    for phase in ("prefill", "decode"):
        counts = [layer for r in rows or [] if isinstance(r, dict)
                  for layer in ((r.get("routed_tokens") or {}).get(phase) or [])
                  if isinstance(layer, list) and all(isinstance(c, int) and c >= 0 for c in layer)]
        if len({len(c) for c in counts}) == 1:
            s = routed_summary(counts, ep)
            if s:
                out[phase] = s
    return out


def judge(t: dict, cause: dict | None) -> None:
    """The finding, from the bytes' skew and the waiting: the hot rank is what the others wait for
    (routing makes the all-to-all slow), or the skew moves bytes without holding anyone up (said in
    a note), or the waiting cannot say. The best evidence there is decides, and is named: the
    all-to-all calls' own waits (time_split) where they were matched across ranks, else the
    phase's waiting over every collective (cross_rank/cause.py)."""
    if not t.get("skew"):
        return
    hot = t.get("hot_rank")
    split = t.get("time")
    caused = (cause or {}).get("wait_caused_by") or {}
    if split and (split["wait_us"] > 0 or split["transfer_us"] > 0):
        share = split["wait_for_hot_us"] / split["wait_us"] if split["wait_us"] > 0 else 0.0
        waiting = split["wait_us"] >= split["transfer_us"]
        t["judged_on"] = f"the {split['calls']} all-to-all calls' own waits, matched across ranks"
        cost = (f"; per rank, of {split['transfer_us'] + split['wait_us']:.0f} µs in these calls, "
                f"{split['wait_for_hot_us']:.0f} µs waiting for it and at most {split['extra_bytes_us_at_most']:.0f} µs "
                "moving its extra bytes")
        noise = ""
    elif hot is None or not caused:
        _add_note(t, f"{t['skew']}; whether it holds the other ranks up cannot be told "
                     "(no waiting measured per rank, or the hot group rank is several ranks)")
        return
    else:
        share = float(caused.get(str(hot), 0.0))
        waiting = (cause or {}).get("wait_share", 0.0) >= (cause or {}).get("transfer_share", 0.0)
        t["judged_on"] = "the phase's waiting over every collective (the all-to-all calls were not matched)"
        cost = ""
        z = (cause or {}).get("culprit_z")
        noise = ("" if (cause or {}).get("culprit") == hot or z is None else
                 f"; by the waiting alone within the noise ({z:.1f} standard errors), the bytes say why")
    t["hot_rank_wait_share"] = share
    ep = t.get("axis", "ep") == "ep"  # routing and experts are EP's words; a CP all-to-all's skew is its split
    if share >= IMBALANCE_RULE["hot_rank_wait_share_at_least"] and waiting:
        t["finding"] = (f"{t['skew']}, and the others wait for it ({share:.0%} of the waiting{noise}{cost}): "
                        + ("EP all-to-all is imbalance-bound by routing; rebalance or replicate its experts"
                           if ep else
                           f"the {a2a_words(t['axis'])} is imbalance-bound by its uneven split; even out what each rank "
                           "holds (the sequence shards of sequence-parallel attention)"))
    else:
        who = (f"rank {max(caused, key=lambda r: caused[r])}: {max(caused.values()):.0%}" if caused and not split
               else None)
        high = share >= IMBALANCE_RULE["hot_rank_wait_share_at_least"]
        _add_note(t, f"{t['skew']}, {'and' if high else 'but'} it caused {share:.0%} of the waiting"
                     + (f" ({who})" if who else "") + ("" if waiting else f"{', but' if high else ', and'} transfer "
                                                       "outweighs waiting") + cost + ": "
                     + _bound(split, "the routing skew" if ep else "the uneven split"))


def _bound(split: dict | None, skew: str) -> str:
    """What the skew can account for when the measured waiting does not make it the cause: where the
    extra bytes' upper bound could tip it, that the trace cannot tell (bandwidth- or latency-bound)."""
    if split:
        total = split["transfer_us"] + split["wait_us"]
        hot, most = split["wait_for_hot_us"], split["wait_for_hot_us"] + split["extra_bytes_us_at_most"]
        if total > 0 and most >= 0.5 * total:
            return (f"the skew accounts for {hot / total:.0%} of these calls' time as waiting and up to {most / total:.0%} "
                    "with the extra bytes; which it is cannot be told from the trace (the extra bytes cost where the "
                    "transfer is bound by bandwidth, little where by latency)")
        if total > 0:
            return (f"at most {most / total:.0%} of these calls' time is the skew's; {skew} is not what "
                    "holds the all-to-all up here")
    return f"{skew} is not what holds the all-to-all up here"


def _add_note(t: dict, text: str) -> None:
    """The judgement first, beside what the matrix already noted (left out ranks, disagreeing sizes)."""
    t["note"] = f"{text}; {t['note']}" if t.get("note") else text


def attach(phases: dict, per_rank: dict[int, dict], timings: dict | None = None, ep: int = 0,
           times: dict[str, dict[int, dict]] | None = None) -> dict[str, dict]:
    """Each phase with all-to-all calls gains `all_to_all` (phase_traffic, judged against the
    waiting), with our router's counts where the bundle has them and, from `times` (call_times),
    the split of the calls' time; a finding leads the phase's recommendations. Returns per phase the group and each call's (match key, imbalance): the
    Perfetto export's counter track."""
    routed = routed_of(timings, ep) if ep > 1 else {}
    series: dict[str, dict] = {}
    for phase, doc in phases.items():
        t = phase_traffic(per_rank, phase, routed.get(phase), times)
        if t is None:
            continue
        if t.get("_series"):
            series[phase] = {"group": t["group"], "axis": t["axis"], "calls": t["_series"]}
        t.pop("_series", None)
        judge(t, doc.get("communication_cause"))
        if int(doc.get("windows") or 0) > MAX_WINDOWS:  # a rank keeps this many windows per phase
            t["windows_note"] = f"the calls of the first {MAX_WINDOWS} of {doc['windows']} windows per rank"
        doc["all_to_all"] = t
        if t["finding"]:
            doc.setdefault("recommendations", []).insert(0, t["finding"])
    return series
