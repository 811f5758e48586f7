"""The per-rank inference workload: build (or load) the model, shard it, time and profile it.

Un-profiled timings come first: one warm-up repetition, then `repeats` repetitions of
prefill + decode, backends interleaved within each repetition (A B A B) so that machine
drift hits them alike. Then, per backend, torch.profiler records one more repetition, after
a profiler warm-up step that the schedule leaves out of the trace. TTFT is prefill of the
whole prompt up to the first sampled token; TTIT each later decode step.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from commprobe.collectives.spans import span
from commprobe.common.bundle import trace_name
from commprobe.common.host import host_name

from .faults import faulty, inject, perf_fault, perturb
from .forensics import register_groups
from .launch import report_progress

DEVICES = ("auto", "cpu", "cuda")


@dataclass
class RunConfig:
    """One `commprobe profile` run. Checked when built (`__post_init__`, `model_config`), so
    the CLI, the tests and the benchmark scripts get the same one-line ValueError for bad input."""

    preset: str = "small"
    """Model preset (reference_impl/config.py): tiny, small, moe-tiny, moe-small, llama3-*."""
    tp: int = 2
    """Tensor-parallel degree: ranks per TP group."""
    cp: int = 1
    """Context-parallel degree: the prompt sharded over a ring of this many ranks."""
    ep: int = 1
    """Expert-parallel degree (MoE presets only)."""
    cp_variant: str = "auto"
    """Ring attention: auto, pass-kv or pass-q (reference_impl/cp_variant.py)."""
    batch: int = 1
    """Sequences per batch."""
    prompt_len: int = 128
    """Prompt tokens prefilled per sequence."""
    decode_steps: int = 32
    """Decode steps per repetition (`--steps`)."""
    repeats: int = 3
    """Un-profiled repetitions of prefill + decode, after one warm-up."""
    seed: int = 0
    """Seed of the random weights and the prompt: every rank builds the same model."""
    checkpoint: str | None = None
    """An HF-format directory (config.json + safetensors) instead of a preset's random weights."""
    backends: list[str] = field(default_factory=lambda: ["gloo"])
    """Collective backends, in the order their repetitions interleave; 'auto' and a
    comma-separated string are resolved here (collectives.backends.resolve_backends)."""
    timeout: float = 300.0
    """Seconds before a rank that has not finished is called hung."""
    out_dir: str | None = None
    """Bundle root; traces are written only when set."""
    profile: bool = True
    """Record profiled repetitions after the timed ones."""
    profiled_repeats: int = 1
    """Repetitions the profiler records (after its one warm-up): more windows of each phase,
    for a phase with one window a repetition (prefill) to be measured more than once."""
    device: str = "auto"
    """Where the model runs: auto (a GPU per rank when CUDA/ROCm is present), cpu, cuda."""

    def __post_init__(self) -> None:
        for flag, v in (("--steps", self.decode_steps), ("--prompt-len", self.prompt_len), ("--batch", self.batch),
                        ("--repeats", self.repeats), ("profiled_repeats", self.profiled_repeats)):
            if v < 1:
                raise ValueError(f"{flag} must be >= 1, got {v}")
        if self.device not in DEVICES:
            raise ValueError(f"--device must be auto, cpu or cuda, got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda, but torch sees no CUDA/ROCm device (a CPU build of torch, or no driver)")
        if self.timeout <= 0:
            raise ValueError(f"--timeout must be > 0, got {self.timeout}")
        perf_fault()  # a malformed COMMPROBE_FAULT is one line before any rank starts
        from commprobe.collectives.backends import resolve_backends

        self.backends = resolve_backends(self.backends)

    def model_config(self):
        """The model's shapes (preset or checkpoint), checked against the layout and the lengths."""
        from commprobe.reference_impl.config import get_preset
        from commprobe.reference_impl.cp import check_cp
        from commprobe.reference_impl.ep import check_ep
        from commprobe.reference_impl.tp import check_tp

        if self.checkpoint:
            from commprobe.reference_impl.checkpoint import config_from_hf

            mcfg = config_from_hf(Path(self.checkpoint))
        else:
            mcfg = get_preset(self.preset)
        check_tp(mcfg, self.tp)
        check_cp(self.cp, self.cp_variant)
        check_ep(mcfg, self.ep)
        if self.prompt_len + self.decode_steps > mcfg.max_seq_len:
            raise ValueError(f"--prompt-len + --steps = {self.prompt_len + self.decode_steps} exceeds the model's "
                             f"max_seq_len {mcfg.max_seq_len}")
        return mcfg

    @property
    def mesh(self):
        from commprobe.collectives.mesh import Mesh

        return Mesh(tp=self.tp, cp=self.cp, ep=self.ep)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.ep

    def bundle_dir(self, backend: str) -> Path:
        root = Path(self.out_dir or ".")
        return root if len(self.backends) == 1 else root / backend

    def to_dict(self) -> dict:
        return asdict(self)


