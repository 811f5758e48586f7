"""The per-rank inference workload: build (or load) the model, shard it, time prefill and decode.

Timings are taken per rank with `time.perf_counter` around each phase: TTFT is the
prefill of the whole prompt up to the first sampled token, TTIT each later decode step.
A warm-up pass runs first so that allocator and thread-pool start-up are not measured.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass

import torch


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
    backend: str = "gloo"
    timeout: float = 300.0

    @property
    def world_size(self) -> int:
        return self.tp

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
    rank: int
    ttft_s: list[float]
    ttit_s: list[float]
    batch: int
    tokens: list[list[int]]
    local_param_bytes: int
    prefill_allreduce_s: list[float]
    decode_allreduce_s: list[float]
    backend: str = ""

    @property
    def decode_allreduce_share(self) -> float:
        """Share of decode wall time spent blocked in TP allreduces."""
        return sum(self.decode_allreduce_s) / sum(self.ttit_s)

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


def run_rank(cfg: RunConfig) -> RankTimings:
    """Body of one rank (spawned, or started by torchrun)."""
    from collectives.backends import make_comm
    from reference_impl.tp import apply_tp, local_param_bytes

    inner = make_comm(cfg.backend, "tp", timeout=cfg.timeout) if cfg.backend == "dda" else make_comm(cfg.backend, "tp")
    comm = TimedComm(inner)
    model = apply_tp(load_model(cfg), comm)
    prompt = make_prompt(model.cfg.vocab_size, cfg.batch, cfg.prompt_len, cfg.seed)
    total = cfg.prompt_len + cfg.decode_steps
    ttft, ttit, tokens, pre_ar, dec_ar = [], [], [], [], []
    fault = os.environ.get("COMMPROBE_TEST_FAULT", "")  # test-only fault injection: "raise:RANK" / "hang:RANK"
    with torch.inference_mode():
        for rep in range(cfg.repeats + 1):  # repetition 0 is the warm-up
            model.setup_cache(cfg.batch, total)
            comm.barrier()
            _inject(fault, comm.rank)
            comm.seconds = 0.0
            t0 = time.perf_counter()
            tok = model.prefill(prompt)[:, -1].argmax(-1)
            t1 = time.perf_counter()
            pre = comm.seconds
            steps, seq, ars = [], [tok], []
            for i in range(cfg.decode_steps):
                comm.seconds = 0.0
                ts = time.perf_counter()
                tok = model.decode_step(tok, cfg.prompt_len + i)[:, -1].argmax(-1)
                steps.append(time.perf_counter() - ts)
                ars.append(comm.seconds)
                seq.append(tok)
            if rep == 0:
                continue
            ttft.append(t1 - t0)
            pre_ar.append(pre)
            ttit.extend(steps)
            dec_ar.extend(ars)
            tokens = torch.stack(seq, 1).tolist()
    if hasattr(inner, "close"):
        inner.close()
    return RankTimings(comm.rank, ttft, ttit, cfg.batch, tokens, local_param_bytes(model), pre_ar, dec_ar, inner.backend)


def _inject(fault: str, rank: int) -> None:
    if not fault:
        return
    kind, _, who = fault.partition(":")
    if who and int(who) != rank:
        return
    if kind == "raise":
        raise RuntimeError(f"injected fault on rank {rank}")
    if kind == "hang":
        time.sleep(3600)
    if kind == "die":
        os._exit(9)
