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
import torch.autograd.profiler as _prof

from .launch import report_progress


@dataclass
class RunConfig:
    preset: str = "small"
    tp: int = 2
    batch: int = 1
    prompt_len: int = 128
    decode_steps: int = 32
    repeats: int = 3
    seed: int = 0
    checkpoint: str | None = None
    backends: list[str] = field(default_factory=lambda: ["gloo"])
    timeout: float = 300.0
    out_dir: str | None = None  # bundle root; traces are written only when set
    profile: bool = True

    @property
    def world_size(self) -> int:
        return self.tp

    def bundle_dir(self, backend: str) -> Path:
        root = Path(self.out_dir or ".")
        return root if len(self.backends) == 1 else root / backend

    def to_dict(self) -> dict:
        return asdict(self)


class TimedComm:
    """Wraps a Comm and adds up the wall time spent inside its allreduces.

    On CPU a collective blocks the calling thread, so this is the exposed allreduce time
    (transfer and waiting for the slowest rank together); two perf_counter reads a call.
    """

    def __init__(self, inner):
        self.inner = inner
        self.seconds = 0.0
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        t = time.perf_counter()
        out = self.inner.all_reduce(x)
        self.seconds += time.perf_counter() - t
        self.calls += 1
        return out


@dataclass
class RankTimings:
    """One rank's timings for one backend (seconds; lists hold every sample)."""

    rank: int
    backend: str
    batch: int
    ttft_s: list[float] = field(default_factory=list)
    ttit_s: list[float] = field(default_factory=list)
    prefill_allreduce_s: list[float] = field(default_factory=list)
    decode_allreduce_s: list[float] = field(default_factory=list)

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

    def summary(self) -> dict:
        return {"rank": self.rank, "ttft_median_ms": self.ttft_median_ms, "ttit_median_ms": self.ttit_median_ms,
                "ttit_p90_ms": self.ttit_p90_ms, "tokens_per_s": self.tokens_per_s,
                "decode_allreduce_share": self.decode_allreduce_share}


@dataclass
class RankResult:
    rank: int
    timings: dict[str, RankTimings]  # un-profiled, per backend
    profiled: dict[str, RankTimings]  # the recorded repetition, per backend
    tokens: list[list[int]]
    local_param_bytes: int
    traces: dict[str, str]  # backend -> trace path


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), without needing numpy here."""
    s = sorted(xs)
    if not s:
        raise ValueError("percentile of no samples")
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def load_model(cfg: RunConfig):
    from reference_impl.checkpoint import load_hf
    from reference_impl.config import get_preset
    from reference_impl.model import build_model

    if cfg.checkpoint:
        return load_hf(cfg.checkpoint)
    return build_model(get_preset(cfg.preset), seed=cfg.seed)


def make_prompt(vocab: int, batch: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, vocab, (batch, length), generator=g)


class _Phase:
    """`commprobe/prefill`, `commprobe/decode[i]` spans, opened only while a profiler runs."""

    def __init__(self, name: str):
        self.name = name
        self.rf = None

    def __enter__(self):
        if _prof._is_profiler_enabled:
            self.rf = torch.profiler.record_function(self.name)
            self.rf.__enter__()

    def __exit__(self, *exc):
        if self.rf is not None:
            self.rf.__exit__(*exc)


def _generate_once(model, comm: TimedComm, prompt: torch.Tensor, cfg: RunConfig, into: RankTimings | None):
    model.setup_cache(cfg.batch, cfg.prompt_len + cfg.decode_steps)
    comm.barrier()
    comm.seconds = 0.0
    t0 = time.perf_counter()
    with _Phase("commprobe/prefill"):
        tok = model.prefill(prompt)[:, -1].argmax(-1)
    ttft, pre = time.perf_counter() - t0, comm.seconds
    seq, steps, ars = [tok], [], []
    for i in range(cfg.decode_steps):
        comm.seconds = 0.0
        ts = time.perf_counter()
        with _Phase(f"commprobe/decode[{i}]"):
            tok = model.decode_step(tok, cfg.prompt_len + i)[:, -1].argmax(-1)
        steps.append(time.perf_counter() - ts)
        ars.append(comm.seconds)
        seq.append(tok)
    if into is not None:
        into.ttft_s.append(ttft)
        into.prefill_allreduce_s.append(pre)
        into.ttit_s.extend(steps)
        into.decode_allreduce_s.extend(ars)
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

    from collectives.backends import make_comm
    from reference_impl.tp import apply_tp, bind_tp_comm, local_param_bytes

    fault = os.environ.get("COMMPROBE_TEST_FAULT", "")  # test-only: "raise:R", "hang:R", "die:R", "trace:R"
    rank = dist.get_rank()
    report_progress("building model")
    comms = {}
    for b in cfg.backends:
        opts = {"timeout": cfg.timeout} if b == "dda" else {}
        comms[b] = TimedComm(make_comm(b, "tp", **opts))
    model = apply_tp(load_model(cfg), comms[cfg.backends[0]])
    prompt = make_prompt(model.cfg.vocab_size, cfg.batch, cfg.prompt_len, cfg.seed)
    timings = {b: RankTimings(rank, b, cfg.batch) for b in cfg.backends}
    profiled = {b: RankTimings(rank, b, cfg.batch) for b in cfg.backends}
    traces: dict[str, str] = {}
    tokens: list = []
    with torch.inference_mode():
        for rep in range(cfg.repeats + 1):  # repetition 0 is the warm-up
            for b in cfg.backends:
                bind_tp_comm(model, comms[b])
                _inject(fault, rank, "hang", "raise", "die")
                report_progress(f"repeat {rep} {b}")
                tokens = _generate_once(model, comms[b], prompt, cfg, timings[b] if rep else None)
        if cfg.out_dir and cfg.profile:
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            for b in cfg.backends:
                bind_tp_comm(model, comms[b])
                report_progress(f"profiling {b}")
                d = cfg.bundle_dir(b)
                d.mkdir(parents=True, exist_ok=True)
                path = d / f"rank{rank}.trace.json.gz"

                def on_ready(p, path=path):
                    _inject(fault, rank, "trace")
                    report_progress("writing trace")
                    write_trace(p, path)

                # One profiler warm-up step (not recorded), then one recorded repetition; repeat=1
                # so the schedule ends there and on_trace_ready sees exactly that repetition.
                prof = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
                               on_trace_ready=on_ready)
                meta = json.dumps({"rank": rank, "backend": b, "tp": cfg.tp, "preset": model.cfg.name})
                with prof:
                    for step in range(2):
                        if step == 1:  # metadata is accepted only while recording
                            prof.add_metadata_json("commprobe", meta)
                        _generate_once(model, comms[b], prompt, cfg, profiled[b] if step else None)
                        prof.step()
                traces[b] = str(path)
    for c in comms.values():
        if hasattr(c.inner, "close"):
            c.inner.close()
    return RankResult(rank, timings, profiled, tokens, local_param_bytes(model), traces)


def _inject(fault: str, rank: int, *kinds: str) -> None:
    if not fault:
        return
    kind, _, who = fault.partition(":")
    if kind not in kinds or (who and int(who) != rank):
        return
    if kind in ("raise", "trace"):
        raise RuntimeError(f"injected fault on rank {rank}")
    if kind == "hang":
        time.sleep(3600)
    if kind == "die":
        os._exit(9)
