"""Verdicts and advice: per phase, is it communication-, compute-, data-movement- or
host/launch-bound, which axis dominates, and what to do about it. Reads the per-rank breakdowns
and the matched collectives the other analyzers computed; the words a user acts on live here and
only here.

A verdict is the first row of `RULES` whose precondition holds on the phase's own numbers
(`Facts`); each row says what it needs, so no verdict is given that its numbers do not support,
and where none holds the verdict is `unknown` with the reason. The rule that fired is named in the
result (`verdict_rule`). Facts the verdict does not rest on but a reader should know (a host
timeline only; windows that miss part of a rank's work) are `notes`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from commprobe.common.units import message_size
from commprobe.common.vocab import AXIS_OF, COMM_CATS, WORK_CATEGORIES, Verdict
from commprobe.common.vocab import CATEGORY_LABEL as LABEL

from ..per_rank.launches import words as launch_words
from . import cause as causes
from . import remedies

IDLE_BOUND = 0.5  # a timeline idle more than this share of a phase is not bound by what runs on it
MIN_BUSY_SHARE = 0.01  # windows with less recorded work than this share of their time: no verdict
MIN_IN_WINDOWS_PCT = 90.0  # below this share of a rank's work inside its windows, the phase summary says so
PHASE_ORDER = ("prefill", "decode", "mixed", "cached", "idle-step", "step", "trace")
HOST_ONLY = "host timeline only: no device activity is recorded, so device time cannot be told"


@dataclass
class Facts:
    """A phase's numbers, averaged over its ranks: what every rule reads."""

    phase: str
    shares: dict[str, float]  # exposed share of end-to-end time per category
    idle: float
    comm: float  # exposed communication share
    top_comm: str
    device: bool
    graph: str
    busy_us_per_window: float
    threshold: float
    provenance: dict
    axes: dict  # per communication category, calls per axis
    cause: dict | None = None  # cross_rank/cause.diagnose: transfer vs waiting, culprit, baseline
    missing_device: str = ""  # host timelines that launched device work they did not record: the evidence

    @property
    def told(self) -> bool:
        """Whether transfer and waiting could be told apart (calls matched across ranks)."""
        return bool(self.cause) and self.cause["class"] != "inconclusive"

    @property
    def transfer(self) -> float:
        """Exposed communication that is transfer, as a share of end-to-end time (all of it where
        transfer and waiting cannot be told apart)."""
        return min(self.comm, self.cause["transfer_share"]) if self.told else self.comm

    @property
    def waiting(self) -> float:
        return min(self.comm, self.cause["wait_share"]) if self.told else 0.0

    @property
    def lead(self) -> str:
        """What the exposed communication is mostly: 'transfer', 'waiting' or 'both'. A part above
        the threshold alone decides; where neither part is, the class does (2/3 of it)."""
        if not self.told:
            return "transfer"
        t, w = self.transfer > self.threshold, self.waiting > self.threshold
        if t or w:
            return "both" if t and w else "transfer" if t else "waiting"
        return {"transfer-dominated": "transfer", "skew-dominated": "waiting"}.get(self.cause["class"], "both")

    @property
    def busy(self) -> float:
        return max(0.0, 1.0 - self.idle)

    def largest(self) -> tuple[str, float]:
        """The largest share of the window, idle included: the only thing 'largest' may name."""
        cands = {**self.shares, "idle": self.idle}
        top = max(cands, key=cands.get)
        return top, cands[top]


@dataclass(frozen=True)
class Rule:
    name: str
    needs: str  # the precondition, in words (the result's verdict_rule.needs)
    verdict: Verdict
    holds: Callable[[Facts], bool]
    says: Callable[[Facts], tuple[str, float, str]]  # (dominant category, its share, summary)


def _graph_capture(f: Facts):
    return "unknown", 0.0, (f"{f.phase}: no verdict: the trace records CUDA/HIP graph capture but no replay: profile "
                            f"serving steps, not the capture")


def _graph_blind(f: Facts):
    return "unknown", 0.0, (f"{f.phase}: no verdict: the trace records graph replays but not the kernels they ran (most "
                            f"replays are followed by no kernel): the device's time cannot be told from it; profile with "
                            f"the graph's kernels recorded")


