"""A user's own torchrun job, serving each rank's records and stacks for `commprobe hang --live`
(tests/test_hang_live.py): the README's two lines, `_WorkerServer` on a socket per rank.

Env: LIVE_DIR (the sockets' directory), SLEEPER (a rank that sleeps before collective #3),
SLOW (a rank that sleeps 50 ms before each), STEPS (collectives, default many)."""

import os
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _WorkerServer

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # Flight Recorder on (gloo records too)
rank = int(os.environ["RANK"])
server = _WorkerServer(os.path.join(os.environ["LIVE_DIR"], f"rank-{rank}.sock"))
dist.init_process_group("gloo")
x = torch.ones(4)
end = time.monotonic() + 90  # a job that outlives its test stops by itself
for i in range(int(os.environ.get("STEPS", "100000"))):
    if time.monotonic() > end:
        break
    if rank == int(os.environ.get("SLEEPER", "-1")) and i == 2:
        time.sleep(60)  # THE SLEEP: asleep in Python before collective #3
    if rank == int(os.environ.get("SLOW", "-1")):
        time.sleep(0.05)
    dist.all_reduce(x)  # THE COLLECTIVE
    time.sleep(0.01)