class TimedComm:
    """Wraps one axis's Comm and adds up the wall time spent inside its collectives.

    On CPU a collective blocks the calling thread, so this is the exposed communication time
    (transfer and waiting for the slowest rank together); for an async ring step only the
    wait counts, i.e. what compute did not hide. Two perf_counter reads a call.
    """

    def __init__(self, inner):
        self.inner = inner
        self.seconds = 0.0
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _timed(self, fn, *args):
        t = time.perf_counter()
        out = fn(*args)
        self.seconds += time.perf_counter() - t
        self.calls += 1
        return out

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self._timed(self.inner.all_reduce, x)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return self._timed(self.inner.all_gather, x)

    def all_to_all(self, x: torch.Tensor, in_splits: list[int], out_splits: list[int]) -> torch.Tensor:
        return self._timed(self.inner.all_to_all, x, in_splits, out_splits)

    def send_recv(self, x: torch.Tensor, dst: int, src: int) -> torch.Tensor:
        return self._timed(self.inner.send_recv, x, dst, src)

    def send_recv_start(self, x: torch.Tensor, dst: int, src: int) -> "_TimedWait":
        return _TimedWait(self, self._timed(self.inner.send_recv_start, x, dst, src))


class _TimedWait:
    """An in-flight ring step whose wait adds to its TimedComm's time."""

    def __init__(self, comm: TimedComm, pending):
        self.comm, self.pending = comm, pending

    def wait(self) -> torch.Tensor:
        return self.comm._timed(self.pending.wait)


@dataclass
class RankTimings:
    """One rank's timings for one backend (seconds; lists hold every sample)."""

    rank: int
    backend: str
    batch: int
    ttft_s: list[float] = field(default_factory=list)
    ttit_s: list[float] = field(default_factory=list)
    # Blocked communication time per phase sample, per axis (tp, cp, ep).
    prefill_comm_s: dict[str, list[float]] = field(default_factory=dict)
    decode_comm_s: dict[str, list[float]] = field(default_factory=dict)
    # MoE: tokens this rank routed to each expert, per phase and layer, in one repetition (the
    # same prompt every repetition, so one is enough); {} for dense models.
    routed_tokens: dict[str, list[list[int]]] = field(default_factory=dict)

    @property
    def prefill_allreduce_s(self) -> list[float]:
        return self.prefill_comm_s.get("tp", [0.0] * len(self.ttft_s))

    @property
    def decode_allreduce_s(self) -> list[float]:
        return self.decode_comm_s.get("tp", [0.0] * len(self.ttit_s))

    @property
    def ttft_median_ms(self) -> float:
        return statistics.median(self.ttft_s) * 1e3

    @property
    def ttit_median_ms(self) -> float:
        return statistics.median(self.ttit_s) * 1e3

    @property
    def ttit_p90_ms(self) -> float:
        return percentile(self.ttit_s, 90) * 1e3

    @property
    def tokens_per_s(self) -> float:
        return self.batch / statistics.median(self.ttit_s)

    @property
    def decode_allreduce_share(self) -> float:
        """Share of decode wall time spent blocked in TP allreduces."""
        return sum(self.decode_allreduce_s) / sum(self.ttit_s)

    def comm_share(self, phase: str, axis: str) -> float:
        """Share of a phase's wall time (prefill or decode) blocked in one axis's communication."""
        comm = (self.prefill_comm_s if phase == "prefill" else self.decode_comm_s).get(axis, [])
        total = sum(self.ttft_s if phase == "prefill" else self.ttit_s)
        return sum(comm) / total if total else 0.0

    def summary(self) -> dict:
        axes = sorted(set(self.prefill_comm_s) | set(self.decode_comm_s))
        return {"rank": self.rank, "ttft_median_ms": self.ttft_median_ms, "ttit_median_ms": self.ttit_median_ms,
                "ttit_p90_ms": self.ttit_p90_ms, "tokens_per_s": self.tokens_per_s,
                "decode_allreduce_share": self.decode_allreduce_share,
                "prefill_comm_share": {a: self.comm_share("prefill", a) for a in axes},
                "decode_comm_share": {a: self.comm_share("decode", a) for a in axes}}


