"""Where each rank's time goes, per phase: total and *exposed* time per category, and idle.

Timeline: on a trace with device activity, the device's kernels and copies on all streams;
on a CPU-only trace, the host's ops (a collective blocks its calling thread there, so all of
its time is exposed; ops nested inside a collective count as the collective).

Exposed communication is communication time not overlapped by compute on any stream of the
device. Idle is window time with nothing on the timeline.

Windows (windows.py): the first phase rule of phases.py that matches (our spans, engines' steps,
`ProfilerStep#N`), on a device timeline the span of the device work each step launched, else the
whole trace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..readers.model import Trace
from . import intervals as iv
from .classify import CATEGORIES, COMM_CODES, COMPUTE, MARKER, MEMCPY, OTHER, Classified, comm_mask
from .launches import device_launches, drove_a_device
from .sampling import thin
from .windows import windows

_STEP = re.compile(r"^ProfilerStep#\d+$")


@dataclass
class Timeline:
    device: bool
    mask: np.ndarray  # events on the timeline


# What a window's time in no recorded work is, by timeline: a device that runs nothing waits on its
# host; a host timeline's time between ops is the host's own (Python, the framework), or a wait the
# profiler did not record
IDLE_MEANS = {"device": "device idle: no kernel, copy or memset running",
              "host": "outside ops: host time in no recorded op (Python and the framework's own work, or a wait the "
                      "profiler did not record)"}

def timeline(trace: Trace) -> Timeline:
    dev = trace.is_device()
    if dev.any():
        return Timeline(True, dev)
    return Timeline(False, ~dev)


def category_unions(trace: Trace, cls: Classified, tl: Timeline) -> dict[int, iv.Intervals]:
    start, end = trace.ts, trace.ts + trace.dur
    out = {}
    for code in (COMPUTE, *COMM_CODES, MEMCPY, OTHER):
        m = tl.mask & (cls.category == code)
        out[code] = iv.union(start[m], end[m])
    m = tl.mask & comm_mask(cls.category)
    comm_all = iv.union(start[m], end[m])
    busy = tl.mask & (cls.category != MARKER)
    if not tl.device:
        # A host timeline with Python stacks: the interpreter running Python between ops is the
        # host's own work (other), not idle (a real SGLang server's steps: Python covers all of
        # them, its ops and record_functions 11-88 %)
        py = tl.mask & (cls.category == MARKER) & _python(trace)
        if py.any():  # only where no op runs: Python around an op is the op's time
            only = iv.subtract(iv.subtract(iv.union(start[py], end[py]), out[COMPUTE]), comm_all)
            out[OTHER] = iv.union(np.r_[out[OTHER][0], only[0]], np.r_[out[OTHER][1], only[1]])
            busy |= py
        # On the host a collective owns its thread: ops nested inside it are part of it.
        out[COMPUTE] = iv.subtract(out[COMPUTE], comm_all)
        out[OTHER] = iv.subtract(out[OTHER], comm_all)
    out[MARKER] = iv.union(start[busy], end[busy])  # reused as "busy" below
    return out


def _python(trace: Trace) -> np.ndarray:
    """Events of Python frames (torch.profiler's with_stack: category python_function)."""
    flags = np.array([c == "python_function" for c in trace.cats] or [False], bool)
    return flags[trace.cat_id] if len(trace.cats) else np.zeros(len(trace.ts), bool)


@dataclass
class Exposure:
    """A rank's windows and, per category, the intervals that count: unions of its events on the
    timeline, communication and copies less what compute overlaps (on a device). What the breakdown
    sums, and what a trace export draws."""

    timeline: Timeline
    windows: dict[str, list[tuple[float, float]]]
    rule: dict
    unions: dict[int, iv.Intervals]
    exposed: dict[int, iv.Intervals]  # communication and copies not overlapped by compute


def exposure(trace: Trace, cls: Classified) -> Exposure:
    tl = timeline(trace)
    wins, rule, no_step = windows(trace, tl.device, tl.mask)
    if no_step.any():  # device work launched before the first step or after the last: no step's
        tl = Timeline(tl.device, tl.mask & ~no_step)
    unions = category_unions(trace, cls, tl)
    compute = unions[COMPUTE]
    exposed = {c: iv.subtract(unions[c], compute) if tl.device else unions[c] for c in (*COMM_CODES, MEMCPY)}
    return Exposure(tl, wins, rule, unions, exposed)


def rank_breakdown(trace: Trace, cls: Classified) -> dict:
    ex = exposure(trace, cls)
    tl, wins, rule, unions, exposed_base = ex.timeline, ex.windows, ex.rule, ex.unions, ex.exposed
    phases = {}
    for phase, spans in wins.items():
        lo = np.array([a for a, _ in spans])
        hi = np.array([b for _, b in spans])
        e2e = float(np.sum(hi - lo))
        cats, per_window = {}, {}
        for code in (COMPUTE, *COMM_CODES, MEMCPY, OTHER):
            total = float(iv.covered(unions[code], lo, hi).sum())
            if code in (COMPUTE, OTHER):
                exposed = total
            else:
                w = iv.covered(exposed_base[code], lo, hi)
                exposed = float(w.sum())
                if code in COMM_CODES:
                    per_window[CATEGORIES[code]] = thin(w / np.maximum(hi - lo, 1e-9), MAX_SHARE_SAMPLES, 6)
            cats[CATEGORIES[code]] = {"total_us": total, "exposed_us": exposed}
        busy = float(iv.covered(unions[MARKER], lo, hi).sum())
        phases[phase] = {"windows": len(spans), "e2e_us": e2e, "idle_us": max(0.0, e2e - busy), "categories": cats,
                         "window_exposed_share": per_window}
    rule["busy_in_windows_pct"] = _busy_inside(unions[MARKER], wins)
    shown = {c: (unions[c] if c in (COMPUTE, OTHER) else exposed_base[c]) for c in (COMPUTE, *COMM_CODES, MEMCPY, OTHER)}
    missing = None if tl.device else device_launches(trace)  # a host timeline: is the device's missing?
    return {"rank": trace.rank, "file": trace.path, "timeline": "device" if tl.device else "host",
            "idle_means": IDLE_MEANS["device" if tl.device else "host"], "phases": phases,
            "device_missing": missing if missing and drove_a_device(missing) else None,
            "phase_rule": rule,
            "windows": {ph: [[a, b] for a, b in sp[:MAX_WINDOWS]] for ph, sp in wins.items()},
            "segments": {ph: _segments(shown, sp) for ph, sp in wins.items()}}


def _busy_inside(busy: iv.Intervals, wins: dict[str, list[tuple[float, float]]]) -> float:
    """The share (%) of the rank's busy time (device work, else host ops; work that belongs to no
    step aside) that lies inside its windows: what the phase breakdown can speak for."""
    total = iv.length(busy)
    spans = [w for sp in wins.values() for w in sp]
    if not total or not spans:
        return 0.0 if total else 100.0
    lo, hi = np.array([a for a, _ in spans]), np.array([b for _, b in spans])
    inside = iv.length(iv.intersect(busy, iv.union(lo, hi)))
    return round(min(100.0, 100.0 * inside / total), 3)


MAX_WINDOWS = 2000  # window spans kept per phase (for aligning telemetry); counts cover all of them
MAX_SHARE_SAMPLES = 256  # per-window exposed shares kept per category (the regression gate's samples)
MAX_SEGMENTS = 500  # intervals kept per category in a timeline window


def _segments(shown: dict[int, iv.Intervals], spans: list[tuple[float, float]]) -> dict:
    """One window's timeline (what a report draws): the exposed intervals of each category,
    relative to the window's start. The middle window of a phase (a typical decode step; the
    only prefill)."""
    k = len(spans) // 2
    lo, hi = spans[k]
    out = {}
    for code, ivs in shown.items():
        s, e = _coarsen(*iv.clip(ivs, lo, hi), MAX_SEGMENTS)
        if len(s):
            out[CATEGORIES[code]] = [[float(a - lo), float(b - lo)] for a, b in zip(s, e)]
    return {"window": k, "start_us": lo, "dur_us": hi - lo, "by_category": out}


def _coarsen(s: np.ndarray, e: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `most` intervals covering the whole window: the smallest gaps are closed first
    (a drawing's resolution; the phase totals above are computed from the exact intervals)."""
    if len(s) <= most:
        return s, e
    gaps = s[1:] - e[:-1]
    cut = np.partition(gaps, len(gaps) - most + 1)[len(gaps) - most + 1]
    keep = np.flatnonzero(gaps >= cut)[-(most - 1):]  # the largest gaps stay open
    starts = np.concatenate([s[:1], s[keep + 1]])
    ends = np.concatenate([e[keep], e[-1:]])
    return starts, ends


def comm_comp_overlap(trace: Trace, cls: Classified, window: tuple[float, float] | None = None) -> dict:
    """Share of communication-kernel time overlapped by compute kernels: the quantity HTA's
    `get_comm_comp_overlap` reports, for cross-checking (device timelines only). With `window`,
    only kernels that start inside it count (HTA analyzes a single iteration by default)."""
    dev = trace.is_device()
    if window is not None:
        dev = dev & (trace.ts >= window[0]) & (trace.ts < window[1])
    start, end = trace.ts, trace.ts + trace.dur
    comm = dev & comm_mask(cls.category)
    comp = dev & (cls.category == COMPUTE)
    cu, pu = iv.union(start[comm], end[comm]), iv.union(start[comp], end[comp])
    total, both = iv.length(cu), iv.length(iv.intersect(cu, pu))
    return {"comm_us": total, "overlap_us": both, "overlap_pct": 100.0 * both / total if total else 0.0}


def step_windows(trace: Trace) -> dict[str, tuple[float, float]]:
    """Host-side ProfilerStep#N spans by name (the iterations HTA splits a trace into)."""
    out = {}
    dev = trace.is_device()
    for i in np.flatnonzero(~dev):
        name = trace.names[trace.name_id[i]]
        if _STEP.match(name):
            out[name] = (float(trace.ts[i]), float(trace.ts[i] + trace.dur[i]))
    return out