RECORD_DEVICE = ("record the device: torch.profiler activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] "
                 "(HIP builds too), nsys profile --trace=cuda,nvtx, rocprofv3 --kernel-trace")


def _device_missing(f: Facts):
    return "unknown", 0.0, (f"{f.phase}: no verdict: the device timeline is missing: the trace launches work to a device "
                            f"({f.missing_device}) but records no device activity, so neither compute nor communication "
                            f"time can be told from its host ops; {RECORD_DEVICE}")


def _empty(f: Facts):
    where = "device" if f.device else "host"
    return "idle", f.idle, (f"{f.phase}: no verdict: its windows hold {f.busy_us_per_window:.0f} µs of recorded {where} "
                            f"work each ({f.busy:.1%} of their time): too little to say what bounds it")


def _device_idle(f: Facts):
    return "idle", f.idle, (f"{f.phase} is host/launch-bound: the device is idle {f.idle:.0%} of the window "
                            f"(exposed communication {f.comm:.0%})")


def _split(f: Facts) -> str:
    return f"; {causes.describe(f.cause)}" if f.cause else ""


def _communication(f: Facts):
    host = "; host timeline only" if not f.device else ""
    return f.top_comm, f.shares[f.top_comm], (
        f"{f.phase} is communication-bound: exposed communication is {f.comm:.0%} of end-to-end latency (threshold "
        f"{f.threshold:.0%}), {_top(f)}{_split(f)}{host}")


def _culprit_words(f: Facts) -> str:
    c = f.cause or {}
    if c.get("culprit") is None:
        return causes.no_culprit_words(c)
    return (f"rank {c['culprit']} arrives last (it caused {c['wait_caused_by'].get(str(c['culprit']), 0):.0%} of the "
            f"waiting): it spends {causes.doing_words(c.get('culprit_doing') or {})}")


def _top(f: Facts) -> str:
    """The largest communication category, its share and how its axis is known: what every
    communication verdict names."""
    return (f"{LABEL[f.top_comm]} {f.shares[f.top_comm]:.0%}{axes_note(f.top_comm, f.axes)}"
            f"{axis_note(f.top_comm, f.provenance)}")


def _imbalance(f: Facts):
    return f.top_comm, f.shares[f.top_comm], (
        f"{f.phase} is imbalance-bound: exposed communication is {f.comm:.0%} of end-to-end latency ({_top(f)}), of "
        f"which {f.waiting:.0%} is waiting for a late rank and {f.transfer:.0%} transfer (threshold "
        f"{f.threshold:.0%}); {_culprit_words(f)}")


def _mixed(f: Facts):
    return f.top_comm, f.shares[f.top_comm], (
        f"{f.phase} is communication- and imbalance-bound: exposed communication is {f.comm:.0%} of end-to-end latency "
        f"({_top(f)}; threshold {f.threshold:.0%}): transfer {f.transfer:.0%}, waiting for a late rank "
        f"{f.waiting:.0%}; {_culprit_words(f)}")


def _host_waiting(f: Facts):
    return "idle", f.idle, (f"{f.phase}: no verdict ({HOST_ONLY}): the recorded host ops cover {f.busy:.0%} of the window "
                            f"({f.busy_us_per_window:.0f} µs each); the other {f.idle:.0%} is time the trace does not "
                            f"attribute (waiting on a device, a peer, I/O, or code the profiler did not record)")


def _data_movement(f: Facts):
    return "memcpy", f.shares["memcpy"], (
        f"{f.phase} is data-movement-bound: copies and memsets are {f.shares['memcpy']:.0%} of end-to-end latency, more "
        f"than compute ({f.shares['compute']:.0%}); mostly {{copies}} (exposed communication {f.comm:.0%})")


def _top_work(f: Facts) -> str:
    """The largest share of work (idle aside)."""
    return max(WORK_CATEGORIES, key=lambda c: f.shares[c])