@dataclass
class RankResult:
    rank: int
    timings: dict[str, RankTimings]  # un-profiled, per backend
    profiled: dict[str, RankTimings]  # the recorded repetition, per backend
    tokens: list[list[int]]
    local_param_bytes: int
    traces: dict[str, str]  # backend -> trace path
    host: str = ""  # common.host.host_name() of the process that ran the rank


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), without needing numpy here."""
    s = sorted(xs)
    if not s:
        raise ValueError("percentile of no samples")
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def load_model(cfg: RunConfig, device: str = "cpu"):
    from commprobe.reference_impl.checkpoint import load_hf
    from commprobe.reference_impl.config import get_preset
    from commprobe.reference_impl.model import build_model

    if cfg.checkpoint:
        return load_hf(cfg.checkpoint).to(device)
    return build_model(get_preset(cfg.preset), seed=cfg.seed, device=device)


def rank_device(cfg: RunConfig, rank: int) -> str:
    """This rank's device: its own GPU (LOCAL_RANK under torchrun, else rank modulo the GPUs) or the CPU."""
    want = cfg.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        raise RuntimeError("--device cuda, but torch sees no CUDA/ROCm device")
    local = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
    torch.cuda.set_device(local)
    return f"cuda:{local}"


def make_prompt(vocab: int, batch: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, vocab, (batch, length), generator=g)


def _generate_once(model, comms: dict[str, TimedComm], prompt: torch.Tensor, cfg: RunConfig,
                   into: RankTimings | None):
    """One prefill + decode. On a GPU the clock reads wait for the device (synchronize), so
    TTFT/TTIT are real; the per-collective blocked times of TimedComm then count only the host
    side of asynchronous NCCL calls: on a GPU, attribute communication from the traces."""
    import torch.distributed as dist

    sync = torch.cuda.synchronize if prompt.is_cuda else (lambda: None)

    def reset() -> None:
        for c in comms.values():
            c.seconds = 0.0

    def taken() -> dict[str, float]:
        return {a: c.seconds for a, c in comms.items()}

    from commprobe.reference_impl.moe import MoE

    inner = getattr(model, "model", model)  # CP wraps the Transformer
    moes = [m for m in inner.modules() if isinstance(m, MoE)] if into is not None and not into.routed_tokens else []

    def routed(start: bool) -> list[list[int]]:
        out = [m.routed_counts.tolist() for m in moes if m.routed_counts is not None]
        for m in moes:
            m.routed_counts = torch.zeros(m.n_experts, dtype=torch.long, device=m.router.weight.device) if start else None
        return out

    model.setup_cache(cfg.batch, cfg.prompt_len + cfg.decode_steps)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
    reset()
    routed(True)
    sync()
    t0 = time.perf_counter()
    with span("commprobe/prefill"):  # phase markers: `commprobe/prefill`, `commprobe/decode[i]`
        tok = model.prefill(prompt)[:, -1].argmax(-1)
    sync()
    ttft, pre = time.perf_counter() - t0, taken()
    routes = {"prefill": routed(True)}
    seq, steps, per_step = [tok], [], []
    for i in range(cfg.decode_steps):
        reset()
        ts = time.perf_counter()
        with span(f"commprobe/decode[{i}]"):
            tok = model.decode_step(tok, cfg.prompt_len + i)[:, -1].argmax(-1)
        sync()
        steps.append(time.perf_counter() - ts)
        per_step.append(taken())
        seq.append(tok)
    routes["decode"] = routed(False)
    if into is not None:
        if moes:
            into.routed_tokens = routes
        into.ttft_s.append(ttft)
        into.ttit_s.extend(steps)
        for a in comms:
            into.prefill_comm_s.setdefault(a, []).append(pre[a])
            into.decode_comm_s.setdefault(a, []).extend(s[a] for s in per_step)
    return torch.stack(seq, 1).tolist()


