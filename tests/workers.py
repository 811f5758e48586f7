"""Rank bodies for tests. Spawned ranks import functions by module path, so they live here."""

from __future__ import annotations

import torch

from commprobe.collectives.comm import TorchComm
from commprobe.reference_impl.config import ModelConfig
from commprobe.reference_impl.model import build_model, greedy_generate
from commprobe.reference_impl.tp import apply_tp


def tp_generate(cfgs: list[ModelConfig], prompt: torch.Tensor, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each config: build the seeded model, shard it over the world, prefill + greedy decode."""
    comm = TorchComm("tp")
    out = []
    with torch.inference_mode():
        for cfg in cfgs:
            model = apply_tp(build_model(cfg, seed=0), comm)
            logits, toks = greedy_generate(model, prompt, steps)
            out.append((logits.clone(), toks.clone()))
    return out


# ---- collectives ----

def _rand(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Fresh random data per call and rank, never zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, generator=g) + 0.5
    sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
    return (x * sign).to(dtype)


def dda_allreduce_vs_gloo(sizes: list[int], dtypes: list[torch.dtype], pure: bool, slot_bytes: int) -> list[tuple]:
    """Allreduce the same fresh random inputs through gloo and DDA; return (n, dtype, max |diff|, max |ref|)."""
    import torch.distributed as dist

    from commprobe.collectives.dda import DDAComm

    rank = dist.get_rank()
    dda = DDAComm("tp", pure=pure, slot_bytes=slot_bytes)
    rows = []
    for i, n in enumerate(sizes):
        for j, dt in enumerate(dtypes):
            x = _rand(n, dt, seed=1000 * i + 10 * j + rank)
            ref = x.clone()
            dist.all_reduce(ref)
            got = dda.all_reduce(x.clone())
            rows.append((n, str(dt), (got.float() - ref.float()).abs().max().item(), ref.float().abs().max().item()))
    # Same answer on every rank, bit for bit (one-shot and two-shot both reduce in rank order).
    check = dda.all_reduce(_rand(4099, torch.float32, seed=77 + rank))
    gathered = [torch.empty_like(check) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, check)
    assert all(torch.equal(gathered[0], g) for g in gathered), "ranks disagree"
    dda.close()
    return rows


def dda_back_to_back(calls: int, pure: bool, slot_bytes: int) -> int:
    """Back-to-back allreduces, no barrier, sizes and data changing every call; exact integer sums."""
    import torch.distributed as dist

    from commprobe.collectives.dda import DDAComm

    rank, w = dist.get_rank(), dist.get_world_size()
    dda = DDAComm("tp", pure=pure, slot_bytes=slot_bytes, twoshot_min_bytes=16 << 10)
    sizes = [1, 3, 1000, 5003, 40000]  # one-shot, two-shot, and chunked past the slot
    bad = 0
    for i in range(calls):
        n = sizes[i % len(sizes)]
        base = (torch.arange(n, dtype=torch.float32) % 97) + (i % 1013) + 1
        got = dda.all_reduce(base * (rank + 1))
        if not torch.equal(got, base * (w * (w + 1) // 2)):
            bad += 1
    dda.close()
    return bad


def dda_other_ops(pure: bool, slot_bytes: int) -> dict:
    """all_gather, all_to_all (uneven and zero splits) and ring send/recv equal gloo's."""
    import torch.distributed as dist

    from commprobe.collectives.comm import TorchComm
    from commprobe.collectives.dda import DDAComm

    rank, w = dist.get_rank(), dist.get_world_size()
    dda, ref = DDAComm("ep", pure=pure, slot_bytes=slot_bytes), TorchComm("ep")
    out = {}
    x = _rand(37 * 5, torch.float32, seed=rank).view(37, 5)
    out["all_gather"] = torch.equal(dda.all_gather(x), ref.all_gather(x))
    # splits[src][dst] rows; zeros included, one pair large enough to need several rounds
    splits = [[(s * 7 + d * 3 + 1) % 5 * (s + 1) for d in range(w)] for s in range(w)]
    splits[0][w - 1] = 0
    splits[w - 1][0] = 3000
    for dt in (torch.float32, torch.bfloat16):
        rows = sum(splits[rank])
        x = _rand(rows * 16, dt, seed=50 + rank).view(rows, 16)
        in_s, out_s = splits[rank], [splits[s][rank] for s in range(w)]
        out[f"all_to_all_{dt}"] = torch.equal(dda.all_to_all(x, in_s, out_s), ref.all_to_all(x, in_s, out_s))
    # Rows a rank keeps for itself outnumber what it exchanges (its own copy spans every round
    # and beyond), and the reverse.
    for case, diag in (("own_large", 5000), ("own_none", 0)):
        sp = [[(s + d) % 3 + 1 for d in range(w)] for s in range(w)]
        for s in range(w):
            sp[s][s] = diag * 10 if slot_bytes >= 1 << 20 else diag
        sp[0][w - 1] = 20000 if case == "own_none" else sp[0][w - 1]  # 1.3 MB: several 256 KiB rounds
        rows = sum(sp[rank])
        x = _rand(rows * 16, torch.float32, seed=70 + rank).view(rows, 16)
        in_s, out_s = sp[rank], [sp[s][rank] for s in range(w)]
        out[f"all_to_all_{case}"] = torch.equal(dda.all_to_all(x, in_s, out_s), ref.all_to_all(x, in_s, out_s))
    for n in (1, 333, 100_000):
        x = _rand(n, torch.float16, seed=90 + rank)
        dst, src = (rank + 1) % w, (rank - 1) % w
        out[f"send_recv_{n}"] = torch.equal(dda.send_recv(x, dst, src), ref.send_recv(x, dst, src))
    dda.barrier()
    dda.close()
    return out


def dda_then_die(die_rank: int) -> None:
    """Set DDA up, run a few calls, then one rank is killed mid-stream."""
    import os
    import signal

    import torch.distributed as dist

    from commprobe.collectives.dda import SHM_PREFIX, DDAComm, shm_dir

    dda = DDAComm("tp", timeout=30)
    for i in range(5):
        dda.all_reduce(torch.ones(100))
    assert not list(shm_dir().glob(f"{SHM_PREFIX}-*{os.environ['COMMPROBE_SHM_TAG']}*")), "segment still named"
    if dist.get_rank() == die_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    for i in range(100000):
        dda.all_reduce(torch.ones(100))


def spans_under_profiler() -> list[str]:
    """Names of the commprobe spans recorded while a profiler runs around DDA and gloo calls."""
    from torch.profiler import ProfilerActivity, profile

    from commprobe.collectives.comm import TorchComm
    from commprobe.collectives.dda import DDAComm

    dda, gloo = DDAComm("tp"), TorchComm("ep")
    dda.all_reduce(torch.ones(8))  # outside the profiler: no span, no cost
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dda.all_reduce(torch.ones(1000, dtype=torch.bfloat16))
        gloo.all_to_all(torch.ones(4, 3), [2, 2], [2, 2])
        dda.send_recv(torch.ones(5), 1 - gloo.rank, 1 - gloo.rank)
    dda.close()
    return sorted({e.name for e in prof.events() if e.name.startswith("commprobe/")})


def delayed_allreduce_traces(out_dir: str, delay_s: float, calls: int) -> None:
    """Real profiled CPU runs of `calls` decode-like steps (matmul, then a gloo allreduce), three ways:
    `base` (no delay), `inside` (every rank sleeps `delay_s` inside the collective's span), and
    `before` (rank 1 sleeps `delay_s` before the collective, so rank 0 waits for it)."""
    import time
    from pathlib import Path

    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    from commprobe.collectives.spans import span_name

    rank = dist.get_rank()
    a = torch.randn(256, 256)
    for mode in ("base", "inside", "before"):
        d = Path(out_dir) / mode
        d.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(calls):
                with record_function(f"commprobe/decode[{i}]"):
                    x = (a @ a).sum(0)
                    if mode == "before" and rank == 1:
                        time.sleep(delay_s)
                    with record_function(span_name("tp", "all_reduce", x.numel() * 4, x.dtype, 2, "gloo")):
                        if mode == "inside":
                            time.sleep(delay_s)
                        dist.all_reduce(x)
        prof.export_chrome_trace(str(d / f"rank{rank}.trace.json"))


# ---- CP / EP / N-D meshes ----

def mesh_generate(mesh_kw: dict, runs: list[dict], prompt: torch.Tensor, steps: int, backend: str = "gloo") -> list[dict]:
    """For each run {cfg, variant, turn2}: shard over the mesh, prefill + greedy decode, then
    (turn2) a second prefill on a warm cache. Returns logits, tokens and the variant used."""
    from commprobe.collectives.mesh import Mesh, build_comms
    from commprobe.reference_impl.parallel import parallelize

    mesh = Mesh(**mesh_kw)
    comms = build_comms(mesh, backend)
    out = []
    with torch.inference_mode():
        for run in runs:
            model = parallelize(build_model(run["cfg"], seed=0), comms, run.get("variant", "auto"))
            logits, toks = greedy_generate(model, prompt, steps)
            res = {"logits": logits.clone(), "toks": toks.clone(), "variant": getattr(model, "last_variant", None)}
            turn2 = run.get("turn2")
            if turn2 is not None:
                model.setup_cache(prompt.shape[0], prompt.shape[1] + turn2.shape[1])
                model.prefill(prompt)
                res["turn2"] = model.prefill(turn2, start=prompt.shape[1]).clone()
                res["turn2_variant"] = getattr(model, "last_variant", None)
            out.append(res)
    for c in comms.values():
        if hasattr(c, "close"):
            c.close()
    return out


def dda_spin_choice() -> tuple[float, float]:
    """(spin of a 2-rank subgroup's DDA, spin of the whole job's) in this launch."""
    import torch.distributed as dist

    from commprobe.collectives.dda import DDAComm

    rank = dist.get_rank()
    pair = [rank - rank % 2, rank - rank % 2 + 1]
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    sub = DDAComm("tp", groups[rank // 2], pair)
    full = DDAComm("cp")
    out = (sub.spin_us, full.spin_us)
    sub.close()
    full.close()
    return out


def dda_wait_modes_time_out(modes: list[str], timeout: float) -> list[tuple[str, float, str]]:
    """Rank 1 sets up one DDA per wait mode, then never calls; rank 0 calls each in turn and
    returns (mode, seconds until it gave up, error) for each: every mode must honour the deadline."""
    import time

    import torch.distributed as dist

    from commprobe.collectives.dda import DDAComm, DDAError

    comms = [DDAComm("tp", wait=m, timeout=timeout) for m in modes]
    if dist.get_rank() != 0:
        time.sleep(timeout * len(modes) + 2)
        return []
    out = []
    for m, c in zip(modes, comms):
        t0 = time.perf_counter()
        try:
            c.all_reduce(torch.ones(64))
            err = ""
        except DDAError as e:
            err = str(e)
        out.append((m, time.perf_counter() - t0, err))
    return out


def dda_wait_modes_interrupted(modes: list[str], timeout: float, raising: bool) -> list[tuple[str, float, str]]:
    """Rank 1 sets up one DDA per wait mode, then never calls; rank 0 calls each in turn and sends
    itself SIGINT 0.3 s into the wait. Returns (mode, seconds from the signal until the call ended,
    what it raised) per mode. `raising`: Python's own Ctrl-C handler (KeyboardInterrupt); else a
    handler that only notes the signal (the call must still end, with a DDAError)."""
    import os
    import signal
    import threading
    import time

    import torch.distributed as dist

    from commprobe.collectives.dda import DDAComm

    # Python's own handler, as a terminal's foreground job has it: a job started in the background of a
    # non-interactive shell inherits SIGINT ignored, and Python then installs no handler at all
    signal.signal(signal.SIGINT, signal.default_int_handler if raising else (lambda *_: None))
    comms = [DDAComm("tp", wait=m, timeout=timeout) for m in modes]
    if dist.get_rank() != 0:
        return []  # gone: rank 0's waits need nothing of it (a DDA wait reads flags, not the peer)
    out = []
    for m, c in zip(modes, comms):
        sent = []
        timer = threading.Timer(0.3, lambda: (sent.append(time.perf_counter()), os.kill(os.getpid(), signal.SIGINT)))
        timer.start()
        try:
            c.all_reduce(torch.ones(64))
            err = "returned"
        except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt is the point
            err = f"{type(e).__name__}: {e}"
        ended = time.perf_counter()
        timer.join()
        out.append((m, ended - sent[0] if sent else -1.0, err))
    return out


def pin_placement() -> tuple[list[int], list[int]]:
    """The cores this rank may run on while a +pin variant runs, then while an unpinned one does."""
    import os

    import torch.distributed as dist

    from commprobe.probe.bench.sweep import _placer

    place = _placer(dist.get_rank())
    place("dda+pin")
    pinned = sorted(os.sched_getaffinity(0))
    place("dda")
    return pinned, sorted(os.sched_getaffinity(0))


def pinned_dda_allreduce_vs_gloo(*args):
    """dda_allreduce_vs_gloo with this rank bound to a core of its own (as a +pin variant runs)."""
    import torch.distributed as dist

    from commprobe.probe.bench.sweep import _placer

    _placer(dist.get_rank())("dda+pin")
    return dda_allreduce_vs_gloo(*args)


def a2a_uneven_trace(out: str, record_shapes: bool) -> list[list[int]]:
    """A plain torch job (no commprobe Comm): two `all_to_all_single` calls of uneven splits on the
    default group, traced by torch.profiler into OUT/rankR.json. Rank s sends (s + 1) * (d + 2)
    rows of 4 fp32 to rank d. Returns this rank's send splits in rows."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    rank, world = dist.get_rank(), dist.get_world_size()
    send = [(rank + 1) * (d + 2) for d in range(world)]
    recv = [(s + 1) * (rank + 2) for s in range(world)]
    x, y = torch.ones(sum(send), 4), torch.empty(sum(recv), 4)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=record_shapes) as p:
        for _ in range(2):
            dist.all_to_all_single(y, x, recv, send)
    p.export_chrome_trace(f"{out}/rank{rank}.json")
    return send