def _compute(f: Facts):
    top = _top_work(f)
    host = f" ({HOST_ONLY})" if not f.device else ""
    return top, f.shares[top], (
        f"{f.phase} is compute-bound: exposed communication is {f.comm:.0%} of end-to-end latency (threshold "
        f"{f.threshold:.0%}); {LABEL[top]} {f.shares[top]:.0%}, idle {f.idle:.0%}{host}")


def _unsupported(f: Facts):
    top, share = f.largest()
    return top, share, (f"{f.phase}: no verdict: no rule's precondition holds (largest share: {top} {share:.0%}, exposed "
                        f"communication {f.comm:.0%}, idle {f.idle:.0%})")


RULES: tuple[Rule, ...] = (
    Rule("graph capture only", "the trace records graph capture and no replay", Verdict.UNKNOWN,
         lambda f: f.graph == "capture-only", _graph_capture),
    Rule("graph kernels missing", "graph replays are recorded without the kernels they ran", Verdict.UNKNOWN,
         lambda f: f.graph == "replays-without-kernels", _graph_blind),
    Rule("device timeline missing", "a host timeline whose trace launches device work (runtime launch calls, calls "
         "correlated to device work, NCCL/RCCL calls) and records none of it", Verdict.UNKNOWN,
         lambda f: bool(f.missing_device), _device_missing),
    Rule("no work in the windows", f"recorded work under {MIN_BUSY_SHARE:.0%} of the windows' time", Verdict.UNKNOWN,
         lambda f: f.busy < MIN_BUSY_SHARE, _empty),
    Rule("device idle", f"a device timeline idle over {IDLE_BOUND:.0%} of the window", Verdict.HOST,
         lambda f: f.device and f.idle > IDLE_BOUND, _device_idle),
    Rule("exposed transfer", "exposed communication above the threshold and mostly transfer: its transfer part "
         "above the threshold and its waiting part not, or neither alone and transfer at least 2/3 of it (or transfer "
         "and waiting not told apart: no call matched across ranks)", Verdict.COMMUNICATION,
         lambda f: f.comm > f.threshold and f.lead == "transfer", _communication),
    Rule("waiting for a late rank", "exposed communication above the threshold and mostly waiting: its waiting part "
         "above the threshold and its transfer part not, or neither alone and waiting at least 2/3 of it",
         Verdict.IMBALANCE, lambda f: f.comm > f.threshold and f.lead == "waiting", _imbalance),
    Rule("transfer and waiting", "exposed communication above the threshold: transfer and waiting both above it, or "
         "neither alone and neither 2/3 of it", Verdict.MIXED, lambda f: f.comm > f.threshold, _mixed),
    Rule("host idle", f"a host timeline (no device activity) idle over {IDLE_BOUND:.0%} of the window", Verdict.UNKNOWN,
         lambda f: not f.device and f.idle > IDLE_BOUND, _host_waiting),
    Rule("copies over compute", "a device timeline whose copies and memsets exceed compute and other work",
         Verdict.DATA_MOVEMENT, lambda f: f.device and f.shares["memcpy"] > max(f.shares["compute"], f.shares["other"]),
         _data_movement),
    Rule("compute", f"computation (compute or other work, not communication or copies) the largest share of work, "
                    f"the timeline busy at least {1 - IDLE_BOUND:.0%}",
         Verdict.COMPUTE, lambda f: f.idle <= IDLE_BOUND and _top_work(f) in ("compute", "other"), _compute),
    Rule("nothing holds", "none of the above", Verdict.UNKNOWN, lambda f: True, _unsupported),
)


def judge(f: Facts) -> tuple[Rule, str, float, str]:
    """The first rule whose precondition holds, and what it says."""
    rule = next(r for r in RULES if r.holds(f))
    return (rule, *rule.says(f))


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


