"""Which spans of a rank's timeline are its prefill, decode or mixed steps: the first phase rule
(phases.py) with annotations on this rank chooses them; this module turns its annotations into
windows on the timeline the breakdown measures.

On a host timeline (CPU-only trace) a window is the annotation's own range.

On a device timeline a step's window runs from the start of its host range until both its host
range and the work it launched have ended (work that seems to start before its own launch, a
device clock behind the host's, is counted: `device_work_before_its_launch`). Its work is
every kernel, copy and memset whose runtime call (`correlation`: the same id on the call and on
the device event) started inside the step's host range, on any thread of the process (backward
and DDP hooks launch from the autograd thread); HTA assigns kernels to iterations the same way.
The GPU runs behind the CPU, so a window's end follows the launched work past the host range;
its start stays at the host's, because a device idle while the host prepares the step is part
of the step's latency (the host/launch-bound verdict reads it), except where the device is still
running work launched before the first step (that time is the earlier work's): the first window
starts when that work ends, at the latest at the step's own first device event. Work whose
correlation id is below every launch the trace holds was launched before the trace began, so
before the first step (`device_work_launched_before_the_trace`: a real MI300X trace's 968 events
ran 30 ms into its first step). Windows are tiled in start
order: one starts no earlier than the previous one ends, so time is never counted twice when the
host runs a step ahead; launched work that thereby lies in a neighbour's window is reported
(`launched_outside_own_window_pct`). GPU-side copies of the annotations (`gpu_user_annotation`)
are used only where nothing links: a real MI250 trace's ProfilerStep marker covers 62 % of the
step's launched work, so where both exist the share of launched work outside the markers is
reported (`device_markers`), not trusted. A step that launched nothing keeps its host range and
is counted (`steps_without_device_work`); device work launched between steps, or whose runtime
call is not in the trace, belongs to no step and is counted (`device_work_outside_steps`,
`device_work_without_launch`).
"""

from __future__ import annotations

import numpy as np

from ..readers.model import Trace
from . import intervals as iv
from .phases import RULES, PhaseRule

MAX_MALFORMED_SHOWN = 5
MAX_UNCORRELATED = 0.01  # share of device work with no launch id above which windows do not come from launches
CAUSALITY_TOL_US = 1.0  # a device event this much before its launch call is the clocks' doing


def windows(trace: Trace, on_device: bool, busy_mask: np.ndarray) -> tuple[dict[str, list[tuple[float, float]]], dict,
                                                                             np.ndarray]:
    """(phase -> [(start, end)] in µs on the trace's clock, how they were chosen, the events that
    belong to no step): the first phase rule (phases.py) with annotations on this rank.
    `busy_mask`: the timeline's events (the whole-trace window spans them). Device work launched
    before the first step or after the last belongs to no step, wherever it runs: the breakdown
    leaves it out of every window (counted in `device_work_before_first_step` / `_after_last_step`)."""
    none = np.zeros(len(trace.ts), bool)
    end_of_work = float((trace.ts + trace.dur)[busy_mask].max()) if busy_mask.any() else 0.0
    dev = trace.is_device()
    starts = tuple(p for rule in RULES for p in rule.prefix)
    candidates = [i for i, n in enumerate(trace.names) if n.startswith(starts)]
    unparsed: list[int] = []  # names a rule claims but cannot parse, over every rule
    for rule in RULES:
        parsed = {i: rule.pattern.match(trace.names[i]) for i in rule.claimed(trace.names, candidates)}
        unparsed += [i for i, m in parsed.items() if m is None]
        good = {i: m for i, m in parsed.items() if m}
        if not good:
            continue
        is_good = np.zeros(len(trace.names), bool)
        is_good[list(good)] = True
        is_good = is_good[trace.name_id]
        host, marks = np.flatnonzero(is_good & ~dev), np.flatnonzero(is_good & dev)
        bad = [i for i, m in parsed.items() if m is None]
        how: dict = {}
        h_spans, h_marked = _held(trace, host, end_of_work)
        if on_device and len(host):
            spans, how, outside = _launched(trace, h_spans, marks)
            if spans is not None:
                return (*_by_phase(trace, rule, good, host, spans, bad, ~dev, {**how, **h_marked}), outside)
        if on_device and len(marks):
            m_spans, m_marked = _held(trace, marks, end_of_work)
            return (*_by_phase(trace, rule, good, marks, m_spans, bad, dev,
                               {"windows_from": "device markers", **how, **m_marked}), none)
        if len(host):
            return (*_by_phase(trace, rule, good, host, h_spans, bad, ~dev,
                               {"windows_from": "host ranges", **how, **h_marked}), none)
    # no rule parsed anything: annotations that look like an engine's step but do not parse are
    # counted and shown, so a whole-trace window is never a silent fallback
    info = {"rule": "whole-trace", "source": "", "windows_from": "whole trace",
            **_malformed(trace, unparsed, np.ones_like(dev) if on_device else ~dev)}
    if not busy_mask.any():
        return {}, info, none
    return ({"trace": [(float(trace.ts[busy_mask].min()), end_of_work)]}, info, none)


