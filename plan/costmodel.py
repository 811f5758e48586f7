"""The cost model: predicted TTFT, TTIT and exposed communication for any TP x CP x EP layout.

Per phase (prefill, decode) and per layer, on one rank (ranks of a layout do the same work):

**Compute**, a roofline per operation group (QKV, attention, output projection, MLP or MoE):
    t = max(FLOPs / (peak * compute_eff), bytes / (mem_bw * mem_eff))
plus `layer_overhead_us` per layer (launch gaps on a GPU, the interpreter on a CPU).
FLOPs count 2 per multiply-add; TP divides heads and MLP width, CP divides the new tokens
(and, load-balanced, the causal attention pairs), EP divides the tokens routed to experts.
Bytes are the weights read once per forward (the touched experts only) and, in decode, the
whole KV cache read for the new token.

**Communication**, alpha-beta per collective and algorithm (n ranks, S bytes per rank, a
link of latency a and bandwidth B per device; across hosts the inter-host link):
    ring allreduce (NCCL, RCCL, gloo)   2(n-1) a + 2 (n-1)/n S / B
    DDA one-shot                          a + (n-1) S / B    (reads every peer's buffer at once)
    DDA two-shot                         2 a + 2 (n-1)/n S / B
    all-gather (S per rank)              (n-1) a + (n-1) S / B
    all-to-all (S sent per rank)          a + (n-1)/n S / B  (all peers at once)
    send/recv (one ring step)             a + S / B
TP: two allreduces per layer of the rank's tokens x dim, exposed (the next op needs them).
CP prefill: N-1 ring steps per layer moving K/V (pass-KV: 2 (T+P)/N x H_kv/TP x d) or Q
(pass-Q: P/N x H/TP x d, plus the partial outputs' all-to-all back); each step overlaps one
N-th of the attention, so only max(0, step - attention/N) is exposed. CP decode: one
all-gather of the partial outputs and LSEs. EP: dispatch and combine all-to-alls of the
rank's routed rows, and the all-gather that re-replicates tokens; exposed unless
`overlap_all_to_all` hides them behind the expert compute.

Ranks beyond a host's devices time-share them (a 2-core CPU running 4 ranks): compute,
overhead and collectives on that host take s = ranks/devices times longer, and every
collective call (s - 1) x extra(interval) more, where the profile measured it
(`[time_sharing]`, from `commprobe bench time-sharing`) against the interval between calls
(here the phase's time over its calls; held at the ends of the measured range): waking ranks
that sleep in a collective while the peer they wait for shares a core, and imbalance between
cores.
Memory bandwidth is per device on a GPU and, on a CPU (`mem_bw_scope = "host"`), one bus all
ranks share. Where a profile was calibrated on runs, ranks also wait for their slowest peer
at collectives: straggler x (compute + overhead) of the phase, spread over its collective
calls (run-to-run jitter of the work between calls; absent from a tight-loop sweep).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from commprobe.reference_impl.config import ModelConfig
from commprobe.reference_impl.cp_variant import choose_variant  # the rule the reference implementation uses

from .hardware import Hardware, Link, PlanError

AXES = ("tp", "cp", "ep")
ALLREDUCE_ALGORITHMS = ("ring", "dda", "dda-oneshot", "dda-twoshot")


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    cp: int = 1
    ep: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.ep


@dataclass(frozen=True)
class Options:
    allreduce: str = "ring"  # ring | dda (one-/two-shot, the faster) | dda-oneshot | dda-twoshot
    allreduce_scale: float = 1.0  # what-if: TP allreduce time x this
    overlap_all_to_all: bool = False
    cp_variant: str = "auto"  # auto | pass-kv | pass-q
    expert_imbalance: float = 1.0  # rows the busiest EP rank's experts get / the mean (router skew)


@dataclass(frozen=True)
class Workload:
    model: ModelConfig
    batch: int = 1
    prompt_len: int = 2048
    cached_len: int = 0  # tokens already in the KV cache (multi-turn prefill)
    decode_context: int | None = None  # context length of the decode step (default cached + prompt)
    full_logits: bool = False  # logits for every prompt token (the reference model) or the last only (serving)


@dataclass
class PhaseCost:
    total_us: float = 0.0
    compute_us: float = 0.0
    overhead_us: float = 0.0
    comm_us: dict[str, float] = field(default_factory=lambda: dict.fromkeys(AXES, 0.0))  # total communication
    exposed_us: dict[str, float] = field(default_factory=lambda: dict.fromkeys(AXES, 0.0))
    cp_variant: str | None = None
    work: Work | None = None  # what the compute time was made of (calibration reads it)

    @property
    def exposed_share(self) -> dict[str, float]:
        return {a: v / self.total_us if self.total_us else 0.0 for a, v in self.exposed_us.items()}

    def summary(self, threshold: float = 0.2) -> str:
        share = sum(self.exposed_share.values())
        if share > threshold:
            axis = max(self.exposed_us, key=self.exposed_us.get)
            return f"communication-bound ({share:.0%} exposed, mostly {axis.upper()})"
        return f"compute-bound ({share:.0%} exposed communication)"


@dataclass
class Prediction:
    layout: Layout
    options: Options
    prefill: PhaseCost
    decode: PhaseCost
    batch: int
    hosts: int

    @property
    def ttft_ms(self) -> float:
        return self.prefill.total_us / 1e3

    @property
    def ttit_ms(self) -> float:
        return self.decode.total_us / 1e3

    @property
    def tokens_per_s(self) -> float:
        return self.batch / (self.decode.total_us / 1e6)

    def to_dict(self) -> dict:
        def phase(p: PhaseCost) -> dict:
            d = {k: v for k, v in asdict(p).items() if k != "work"}
            return {**d, "exposed_share": p.exposed_share, "summary": p.summary()}

        return {"layout": asdict(self.layout), "options": asdict(self.options), "hosts": self.hosts,
                "ttft_ms": self.ttft_ms, "ttit_ms": self.ttit_ms, "tokens_per_s": self.tokens_per_s,
                "prefill": phase(self.prefill), "decode": phase(self.decode)}


# ---- collectives (µs) ----

def allreduce_us(n: int, nbytes: float, link: Link, algorithm: str) -> float:
    if n == 1:
        return 0.0
    a, bw = link.alpha_us, link.bw_GBps * 1e3
    ring = 2 * (n - 1) * a + 2 * (n - 1) / n * nbytes / bw
    one = a + (n - 1) * nbytes / bw
    two = 2 * a + 2 * (n - 1) / n * nbytes / bw
    return {"ring": ring, "dda-oneshot": one, "dda-twoshot": two, "dda": min(one, two)}[algorithm]


def all_gather_us(n: int, nbytes_each: float, link: Link) -> float:
    return 0.0 if n == 1 else (n - 1) * link.alpha_us + (n - 1) * nbytes_each / (link.bw_GBps * 1e3)


def all_to_all_us(n: int, nbytes_sent: float, link: Link) -> float:
    return 0.0 if n == 1 else link.alpha_us + (n - 1) / n * nbytes_sent / (link.bw_GBps * 1e3)


def collective_rows(hw: Hardware, worlds: tuple[int, ...] = (2, 4, 8), min_bytes: int = 256,
                    max_bytes: int = 256 << 20) -> list[dict]:
    """A hardware profile as a calibration (`commprobe plan collectives`): per backend, op, group
    size and power-of-four size, the alpha-beta time of this model, in the rows of a
    `bench collectives --json` sweep: the vendor library's ring ("nccl") and DDA (the better of
    one-shot and two-shot) allreduce, all-to-all and all-gather (the library's), inside a host.
    What `analyze --calibration` reads to give a trace's headroom on a machine you have no
    measurement of; a prediction from the profile's figures (its `sources`), not a measurement."""
    rows = []
    for n in worlds:
        if n > hw.devices_per_host:
            continue
        size = min_bytes
        while size <= max_bytes:
            for backend, op, t in (
                    ("nccl", "allreduce", allreduce_us(n, size, hw.link(False, "ring"), "ring")),
                    ("dda", "allreduce", allreduce_us(n, size, hw.link(False, "dda"), "dda")),
                    ("nccl", "all_to_all", all_to_all_us(n, size, hw.link(False))),
                    ("nccl", "all_gather", all_gather_us(n, size / n, hw.link(False)))):
                rows.append({"backend": backend, "op": op, "bytes": size, "world": n, "time_us": t,
                             "busbw_GBps": size / t / 1e3 * (2 * (n - 1) / n if op == "allreduce" else (n - 1) / n),
                             "source": f"hardware profile {hw.name} (alpha-beta model)"})
            size *= 4
    return rows


# ---- the model ----

def check(model: ModelConfig, layout: Layout, hw: Hardware) -> None:
    for axis in AXES:
        if getattr(layout, axis) < 1:
            raise PlanError(f"--{axis} must be >= 1")
    if model.n_kv_heads % layout.tp and layout.tp % model.n_kv_heads:
        raise PlanError(f"--tp {layout.tp} cannot split the {model.n_kv_heads} KV heads of {model.name}")
    if model.n_heads % layout.tp:
        raise PlanError(f"--tp {layout.tp} does not divide the {model.n_heads} heads of {model.name}")
    if layout.ep > 1 and not model.n_experts:
        raise PlanError(f"--ep {layout.ep} needs a mixture-of-experts model; {model.name} is dense")
    if layout.ep > 1 and model.n_experts % layout.ep:
        raise PlanError(f"--ep {layout.ep} does not divide the {model.n_experts} experts of {model.name}")


@dataclass
class Work:
    """What one rank computes in a phase: (FLOPs, bytes) per op group, and how often it runs."""

    groups: list[tuple[str, float, float, float]] = field(default_factory=list)  # name, flops, bytes, count

    def add(self, name: str, flops: float, nbytes: float, count: float = 1.0) -> None:
        self.groups.append((name, flops, nbytes, count))


def rates(hw: Hardware, world: int) -> tuple[float, float, float]:
    """(FLOP/µs, bytes/µs) one rank gets, and the time-sharing factor of its host.

    A rank has a device's compute unless a host's ranks outnumber its devices (then they
    time-share: a 2-core CPU running 4 ranks). Memory bandwidth is the device's (GPU HBM) or,
    with `mem_bw_scope = "host"`, the host's, shared by every rank on it (a CPU's memory bus)."""
    on_host = math.ceil(world / host_count(world, hw))
    share = time_share(world, hw)
    mem = hw.bytes_per_us / (on_host if hw.mem_bw_scope == "host" else 1)
    return hw.flops_per_us / share, mem, share


def time_share(world: int, hw: Hardware) -> float:
    """Ranks per device on a host (1 unless ranks outnumber the devices, as 4 ranks on 2 cores)."""
    return max(1.0, math.ceil(world / host_count(world, hw)) / hw.devices_per_host)


def host_count(world: int, hw: Hardware) -> int:
    """Hosts a run of `world` ranks spans: devices_per_host ranks each on GPUs; one on a CPU
    profile (`mem_bw_scope = "host"`), whose extra ranks time-share the cores instead."""
    return math.ceil(world / hw.devices_per_host) if hw.mem_bw_scope == "device" else 1


def group_time(flops: float, nbytes: float, flops_rate: float, mem_rate: float) -> float:
    """The roofline of one op group: bound by FLOPs or by bytes, whichever takes longer."""
    return max(flops / flops_rate, nbytes / mem_rate)


def _phase(w: Workload, lay: Layout, hw: Hardware, opt: Options, decode: bool) -> PhaseCost:
    m, b, e = w.model, w.batch, hw.dtype_bytes
    hd, tp, cp, ep = m.head_dim, lay.tp, lay.cp, lay.ep
    heads, kv = m.n_heads / tp, max(1.0, m.n_kv_heads / tp)  # KV heads replicate when TP > H_kv
    per_host = math.ceil(lay.world / host_count(lay.world, hw))
    hosts_span = {  # does the axis's group cross hosts? (TP innermost, then CP, then EP)
        "tp": tp > per_host, "cp": tp * cp > per_host, "ep": lay.world > per_host}
    ring_alg = "ring" if opt.allreduce == "ring" else "dda"
    link = {a: hw.link(hosts_span[a], ring_alg) for a in AXES}
    if decode:
        new = b  # one token per sequence, replicated over CP
        ctx = w.decode_context if w.decode_context is not None else w.cached_len + w.prompt_len
        attn_pairs = b * ctx / cp  # each CP rank attends to its shard of the cache
    else:
        new = b * w.prompt_len / cp
        p, t = w.prompt_len, w.cached_len
        attn_pairs = b * (p * t + p * (p + 1) / 2) / cp  # causal pairs, balanced over CP
        ctx = t + p
    L = m.n_layers
    flops_rate, mem_rate, share = rates(hw, lay.world)
    work = Work()
    # attention block
    qkv_w = m.dim * (heads + 2 * kv) * hd
    work.add("qkv", 2 * new * qkv_w, qkv_w * e, L)
    attn_flops = 4 * attn_pairs * heads * hd
    kv_bytes = 2 * (b * ctx / cp) * kv * hd * e if decode else 2 * new * kv * hd * e
    work.add("attention", attn_flops, kv_bytes, L)
    t_attn = group_time(attn_flops, kv_bytes, flops_rate, mem_rate)
    o_w = heads * hd * m.dim
    work.add("out_proj", 2 * new * o_w, o_w * e, L)
    # MLP or MoE
    t_expert = 0.0
    if m.n_experts:
        # Each EP rank routes a slice of the (replicated) tokens. The busiest rank sets the pace:
        # whole tokens and rows, at least one touched expert when any row arrives (decode at a
        # batch below EP leaves some ranks idle while one works).
        tok_ep = math.ceil(new / ep)
        rows = math.ceil(tok_ep * m.top_k * opt.expert_imbalance)
        touched = min(m.n_experts / ep, math.ceil((m.n_experts / ep) * (1 - (1 - 1 / m.n_experts) ** (new * m.top_k))))
        ew = 3 * m.dim * m.moe_intermediate_size / tp
        work.add("experts", 2 * rows * ew, touched * ew * e, L)
        t_expert = group_time(2 * rows * ew, touched * ew * e, flops_rate, mem_rate)
        work.add("shared_expert", 2 * tok_ep * ew, ew * e, L)
        work.add("router", 2 * tok_ep * m.dim * m.n_experts, m.dim * m.n_experts * e, L)
    else:
        mw = 3 * m.dim * m.intermediate_size / tp
        work.add("mlp", 2 * new * mw, mw * e, L)
    # output head, replicated: the last position per sequence (serving) or every prompt token
    head_tokens = b * w.prompt_len if (w.full_logits and not decode) else b
    work.add("head", 2 * head_tokens * m.dim * m.vocab_size, m.dim * m.vocab_size * e)
    # communication per layer
    tp_ar = 2 * allreduce_us(tp, new * m.dim * e, link["tp"], opt.allreduce) * opt.allreduce_scale
    cp_total = cp_exposed = 0.0
    c = PhaseCost()
    if cp > 1:
        if decode:
            cp_total = cp_exposed = all_gather_us(cp, b * heads * (hd + 1) * e, link["cp"])
        else:
            variant = opt.cp_variant if opt.cp_variant != "auto" else choose_variant(
                w.cached_len, w.prompt_len, m.n_heads, m.n_kv_heads)
            c.cp_variant = variant
            if variant == "pass-kv":
                step, back = link["cp"].time_us(2 * (b * ctx / cp) * kv * hd * e), 0.0
            else:
                step = link["cp"].time_us(new * heads * hd * e)
                back = all_to_all_us(cp, cp * new * heads * (hd + 1) * e, link["cp"])
            cp_total = (cp - 1) * step + back
            cp_exposed = (cp - 1) * max(0.0, step - t_attn / cp) + back  # each step hides behind 1/N of attention
    ep_total = ep_exposed = 0.0
    if m.n_experts and ep > 1:
        rows_bytes = (new / ep) * m.top_k * m.dim * e
        a2a = 2 * all_to_all_us(ep, rows_bytes, link["ep"]) + link["ep"].alpha_us  # dispatch, combine, counts
        gather = all_gather_us(ep, (new / ep) * m.dim * e, link["ep"])
        ep_total = a2a + gather
        ep_exposed = (max(0.0, a2a - t_expert) if opt.overlap_all_to_all else a2a) + gather
    c.work = work
    c.compute_us = sum(n * group_time(f, by, flops_rate, mem_rate) for _, f, by, n in work.groups)
    c.overhead_us = L * hw.overhead_us(decode) * share
    total = {"tp": tp_ar, "cp": cp_total, "ep": ep_total}
    exposed = {"tp": tp_ar, "cp": cp_exposed, "ep": ep_exposed}
    c.comm_us = {a: L * total[a] * share for a in AXES}
    c.exposed_us = {a: L * exposed[a] * share for a in AXES}
    # collective calls per layer; each pays the time-sharing extra when ranks outnumber devices
    calls = {"tp": 2 * (tp > 1),
             "cp": (1 if decode else (cp - 1) + (c.cp_variant == "pass-q")) * (cp > 1),
             "ep": 4 * (bool(m.n_experts) and ep > 1)}  # dispatch, combine, counts, re-replicating gather
    n_calls = L * sum(calls.values())

    def charge(per_call_us: float) -> None:  # exposed µs at every collective call of the phase
        for a in AXES:
            c.comm_us[a] += L * calls[a] * per_call_us
            c.exposed_us[a] += L * calls[a] * per_call_us

    if n_calls and hw.straggler(decode):  # waits for the slowest peer grow with the work between calls
        charge(hw.straggler(decode) * (c.compute_us + c.overhead_us) / n_calls)
    if share > 1 and n_calls and hw.time_sharing:
        interval = (c.compute_us + c.overhead_us + sum(c.exposed_us.values())) / n_calls
        charge((share - 1) * hw.time_share_extra_us(interval))
    c.total_us = c.compute_us + c.overhead_us + sum(c.exposed_us.values())
    return c


def predict(w: Workload, lay: Layout, hw: Hardware, opt: Options = Options()) -> Prediction:
    check(w.model, lay, hw)
    hosts = host_count(lay.world, hw)
    return Prediction(lay, opt, _phase(w, lay, hw, opt, False), _phase(w, lay, hw, opt, True), w.batch, hosts)