class TraceWriteError(OSError):
    pass


def write_trace(prof, path: Path) -> None:
    """Export the Kineto trace gzip-compressed; a failed write (disk full) is an error, never a stub."""
    tmp = path.with_name(f".{path.name}.json.tmp")
    try:
        prof.export_chrome_trace(str(tmp))
        with open(tmp, "rb") as src, gzip.open(path, "wb", compresslevel=3) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except OSError as e:
        for p in (tmp, path):
            try:
                if not p.is_symlink():
                    p.unlink(missing_ok=True)
            except OSError:
                pass
        why = os.strerror(e.errno) if e.errno else str(e)
        raise TraceWriteError(e.errno or errno.EIO, f"writing {path.name} failed: {why}") from None
    finally:
        tmp.unlink(missing_ok=True)


def run_rank(cfg: RunConfig) -> RankResult:
    """Body of one rank (spawned, or started by torchrun)."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    from commprobe.collectives.mesh import build_comms
    from commprobe.reference_impl.parallel import bind_comms, parallelize
    from commprobe.reference_impl.tp import local_param_bytes

    rank = dist.get_rank()
    device = rank_device(cfg, rank)
    report_progress("building model")
    comms: dict[str, dict[str, TimedComm]] = {}
    for b in cfg.backends:
        comms[b] = faulty({a: TimedComm(c) for a, c in build_comms(cfg.mesh, b, timeout=cfg.timeout).items()}, rank)
        register_groups(comms[b])  # for hang forensics: which process group is which axis
    model = parallelize(load_model(cfg, device), comms[cfg.backends[0]], cfg.cp_variant)
    comms = perturb(model, comms, rank, cfg.seed)  # COMMPROBE_FAULT's performance faults, if any
    prompt = make_prompt(model.cfg.vocab_size, cfg.batch, cfg.prompt_len, cfg.seed).to(device)
    timings = {b: RankTimings(rank, b, cfg.batch) for b in cfg.backends}
    profiled = {b: RankTimings(rank, b, cfg.batch) for b in cfg.backends}
    traces: dict[str, str] = {}
    tokens: list = []
    with torch.inference_mode():
        for rep in range(cfg.repeats + 1):  # repetition 0 is the warm-up
            for b in cfg.backends:
                bind_comms(model, comms[b])
                inject(rank, "hang", "raise", "die")
                report_progress(f"repeat {rep} {b}")
                tokens = _generate_once(model, comms[b], prompt, cfg, timings[b] if rep else None)
        if cfg.out_dir and cfg.profile:
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            for b in cfg.backends:
                bind_comms(model, comms[b])
                report_progress(f"profiling {b}")
                d = cfg.bundle_dir(b)
                d.mkdir(parents=True, exist_ok=True)
                path = d / trace_name(rank)

                def on_ready(p, path=path):
                    inject(rank, "trace")
                    report_progress("writing trace")
                    write_trace(p, path)

                # One profiler warm-up step (not recorded), then the recorded repetitions; repeat=1
                # so the schedule ends there and on_trace_ready sees exactly those repetitions.
                active = cfg.profiled_repeats
                prof = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=active, repeat=1),
                               on_trace_ready=on_ready)
                meta = json.dumps({"rank": rank, "backend": b, "tp": cfg.tp, "cp": cfg.cp, "ep": cfg.ep,
                                   "preset": model.cfg.name})
                with prof:
                    for step in range(1 + active):
                        if step == 1:  # metadata is accepted only while recording
                            prof.add_metadata_json("commprobe", meta)
                        _generate_once(model, comms[b], prompt, cfg, profiled[b] if step else None)
                        prof.step()
                traces[b] = str(path)
    for per_axis in comms.values():
        for c in per_axis.values():
            if hasattr(c.inner, "close"):
                c.inner.close()
    weights = local_param_bytes(getattr(model, "model", model))
    return RankResult(rank, timings, profiled, tokens, weights, traces, host_name())