def axes_note(cat: str, axes: dict) -> str:
    """For other communication, the axes its calls are on (DP from a training step, or none known)."""
    on = axes.get(cat) or {}
    if cat != "other_comm" or set(on) <= {"other"}:
        return ""
    words = {"dp": "DP", "pp": "PP", "other": "no known axis"}
    return " (" + ", ".join(f"{words.get(a, a.upper())}: {n} calls" for a, n in sorted(on.items(), key=lambda kv: -kv[1])) + ")"


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
                  provenance: dict | None = None, graphs: dict | None = None, axes: dict | None = None,
                  baseline: dict | None = None, run: dict | None = None) -> dict:
    """Per phase: its shares over the ranks, the verdict of the first rule that holds, advice.
    `axes`: per communication category, calls per axis (other communication may be DP);
    `baseline`: how the zero-skew transfer times were found (cross_rank/cause.py); `run`: its backend, host."""
    provenance, graphs, axes = provenance or {}, graphs or {}, axes or {}
    out = {}
    names = sorted({p for r in ranks for p in r["phases"]},
                   key=lambda p: PHASE_ORDER.index(p) if p in PHASE_ORDER else len(PHASE_ORDER))
    for phase in names:
        rows = [r for r in ranks if phase in r["phases"]]
        shares = {c: 0.0 for c in WORK_CATEGORIES}
        idle = 0.0
        for r in rows:
            p = r["phases"][phase]
            if not p["e2e_us"]:  # windows of no length (markers of zero duration at one instant) hold no work
                idle += 1.0 / len(rows)
                continue
            for c, v in p["categories"].items():
                shares[c] += v["exposed_us"] / p["e2e_us"] / len(rows)
            idle += p["idle_us"] / p["e2e_us"] / len(rows)
        e2e_max = max(r["phases"][phase]["e2e_us"] for r in rows)
        device = any(r["timeline"] == "device" for r in rows)
        comm_share = sum(shares[c] for c in COMM_CATS)
        top_comm = max(COMM_CATS, key=lambda c: shares[c])
        graph = _graph_state(graphs, rows)
        busy_us = sum(r["phases"][phase]["e2e_us"] - r["phases"][phase]["idle_us"] for r in rows) / max(
            1, sum(r["phases"][phase]["windows"] for r in rows))
        diag = causes.diagnose(rows, phase, baseline, (run or {}).get("host")) if comm_share > 0 else None
        missing = [r for r in rows if r.get("device_missing")]
        missing_words = (f"{launch_words(missing[0]['device_missing'])} on rank {missing[0]['rank']}"
                         + (f", and {len(missing) - 1} more rank(s)" if len(missing) > 1 else "")) if missing else ""
        facts = Facts(phase, shares, idle, comm_share, top_comm, device, graph, busy_us, threshold, provenance, axes,
                      diag, missing_words)
        rule, dominant, share, summary = judge(facts)
        verdict = rule.verdict
        way = copy_direction_of(rows) if verdict is Verdict.DATA_MOVEMENT else None
        if way:
            summary = summary.replace("{copies}", way)
        notes = [summary] if verdict is Verdict.UNKNOWN else []  # why there is no verdict comes first
        notes += ([] if device or missing else [HOST_ONLY]) + _window_notes(rows, phase) + (diag or {}).get("host_notes", [])
        largest, largest_share = facts.largest()
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
            "largest": largest,
            "largest_share": largest_share,
            "verdict_rule": {"name": rule.name, "needs": rule.needs},
            "summary": summary,
            "notes": notes,
            "graphs": graph,
            "communication_cause": diag,
            "recommendations": [] if verdict is Verdict.UNKNOWN else recommend(phase, shares, idle, device, threshold, matched, buckets,
                                                          provenance, graph, copies=way if verdict is Verdict.DATA_MOVEMENT
                                                          else None, cause=diag, engine=remedies.engine_of(rows, (run or {}).get("backend"))),
        }
    return out


def _window_notes(rows: list[dict], phase: str) -> list[str]:
    """Ranks whose windows hold less than MIN_IN_WINDOWS_PCT of their recorded work, and device
    work that belongs to no step: what this phase's numbers leave out."""
    out = []
    for r in rows:
        rule = r.get("phase_rule") or {}
        pct = rule.get("busy_in_windows_pct")
        if pct is not None and pct < MIN_IN_WINDOWS_PCT and rule.get("windows_from") != "whole trace":
            out.append(f"rank {r['rank']}: its windows hold {pct:.0f}% of its recorded work; the rest lies outside "
                       f"every step and is not in this breakdown")
        for where in ("before_first_step", "after_last_step"):
            w = rule.get(f"device_work_{where}") or {}
            if w.get("events"):
                out.append(f"rank {r['rank']}: {w['events']} device events ({w['us']:.0f} µs) launched "
                           f"{where.replace('_', ' ')} belong to no step and are left out")
    return out