def _ranges(trace: Trace, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return trace.ts[idx], trace.ts[idx] + trace.dur[idx]


BOUNDARY_SHARE = 0.01  # a marker shorter than this share of the gap to the next one marks a step's start
HELD_SHARE = 0.05  # markers holding less than this share of the busy time after the first hold no step


def _held(trace: Trace, idx: np.ndarray, end_of_work: float) -> tuple[tuple[np.ndarray, np.ndarray], dict]:
    """The ranges of annotations `idx`, or, where they are step *boundaries*, the steps they
    bound. Boundaries, by either evidence, for any count of markers (one included):
    - `short`: markers far shorter than the gap to the next one (nine in ten under BOUNDARY_SHARE
      of it: GPU-side copies of annotations are instants);
    - `hold no work` (a host timeline): they cover under HELD_SHARE of the recorded work from the
      first marker on (a torch.profiler export without Kineto has
      `ProfilerStep#N` markers of 17-18 µs between steps of 3-36 ms; a warm-up marker of 0.7 ms
      before a 28 ms step is still one).
    torch.profiler's own convention then holds: a step runs from its marker to the next, the last
    until the end of the recorded work on the markers' thread (else, where that thread records
    nothing after it, of the whole timeline's). Said in `markers_as_boundaries` with the evidence
    and where the last step ends."""
    lo, hi = _ranges(trace, idx)
    if not len(idx):
        return (lo, hi), {}
    o = np.argsort(lo, kind="stable")
    gaps = np.diff(lo[o])
    if not (gaps > 0).all():
        return (lo, hi), {}
    ratio = (hi - lo)[o][:-1] / gaps if len(gaps) else np.zeros(0)
    short = len(ratio) > 0 and float(np.quantile(ratio, 0.9)) < BOUNDARY_SHARE
    thread = trace.tid_id[idx[o[-1]]]
    dev = trace.is_device()
    others = np.ones(len(trace.ts), bool)
    others[idx] = False
    held = None
    if not dev.any():  # a host timeline: the work the markers hold (on a device timeline the GPU
        # runs behind the host, so a step's work lies past its range: windows follow its launches)
        # the work from the first marker on (what encloses the markers, a whole-trace 'PyTorch
        # Profiler' span or a Python frame, is no step's work), and the part the markers cover
        after = np.flatnonzero(others & (trace.ts >= lo[o[0]]))
        work = iv.union(trace.ts[after], trace.ts[after] + trace.dur[after])
        busy_len = iv.length(work)
        if busy_len:
            m_lo, m_hi = (np.asarray(x) for x in zip(*_disjoint(lo[o], hi[o])))
            held = float(iv.covered(work, m_lo, m_hi).sum()) / busy_len
    others &= dev if dev[idx].any() else ~dev
    if not short and not (held is not None and held < HELD_SHARE):
        return (lo, hi), {}
    mine = others & (trace.tid_id == thread)
    thread_end = float((trace.ts + trace.dur)[mine].max()) if mine.any() else -np.inf
    last_end, ends_at = ((thread_end, "the end of the recorded work on the markers' thread")
                         if thread_end > lo[o[-1]] else
                         (end_of_work, "the end of the recorded work (the markers' thread records none after the last)"))
    new_hi = hi.copy()
    new_hi[o[:-1]] = np.maximum(hi[o[:-1]], lo[o[1:]])
    new_hi[o[-1]] = max(float(hi[o[-1]]), last_end)
    return (lo, new_hi), {"markers_as_boundaries": {
        "markers": int(len(idx)), "evidence": "short" if short else "hold no work",
        "median_marker_share_of_step_pct": round(100 * float(np.median(ratio)), 4) if len(ratio) else None,
        "work_inside_markers_pct": round(100 * held, 4) if held is not None else None, "last_step_ends_at": ends_at}}


def _disjoint(lo: np.ndarray, hi: np.ndarray) -> list[tuple[float, float]]:
    """Sorted ranges merged where they overlap (so covered time is counted once)."""
    out: list[list[float]] = []
    for a, b in zip(lo.tolist(), hi.tolist()):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _launched(trace: Trace, h_spans: tuple[np.ndarray, np.ndarray],
              marks: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray] | None, dict, np.ndarray]:
    """Per host step range `h_spans[j]`: its window (the host range joined with the span of the device
    work launched inside it, tiled), or None where no device work links to any of them, or where more than
    MAX_UNCORRELATED of the device work has no launch id (a reader or producer that did not
    write it: windows from the rest would leave that work out; said as
    `device_work_without_correlation`). Third: the device work launched before the first step or
    after the last (it belongs to no step, though the GPU may run it inside one)."""
    dev, corr = trace.is_device(), trace.arg_corr
    outside = np.zeros(len(trace.ts), bool)
    h_lo, h_hi = h_spans
    has = corr >= 0
    launch = np.flatnonzero(~dev & has)
    all_work = np.flatnonzero(trace.is_device_work())
    work = all_work[has[all_work]]
    unlinked = len(all_work) - len(work)
    if not len(launch) or not len(work) or unlinked > MAX_UNCORRELATED * len(all_work):
        # device work the reader gave no launch id: windows from it would leave that work out
        return None, {"device_work_without_correlation": int(unlinked)} if unlinked and len(work) else {}, outside
    # launch -> the annotation holding its start (innermost; any thread of the process)
    owner = iv.enclosing(np.zeros(len(h_lo)), h_lo, h_hi, np.zeros(len(launch)), trace.ts[launch])
    # device event -> its launch by correlation id -> that launch's step
    which = _by_id(corr[launch], np.arange(len(launch)), corr[work])
    step_of = np.where(which >= 0, owner[np.maximum(which, 0)], -1)
    found = step_of >= 0
    if not found.any():
        return None, {}, outside
    # launched outside every step: before the first, after the last (no step's), or between two
    launched_at = np.where(which >= 0, trace.ts[launch][np.maximum(which, 0)], np.nan)
    before = (which >= 0) & ~found & (launched_at < h_lo.min())
    # Correlation ids count up per launch: device work whose id is below every launch the trace
    # holds was launched before the trace began, so before the first step (a real MI300X trace:
    # 968 events launched before the profiler's first runtime call ran 30 ms into the first step)
    pre_trace = (which < 0) & (corr[work] < corr[launch].min())
    before |= pre_trace
    after = (which >= 0) & ~found & (launched_at >= h_hi.max())
    outside[work[before | after]] = True
    before_end = float((trace.ts + trace.dur)[work[before]].max()) if before.any() else None
    counted = {"device_work_without_launch": int(((which < 0) & ~pre_trace).sum()),  # its runtime call is not in the trace
               "device_work_launched_before_the_trace": int(pre_trace.sum()),
               "device_work_outside_steps": int(((which >= 0) & ~found).sum()),  # before, between or after steps
               "device_work_before_first_step": _work(trace, work[before]),
               "device_work_after_last_step": _work(trace, work[after])}
    work, step = work[found], step_of[found]
    w_lo, w_dur = trace.ts[work], trace.dur[work]
    w_hi = w_lo + w_dur
    lo, hi = h_lo.copy(), h_hi.copy()
    # A step's window starts at its host range: its work was launched inside the range and cannot
    # start before its launch. Work that seems to (a device clock behind the host's: ROCm's, by
    # up to tens of ms) would pull the window back over the work before the step; it is counted.
    early = w_lo < trace.ts[launch][which[found]] - CAUSALITY_TOL_US
    if early.any():
        counted["device_work_before_its_launch"] = {
            "events": int(early.sum()), "max_us": float((trace.ts[launch][which[found]] - w_lo)[early].max())}
    np.maximum.at(hi, step, w_hi)
    # Tiled in start order: a window starts no earlier than the previous one ends, so time is
    # never counted twice when the host runs a step ahead of the device.
    k = np.argsort(lo, kind="stable")
    prev_end = np.concatenate([[-np.inf], np.maximum.accumulate(hi[k])[:-1]])
    # The first step starts no earlier than the device finishes the work launched before it (that
    # time is the earlier work's, not the step's), and no later than its own first device event
    if before_end is not None and len(k):
        first = k[0]
        own_first = float(w_lo[step == first].min()) if (step == first).any() else float(hi[first])
        prev_end[0] = min(before_end, own_first)
    lo[k] = np.maximum(lo[k], prev_end)
    hi = np.maximum(hi, lo)
    launched_any = np.zeros(len(h_lo), bool)
    launched_any[step] = True
    busy = float(w_dur.sum())
    own = np.maximum(0.0, np.minimum(w_hi, hi[step]) - np.maximum(w_lo, lo[step]))
    how = {"windows_from": "launched work", "launched_events": int(len(work)), **counted,
           "steps_without_device_work": int((~launched_any).sum()),
           # launched work past its host range (the device running behind): inside the windows now
           "launched_after_host_range_pct": _pct(float(np.maximum(0.0, w_hi - np.maximum(w_lo, h_hi[step])).sum()), busy),
           # launched work in a neighbour's window (steps overlapping on the device)
           "launched_outside_own_window_pct": _pct(busy - float(own.sum()), busy)}
    if len(marks):  # GPU-side copies of the annotations: how much of the launched work they miss
        m_lo, m_hi = _ranges(trace, marks)
        covered = iv.covered(iv.union(m_lo, m_hi), w_lo, w_hi)
        how["device_markers"] = {"markers": int(len(marks)), "launched_outside_pct": _pct(busy - float(covered.sum()), busy)}
    return (lo, hi), how, outside


