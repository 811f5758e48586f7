"""One rank of a two-rank gloo job of a real torch.distributed producer under torch.profiler, for
the first-contact tests (tests/test_producers.py): what each API really records, with the
installed torch, analyzed as a user's trace would be.

    python tests/training_jobs.py KIND RANK OUT_DIR [PORT]      # PORT: deepspeed-tp's rendezvous

KIND: `ddp` (DistributedDataParallel training: forward, backward, SGD step), `fsdp` (FSDP2
`fully_shard` training), `dtensor-tp` (DTensor tensor parallelism, `parallelize_module` with
Colwise/Rowwise plans, inference forwards), `pipeline` (`torch.distributed.pipelining`, two stages,
GPipe schedule, inference), `deepspeed-tp` (DeepSpeed inference, `deepspeed.init_inference` with
tensor_parallel tp_size 2: AutoTP shards the MLP and reduces with its own shared-memory allreduce;
DS_FORWARDS forwards per step; rank 0 writes the job's summary.json beside the traces; needs the
`peers` extra), `no-dist` (no process group at all: a worker of a two-node torchrun
(two agents) that profiles without torch.distributed; its trace records no rank and is named
`<host>_<pid>` by tensorboard_trace_handler, as torch names it), `late-agent` (four ranks of a two-agent
torchrun job on gloo, `torch.distributed` from torchrun's environment: the second agent's ranks sleep
LATE_S before each allreduce, so they arrive last at every one). Every step is a `ProfilerStep#N` (profiler.step()).
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

STEPS = 3
WIDTH = 64


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.ReLU(), nn.Linear(4 * WIDTH, WIDTH))


def _train(model: nn.Module, prof) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, WIDTH)
    for _ in range(STEPS):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        prof.step()


def _infer(model, prof, forwards: int = 1) -> list[float]:
    """STEPS profiler steps of `forwards` inference forwards each; each step's seconds."""
    import time

    x = torch.randn(16, WIDTH)
    took = []
    with torch.no_grad():
        for _ in range(STEPS):
            t = time.perf_counter()
            for _ in range(forwards):
                model(x)
            took.append(time.perf_counter() - t)
            prof.step()
    return took


def _ddp(rank: int, prof) -> None:
    from torch.nn.parallel import DistributedDataParallel

    _train(DistributedDataParallel(_mlp(), bucket_cap_mb=0.01), prof)  # small buckets: several allreduces


def _fsdp(rank: int, prof) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    model = _mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _train(model, prof)


def _dtensor_tp(rank: int, prof) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    _infer(parallelize_module(_mlp(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()}), prof)


def _pipeline(rank: int, prof) -> None:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.manual_seed(0)
    stages = [nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.ReLU()), nn.Linear(4 * WIDTH, WIDTH)]
    stage = PipelineStage(stages[rank], rank, 2, torch.device("cpu"))
    sched = ScheduleGPipe(stage, n_microbatches=2)
    x = torch.randn(16, WIDTH)
    with torch.no_grad():
        for _ in range(STEPS):
            sched.step(x) if rank == 0 else sched.step()
            prof.step()


class _Block(nn.Module):
    """An MLP block with the projection names DeepSpeed's AutoTP recognises (down_proj: row-parallel)."""

    def __init__(self):
        super().__init__()
        self.up_proj, self.down_proj = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return self.down_proj(torch.relu(self.up_proj(x)))


class TinyMLPModel(nn.Module):
    """Two blocks; AutoTP finds its policy only for a class named ...Model (auto_tp.py supported())."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([_Block(), _Block()])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def _deepspeed_engine():
    """AutoTP's engine, built before the profiler starts (init_inference's broadcasts are start-up,
    not a step: a rank loading later makes the other wait ~0.1 s there)."""
    import deepspeed

    torch.manual_seed(0)
    return deepspeed.init_inference(TinyMLPModel(), tensor_parallel={"tp_size": 2}, dtype=torch.float32,
                                    replace_with_kernel_inject=False)


_ENGINE = []


def _deepspeed_tp(rank: int, prof) -> None:
    took = _infer(_ENGINE[0], prof, int(os.environ.get("DS_FORWARDS", "1")))
    if rank == 0:  # the job's own summary beside its traces, as jobs write one
        import json

        with open(os.path.join(sys.argv[3], "summary.json"), "w") as f:
            json.dump({"job": "deepspeed-autotp", "tp_size": 2, "steps": STEPS, "step_s": took}, f)


def _no_dist(rank: int, prof) -> None:
    x = torch.randn(WIDTH, WIDTH)
    for _ in range(STEPS):
        for _ in range(20):
            x = torch.tanh(x @ x)
        prof.step()


LATE_S = 0.008  # the late agent's sleep before each allreduce


def _late_agent(rank: int, prof) -> None:
    import time

    late = os.environ.get("GROUP_RANK") == "1"
    x = torch.randn(WIDTH, WIDTH)
    for _ in range(STEPS):
        for _ in range(4):
            x = torch.tanh(x @ x)
            if late:
                time.sleep(LATE_S)
            dist.all_reduce(x)
            x /= 4
        prof.step()


JOBS = {"late-agent": _late_agent, "ddp": _ddp, "fsdp": _fsdp, "dtensor-tp": _dtensor_tp, "pipeline": _pipeline, "deepspeed-tp": _deepspeed_tp,
        "no-dist": _no_dist}


def main() -> None:
    kind, out = sys.argv[1], sys.argv[3]
    rank = int(os.environ.get("RANK", sys.argv[2]))
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    if kind == "deepspeed-tp":  # DeepSpeed makes the process group; its shm allreduce needs LOCAL_SIZE
        os.environ.update(DS_ACCELERATOR="cpu", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_SIZE="2",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[4])
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        _ENGINE.append(_deepspeed_engine())
    elif kind == "late-agent":  # torchrun's environment (MASTER_ADDR, RANK, WORLD_SIZE)
        dist.init_process_group("gloo")
    elif kind != "no-dist":
        dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
    if kind in ("no-dist", "late-agent"):  # what torchrun told this worker, for the test's truth
        import json

        os.makedirs(f"{out}/workers", exist_ok=True)  # beside the traces, not among them
        with open(f"{out}/workers/{os.getpid()}.json", "w") as f:
            json.dump({k: os.environ.get(k) for k in ("RANK", "GROUP_RANK", "LOCAL_RANK")}, f)
    # one wait, one warm-up step, then STEPS recorded: work before the first recorded step is
    # launched outside it, as a real job's is
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=STEPS, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(out)) as prof:
        if kind == "late-agent":  # the profilers started apart: met in the warm-up step, which is not recorded
            dist.barrier()
        prof.step()  # the warm-up step's boundary
        JOBS[kind](rank, prof)
    if kind != "no-dist":
        dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