def _transfer_of(cat: str, shares: dict, cause: dict | None) -> float:
    """A category's exposed share that is transfer (all of it where waiting cannot be told apart):
    advice on the collective itself rests on this, not on time spent waiting for a late rank."""
    one = ((cause or {}).get("by_category") or {}).get(cat)
    if not one or one["class"] == "inconclusive":
        return shares[cat]
    return min(shares[cat], one["transfer_share"])


def recommend(phase, shares, idle, device, threshold, matched, buckets, provenance=None, graph="none",
              copies: str | None = None, cause: dict | None = None, engine: str | None = None) -> list[str]:
    """Advice per phase. Axis-specific advice only for an axis the trace declares or its ops imply
    (a category exists only then); communication of unknown axis gets no axis's advice. Advice on
    a collective rests on its transfer time; waiting for a late rank gets advice on that rank."""
    provenance = provenance or {}
    recs = []
    tp = _transfer_of("tp_allreduce", shares, cause)
    if tp > threshold / 2:
        sizes = [b for b in buckets if b["category"] == "tp_allreduce"]
        if sizes:
            med = sorted(sizes, key=lambda b: -b["count"])[0]
            if med["bucket_bytes"] <= 1 << 20:
                recs.append(f"TP allreduce{axis_note('tp_allreduce', provenance)} takes {tp:.0%} of {phase} with "
                            f"≤{message_size(med['bucket_bytes'])} messages (median {med['median_us']:.0f} µs): "
                            f"small allreduces are latency-bound; {remedies.small_allreduce(engine, device)}")
            else:
                recs.append(f"TP allreduce{axis_note('tp_allreduce', provenance)} takes {tp:.0%} of {phase} at "
                            f"{med['bucket_bytes'] >> 20} MiB messages: use a "
                            f"two-shot allreduce or overlap it with the next layer's compute")
    if _transfer_of("ep_all_to_all", shares, cause) > threshold / 2:
        recs.append(f"EP all-to-all{axis_note('ep_all_to_all', provenance)} is exposed for "
                    f"{shares['ep_all_to_all']:.0%} of {phase}: overlap dispatch/combine "
                    f"with expert compute (micro-batch overlap, low-latency all-to-all kernels)")
    if _transfer_of("cp_ring", shares, cause) > threshold / 2:
        recs.append(f"CP ring steps are exposed for {shares['cp_ring']:.0%} of {phase}: overlap the next block's "
                    f"send/recv with attention on the current one, or switch pass-KV/pass-Q")
    for c in (cause or {}).get("causes", []):
        if c["cause"] == "skew" and c["rank"] is not None:
            doing = causes.doing_words(cause.get("culprit_doing") or {})
            recs.append(f"the ranks wait {c['share']:.0%} of {phase} for rank {c['rank']}, which spends {doing}: fix "
                        f"rank {c['rank']}'s imbalance (its compute, its host, or the work routed to it) before tuning "
                        f"collectives")
        elif c["cause"] == "skew":
            recs.append(f"the ranks wait {c['share']:.0%} of {phase} in collectives for whichever rank is late, no one "
                        f"rank more than the others: per-call arrival jitter; look for host noise on every rank (other "
                        f"processes on the cores, Python GC, CPU frequency, interrupts) and pin ranks to cores")
        elif c["cause"] == "slow-transfer":
            recs.append(f"{LABEL.get(c.get('category', ''), 'communication')} transfer runs {c['ratio']:.1f}× this "
                        f"machine's zero-skew baseline for these sizes ({c['share']:.0%} of {phase} above it): the "
                        f"transport is slower than it measures alone; check the link, topology, and what else shares it")
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