def _work(trace: Trace, idx: np.ndarray) -> dict:
    """{events, us}: device work that belongs to no step, left out of every window."""
    return {"events": int(len(idx)), "us": float(trace.dur[idx].sum())}


def _by_id(keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """values[j] where keys[j] == query (the first such j), else -1, per query. Correlation ids
    count up from a small base: a lookup table where they span little, else a sorted search."""
    if not len(keys) or not len(queries):
        return np.full(len(queries), -1, np.int64)
    lo = int(min(keys.min(), queries.min()))
    span = int(max(keys.max(), queries.max())) - lo + 1
    if span <= max(1 << 20, 4 * (len(keys) + len(queries))):
        lut = np.full(span, -1, np.int64)
        lut[keys[::-1] - lo] = values[::-1]  # the first of repeated keys wins (last write)
        return lut[queries - lo]
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    pos = np.minimum(np.searchsorted(sk, queries), len(sk) - 1)
    return np.where(sk[pos] == queries, values[order[pos]], -1)


def _pct(part: float, whole: float) -> float:
    return max(0.0, 100.0 * part / whole) if whole else 0.0  # sums of floats: never a -0.0003 %


def _by_phase(trace: Trace, rule: PhaseRule, good: dict, idx: np.ndarray, spans: tuple[np.ndarray, np.ndarray],
              bad: list[int], side: np.ndarray, how: dict) -> tuple[dict[str, list[tuple[float, float]]], dict]:
    """The annotations `idx` (their windows `spans`) grouped by phase, with the engine steps each
    phase saw."""
    ids = trace.name_id[idx]
    present = np.unique(ids).tolist()
    # Per distinct annotation (one Python step each), then per phase by array ops: a trace of N
    # steps has N distinct names, and per-name numpy work cost ~7 ms per 1,000.
    phase_of = {nid: rule.phase_of(good[nid]) for nid in present}
    order = list(dict.fromkeys(phase_of.values()))
    lut = np.zeros(max(present) + 1, np.int32)
    lut[present] = [order.index(ph) for ph in phase_of.values()]
    per = lut[ids]
    times = np.bincount(ids)
    steps: dict[str, dict] = {ph: {"steps": 0} for ph in order}
    for nid, ph in phase_of.items():
        st, n = steps[ph], int(times[nid])
        st["steps"] += n
        for k, v in rule.counts(good[nid]).items():
            st[k] = st.get(k, 0) + v * n
    lo, hi = spans
    out: dict[str, list] = {}
    for k, ph in enumerate(order):
        sel = per == k
        if sel.any():
            out[ph] = sorted(zip(lo[sel].tolist(), hi[sel].tolist()))
    info = {"rule": rule.name, "source": rule.source, **how, **_malformed(trace, bad, side)}
    o = np.argsort(lo, kind="stable")
    overlapping = int((lo[o][1:] < np.maximum.accumulate(hi[o])[:-1]).sum())
    if overlapping:
        info["overlapping_windows"] = overlapping  # their shared time counts in both (multi-stream or async steps)
    if rule.name not in ("commprobe", "profiler-step"):
        info["engine_steps"] = steps
    return out, info


def _malformed(trace: Trace, bad: list[int], side: np.ndarray) -> dict:
    """{malformed: events, malformed_names: the first distinct texts} of annotations a rule claims
    but cannot parse."""
    if not bad:
        return {"malformed": 0}
    n = int((np.isin(trace.name_id, bad) & side).sum())
    return {"malformed": n, "malformed_names": [trace.names[i] for i in sorted(set(bad))[:MAX_MALFORMED_SHOWN]]}
