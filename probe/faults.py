"""Fault injection: make one rank raise, hang, die, or fail while writing its trace, to see what
the launcher and the bundle do about it (one line naming the rank, the other ranks' artifacts
kept). Set COMMPROBE_FAULT=KIND[:RANK] (no rank: every rank), KIND one of:

    raise   the rank raises during its repetitions      die    it exits at once (status 9)
    hang    it sleeps an hour (the --timeout names it)   trace  it raises while writing its trace
    mismatch  its first allreduce is an all_gather instead (the others allreduce): a collective mismatch
    size    its first allreduce has one element fewer than the others'

Performance faults of a known size (`commprobe bench diagnosis` measures whether the analysis
names them), COMMPROBE_FAULT=KIND[:TARGET]@DOSE:

    slow-rank:R@P     rank R's compute stretched by P % (real matmuls after each layer, P % of
                      the layer's own compute time, its collectives left out)
    slow-link:AXIS@US every collective on AXIS (tp, cp, ep) takes US µs longer, inside the
                      collective, on every rank: a slower transport (transfer, not waiting)
    jitter[:R]@US     before each collective, a random 0..US µs pause on every rank (or rank R):
                      arrival skew with no one culprit
    host-stall:R@US   rank R sleeps US µs before each layer: a host stall outside any op
    hot-expert:E@P    the router sends P % of tokens to expert E: EP imbalance on E's rank
    balanced-router@P P % of tokens routed evenly over the experts (choice j of token i to expert
                      (i + j E/k) mod E): @100 is a balanced router, the no-imbalance baseline

The truth (kind, target, dose) is written into the bundle's manifest (`fault`), so it travels
with the traces. The tests use it; so can a user checking how their CI reports a dead rank. The analysis's map
workers read the same variable with their own kinds (`map-die`, `map-die-once`, `map-hang`,
NAME a substring of the trace's path: analyzers/ranks.py), which analyzers keep torch-free.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import asdict, dataclass

from commprobe.collectives.spans import pause

KINDS = ("raise", "hang", "die", "trace", "mismatch", "size")
COMM_KINDS = ("mismatch", "size")  # acted out by FaultyComm, in the collective itself
PERF_KINDS = {"slow-rank": "%", "slow-link": "µs", "jitter": "µs", "host-stall": "µs", "hot-expert": "%",
              "balanced-router": "%"}
AXES = ("tp", "cp", "ep")


@dataclass(frozen=True)
class PerfFault:
    """One performance fault of known size: what was injected, where, how much."""

    kind: str
    target: str | None  # a rank, an axis (slow-link) or an expert (hot-expert); None: every rank
    dose: float
    unit: str

    @property
    def rank(self) -> int | None:
        return int(self.target) if self.target is not None and self.kind in ("slow-rank", "host-stall", "jitter") else None

    def on(self, rank: int) -> bool:
        return self.rank is None or self.rank == rank

    def to_dict(self) -> dict:
        return {**asdict(self), "rank": self.rank}


def perf_fault(spec: str | None = None) -> PerfFault | None:
    """The performance fault COMMPROBE_FAULT (or `spec`) names, checked: one-line ValueError."""
    spec = os.environ.get("COMMPROBE_FAULT", "") if spec is None else spec
    head, at, dose = spec.partition("@")
    kind, _, target = head.partition(":")
    if kind not in PERF_KINDS:
        return None
    if not at:
        raise ValueError(f"COMMPROBE_FAULT={spec}: a {kind} fault needs a dose (@N {PERF_KINDS[kind]})")
    try:
        value = float(dose)
    except ValueError:
        raise ValueError(f"COMMPROBE_FAULT={spec}: dose {dose!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (PERF_KINDS[kind] == "%" and value > 10000):
        raise ValueError(f"COMMPROBE_FAULT={spec}: dose {dose!r} out of range")
    if kind == "slow-link" and target not in AXES:
        raise ValueError(f"COMMPROBE_FAULT={spec}: slow-link needs an axis (slow-link:tp@US; tp, cp or ep)")
    if kind in ("slow-rank", "host-stall", "hot-expert") and not target.isdigit():
        raise ValueError(f"COMMPROBE_FAULT={spec}: {kind} needs a {'expert' if kind == 'hot-expert' else 'rank'} "
                         f"({kind}:1@{dose})")
    if kind == "balanced-router" and target:
        raise ValueError(f"COMMPROBE_FAULT={spec}: balanced-router takes no target (balanced-router@100)")
    if kind == "jitter" and target and not target.isdigit():
        raise ValueError(f"COMMPROBE_FAULT={spec}: jitter takes a rank or none (jitter@US, jitter:1@US)")
    return PerfFault(kind, target or None, value, PERF_KINDS[kind])


def _fault(rank: int) -> str | None:
    """The kind COMMPROBE_FAULT names for this rank, if any (failure kinds; performance kinds are
    PerfFault's)."""
    fault = os.environ.get("COMMPROBE_FAULT", "")
    if not fault or fault.partition("@")[0].partition(":")[0] in PERF_KINDS:
        return None
    kind, _, who = fault.partition(":")
    return None if who and int(who) != rank else kind


def inject(rank: int, *kinds: str) -> None:
    """Act out COMMPROBE_FAULT here if it names one of `kinds` and this rank."""
    kind = _fault(rank)
    if kind not in kinds:
        return
    if kind in ("raise", "trace"):
        raise RuntimeError(f"injected fault on rank {rank}")
    if kind == "hang":
        time.sleep(3600)
    if kind == "die":
        os._exit(9)


class FaultyComm:
    """A Comm whose first all_reduce on the faulty rank is wrong (COMMPROBE_FAULT=mismatch:R or
    size:R): what a rank with a diverging control flow or shape bug does to a real job. Everything
    else is the wrapped Comm's."""

    def __init__(self, inner, kind: str):
        self.inner, self.kind, self.armed = inner, kind, True

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def all_reduce(self, x):
        if not self.armed:
            return self.inner.all_reduce(x)
        self.armed = False
        if self.kind == "mismatch":
            self.inner.all_gather(x)
            return x
        flat = x.reshape(-1)
        self.inner.all_reduce(flat[:-1].clone())
        return x


def faulty(comms: dict, rank: int) -> dict:
    """`comms` (axis -> Comm) with the first axis's Comm wrapped when COMMPROBE_FAULT names a
    collective fault for this rank."""
    kind = _fault(rank)
    if kind not in COMM_KINDS or not comms:
        return comms
    first = next(iter(comms))
    return {a: FaultyComm(c, kind) if a == first else c for a, c in comms.items()}


class JitteryComm:
    """A Comm that pauses a random 0..`max_s` seconds before each collective, outside the
    collective's span: late arrival, which its peers see as waiting."""

    def __init__(self, inner, max_s: float, seed: int):
        self.inner, self.max_s, self.rng = inner, max_s, random.Random(seed)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def seconds(self) -> float:  # the wrapped TimedComm's blocked time: the pause is not in it
        return self.inner.seconds

    @seconds.setter
    def seconds(self, v: float) -> None:
        self.inner.seconds = v

    def _late(self) -> None:
        pause(self.rng.uniform(0.0, self.max_s))

    def all_reduce(self, x):
        self._late()
        return self.inner.all_reduce(x)

    def all_gather(self, x):
        self._late()
        return self.inner.all_gather(x)

    def all_to_all(self, x, in_splits, out_splits):
        self._late()
        return self.inner.all_to_all(x, in_splits, out_splits)

    def send_recv(self, x, dst, src):
        self._late()
        return self.inner.send_recv(x, dst, src)

    def send_recv_start(self, x, dst, src):
        self._late()
        return self.inner.send_recv_start(x, dst, src)


def _burn(seconds: float, a) -> None:
    """Real compute (matmuls, recorded as such) for about `seconds`."""
    import torch

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.mm(a, a)


def perturb(runner, comms: dict, rank: int, seed: int = 0):
    """Install the performance fault COMMPROBE_FAULT names on this rank's model and Comms
    (`comms`: backend -> axis -> TimedComm). Returns `comms`, wrapped where the fault lives in
    them. Layer hooks find the model's blocks whether or not CP wraps it."""
    import torch

    from commprobe.collectives.spans import LINK_DELAY_S

    f = perf_fault()
    if f is None:
        return comms
    if f.kind == "slow-link":
        LINK_DELAY_S[f.target] = f.dose * 1e-6
        return comms
    if f.kind == "jitter":
        if not f.on(rank):
            return comms
        return {b: {a: JitteryComm(c, f.dose * 1e-6, seed * 1000 + rank) for a, c in per.items()}
                for b, per in comms.items()}
    model = getattr(runner, "model", runner)
    if f.kind == "hot-expert":
        from commprobe.reference_impl.moe import MoE

        for m in model.modules():
            if isinstance(m, MoE):
                m.route = _hot_route(m, int(f.target) % m.n_experts, f.dose / 100)
        return comms
    if f.kind == "balanced-router":
        from commprobe.reference_impl.moe import MoE

        for m in model.modules():
            if isinstance(m, MoE):
                m.route = _balanced_route(m, f.dose / 100)
        return comms
    if not f.on(rank):
        return comms
    timed = [c for per in comms.values() for c in per.values()]

    def comm_s() -> float:
        return sum(getattr(c, "seconds", 0.0) for c in timed)

    state: dict = {}
    if f.kind == "host-stall":
        def pre(_mod, _args):
            pause(f.dose * 1e-6)
        for block in model.layers:
            block.register_forward_pre_hook(pre)
        return comms
    a = torch.randn(96, 96, generator=torch.Generator().manual_seed(seed), device=model.output.weight.device)

    def start(_mod, _args):
        state["t"], state["c"] = time.perf_counter(), comm_s()

    def stretch(_mod, _args, _out):
        own = (time.perf_counter() - state["t"]) - (comm_s() - state["c"])
        _burn(max(0.0, own) * f.dose / 100, a)

    for block in model.layers:
        block.register_forward_pre_hook(start)
        block.register_forward_hook(stretch)
    return comms


def _balanced_route(moe, share: float):
    """moe.route with the first `share` of each batch's tokens routed evenly: choice j of token i
    to expert (i + j * E / k) mod E (k = top_k), so a token's choices fall E/k experts apart (on
    different EP ranks wherever the ranks hold E/k experts or fewer each) and consecutive tokens
    rotate over all of them."""
    import torch

    plain = moe.route
    seen = [0]  # tokens routed so far: a decode step's one token takes the next expert, not expert 0 again

    def route(t):
        idx, w = plain(t)
        n = math.ceil(share * idx.shape[0] - 1e-9)
        if n:
            k, e = idx.shape[1], moe.n_experts
            i = torch.arange(seen[0], seen[0] + n, device=idx.device).unsqueeze(1)
            j = torch.arange(k, device=idx.device).unsqueeze(0)
            idx[:n] = (i + j * max(1, e // k)) % e
            seen[0] += n
        return idx, w
    return route


def _hot_route(moe, expert: int, share: float):
    """moe.route with the first `share` of each batch's tokens sent to `expert` (choice 0),
    unless already routed there."""
    plain = moe.route

    def route(t):
        idx, w = plain(t)
        n = math.ceil(share * idx.shape[0] - 1e-9)
        if n:
            head = idx[:n]
            keep = (head == expert).any(1)
            head[~keep, 0] = expert
        return idx, w
    return route
