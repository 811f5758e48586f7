"""Flight Recorder dumps of a 16-rank NCCL MoE training job, built by simulating it, with its truth.

The shape of the real job the issue describes (FR format 2.9, NCCL 2.27): 16 ranks as PP 4 x DP 2
x TP 2 (rank = 4 * stage + 2 * dp + tp), EP 4 over each stage's ranks, a world group; groups of 2,
4 and 16 ranks. Per micro-batch each stage receives from the one before (p2p), gathers its
sequence shards (TP `_all_gather_base`), dispatches and combines its tokens (EP `all_to_all`,
uneven splits: each rank sends what its tokens routed, so input sizes differ by rank), scatters
(TP `_reduce_scatter_base`) and sends to the next stage; a step ends with a DP all-reduce and a
world all-reduce of the loss.

The simulation is the truth: hosts enqueue ahead of their device (at most `DEPTH` ops), block on
the routing counts after each dispatch (`.tolist()` of the split sizes, as MoE dispatchers do);
each device runs its ops in order, and a collective completes when every member has it at the
head of its queue. Faults:
- `device`: from a chosen EP dispatch on, the faulted ranks' records stop completing (their GPU
  stopped completing work as their watchdog sees it) while their device still runs what was
  already enqueued, so their peers complete a few sequence numbers further; their hosts block at
  the next sync and never enqueue the next collective.
- `host`: the faulted ranks' hosts stop before a chosen EP dispatch (a rank holding the GIL);
  `dumpless` additionally writes no dump for them.
Each rank's ring is trimmed to its last 3-43 entries, as the producer of the real dumps did; its
pg_status covers every group it enqueued on.
"""

from __future__ import annotations

import json
import pickle
import random
from dataclasses import dataclass, field
from pathlib import Path

WORLD, PP, DP, TP = 16, 4, 2, 2
DEPTH = 6  # how far a host runs ahead of its device, in ops
HIDDEN = 5120
T0 = 1_760_000_000_000_000_000


def layout() -> dict[str, dict]:
    """Group name -> {desc, ranks}, in torch's creation order (names "0", "1", ...)."""
    groups = {"0": {"desc": "default_pg", "ranks": list(range(WORLD))}}

    def add(desc, ranks):
        groups[str(len(groups))] = {"desc": desc, "ranks": sorted(ranks)}

    for s in range(PP):
        for d in range(DP):
            add("tp", [4 * s + 2 * d, 4 * s + 2 * d + 1])
    for s in range(PP):
        for t in range(TP):
            add("dp", [4 * s + t, 4 * s + 2 + t])
    for s in range(PP):
        add("ep", [4 * s + i for i in range(4)])
    for d in range(DP):
        for t in range(TP):
            add("pp", [2 * d + t + 4 * s for s in range(PP)])
    return groups


def group_of(groups: dict, desc: str, rank: int) -> str:
    return next(n for n, g in groups.items() if g["desc"] == desc and rank in g["ranks"])


@dataclass
class Op:
    pg: str
    name: str  # profiling name without the "nccl:" prefix
    sizes: list = field(default_factory=list)
    out_sizes: list = field(default_factory=list)
    peer: int | None = None  # p2p: the peer's global rank
    sync_after: bool = False  # the host waits for it (routing counts of a dispatch)
    frame: tuple = ("forward", "/job/megatron/core/transformer/layer.py", 120)
    dispatch: int = -1  # the index of an EP dispatch, counted per rank


def programs(groups: dict, micro: int, rng: random.Random) -> dict[int, list[Op]]:
    """Each rank's ops in the order its host issues them."""
    progs: dict[int, list[Op]] = {r: [] for r in range(WORLD)}
    n_disp = {r: 0 for r in range(WORLD)}
    for _step in range(2):
        for _mb in range(micro):
            for s in range(PP):
                stage = [4 * s + i for i in range(4)]
                split = {r: [rng.randint(980, 1070) for _ in stage] for r in stage}  # rows r sends to each peer
                for i, r in enumerate(stage):
                    tp, ep, pp = (group_of(groups, k, r) for k in ("tp", "ep", "pp"))
                    if s > 0:
                        progs[r].append(Op(pp, f"recv {s}<-{s - 1}", [[1024, HIDDEN]], peer=r - 4,
                                           frame=("recv_forward", "/job/megatron/core/pipeline_parallel/p2p.py", 310)))
                    progs[r].append(Op(tp, "_all_gather_base", [[512, HIDDEN]], [[1024, HIDDEN]],
                                       frame=("gather", "/job/megatron/core/tensor_parallel/mappings.py", 88)))
                    rows_in = sum(split[r])
                    rows_out = sum(split[q][i] for q in stage)
                    progs[r].append(Op(ep, "all_to_all", [[rows_in, HIDDEN]], [[rows_out, HIDDEN]], sync_after=True,
                                       frame=("dispatch", "/job/megatron/core/transformer/moe/token_dispatcher.py", 311),
                                       dispatch=n_disp[r]))
                    n_disp[r] += 1
                    progs[r].append(Op(ep, "all_to_all", [[rows_out, HIDDEN]], [[rows_in, HIDDEN]],
                                       frame=("combine", "/job/megatron/core/transformer/moe/token_dispatcher.py", 402)))
                    progs[r].append(Op(tp, "_reduce_scatter_base", [[1024, HIDDEN]], [[512, HIDDEN]],
                                       frame=("scatter", "/job/megatron/core/tensor_parallel/mappings.py", 131)))
                    if s < PP - 1:
                        progs[r].append(Op(pp, f"send {s}->{s + 1}", [[1024, HIDDEN]], peer=r + 4,
                                           frame=("send_forward", "/job/megatron/core/pipeline_parallel/p2p.py", 298)))
        for r in range(WORLD):
            progs[r].append(Op(group_of(groups, "dp", r), "allreduce", [[4_194_304]],
                               frame=("finish_grad_sync", "/job/megatron/core/distributed/ddp.py", 260)))
            progs[r].append(Op("0", "allreduce", [[1]], sync_after=True,
                               frame=("reduce_loss", "/job/megatron/training/training.py", 702)))
    return progs


@dataclass
class Truth:
    fault: str
    faulted: list[int]
    group: str  # the hung collective's group
    seq: int  # the collective the faulted ranks never entered
    op: str
    peers_completed: int  # the last sequence number the healthy members completed there
    faulted_completed: dict[int, int]  # the last the faulted ranks' records completed there


def simulate(fault: str = "device", faulted=(5, 6), at_dispatch: int = 5, micro: int = 3, seed: int = 0):
    """Run the job to its stop; the per-rank records (entries, pg_status) and the truth."""
    rng = random.Random(seed)
    groups = layout()
    progs = programs(groups, micro, rng)
    n = {r: 0 for r in range(WORLD)}  # ops enqueued
    done = {r: 0 for r in range(WORLD)}  # ops the device completed (in order)
    seen = {r: 0 for r in range(WORLD)}  # ops whose completion the rank's records show
    freeze = {r: None for r in range(WORLD)}  # first op index whose completion is never seen
    seq = {r: {} for r in range(WORLD)}  # pg -> collective seq counter
    recs = {r: [] for r in range(WORLD)}
    tick = 0
    while True:
        tick += 1
        moved = False
        for r in range(WORLD):  # hosts enqueue
            while n[r] < len(progs[r]) and n[r] - done[r] < DEPTH:
                op = progs[r][n[r]]
                prev = progs[r][n[r] - 1] if n[r] else None
                if prev is not None and prev.sync_after and seen[r] < n[r]:
                    break  # blocked on the previous op's result
                if r in faulted and op.dispatch == at_dispatch:
                    if fault == "device" and freeze[r] is None:
                        freeze[r] = n[r]
                    elif fault != "device":
                        break  # the host stopped here
                if op.peer is None:
                    seq[r][op.pg] = seq[r].get(op.pg, 0) + 1
                recs[r].append({"op": op, "seq": seq[r].get(op.pg, 0) if op.peer is None else -1,
                                "created": T0 + tick * 1_000_000 + r, "index": n[r]})
                n[r] += 1
                moved = True
        for r in range(WORLD):  # devices complete what every participant has at its head
            while done[r] < n[r]:
                op = progs[r][done[r]]
                parts = [op.peer] if op.peer is not None else groups[op.pg]["ranks"]
                ok = True
                for q in parts:
                    if q == r:
                        continue
                    if done[q] >= n[q]:
                        ok = False
                        break
                    h = progs[q][done[q]]
                    same = (h.pg == op.pg and h.peer == r) if op.peer is not None else \
                        (h.pg == op.pg and recs[q][done[q]]["seq"] == recs[r][done[r]]["seq"])
                    if not same:
                        ok = False
                        break
                if not ok:
                    break
                for q in {r, *parts}:
                    recs[q][done[q]]["completed"] = T0 + tick * 1_000_000 + 500
                    done[q] += 1
                moved = True
        for r in range(WORLD):
            seen[r] = done[r] if freeze[r] is None else min(done[r], freeze[r])
        if not moved:
            break
    return groups, progs, recs, seen, _truth(fault, list(faulted), groups, recs, seen)


def _truth(fault, faulted, groups, recs, seen) -> Truth:
    """From the simulation's own state: the EP group of the faulted ranks, the first sequence number
    some member enqueued there and a faulted rank did not."""
    ep = group_of(groups, "ep", faulted[0])
    top = {r: max((x["seq"] for x in recs[r] if x["op"].pg == ep), default=0) for r in groups[ep]["ranks"]}
    hung = min(top[r] for r in faulted) + 1
    healthy = [r for r in groups[ep]["ranks"] if r not in faulted]
    comp = {r: max((x["seq"] for i, x in enumerate(recs[r]) if x["op"].pg == ep and i < seen[r]), default=0)
            for r in groups[ep]["ranks"]}
    op = next(x["op"].name for r in healthy for x in recs[r] if x["op"].pg == ep and x["seq"] == hung)
    return Truth(fault, faulted, ep, hung, op, max(comp[r] for r in healthy), {r: comp[r] for r in faulted})


def dumps(groups, recs, seen, rank: int, keep: int, timing: bool = False, stale: bool = False) -> dict:
    """One rank's dump as torch 2.9's NCCL Flight Recorder writes it (the last `keep` entries);
    `stale`: every entry's state left at 'scheduled', only pg_status telling what completed."""
    entries = []
    for i, x in enumerate(recs[rank]):
        op = x["op"]
        completed = i < seen[rank] and not stale
        frames = [{"name": op.name, "filename": "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py",
                   "line": 4321},
                  {"name": op.frame[0], "filename": op.frame[1], "line": op.frame[2]},
                  {"name": "train_step", "filename": "/job/megatron/training/training.py", "line": 650}]
        entries.append({
            "record_id": i, "pg_id": int(op.pg), "process_group": [op.pg, groups[op.pg]["desc"]],
            "collective_seq_id": x["seq"] if op.peer is None else 0, "p2p_seq_id": i if op.peer is not None else 0,
            "op_id": i, "profiling_name": f"nccl:{op.name}", "time_created_ns": x["created"],
            "duration_ms": None, "input_sizes": op.sizes, "input_dtypes": ["BFloat16"] * len(op.sizes),
            "output_sizes": op.out_sizes or op.sizes, "output_dtypes": ["BFloat16"] * len(op.out_sizes or op.sizes),
            "state": "completed" if completed else "scheduled", "retired": completed,
            "time_discovered_started_ns": x["created"] + 1000 if timing and completed else None,
            "time_discovered_completed_ns": x.get("completed") if timing and completed else None,
            "timeout_ms": 600_000, "is_p2p": op.peer is not None, "frames": frames})
    status = {}
    for i, x in enumerate(recs[rank]):
        op = x["op"]
        if op.peer is not None:
            continue
        st = status.setdefault(op.pg, {"last_enqueued_collective": 0, "last_started_collective": -1,
                                       "last_completed_collective": -1})
        st["last_enqueued_collective"] = x["seq"]
        if i < seen[rank]:
            st["last_completed_collective"] = x["seq"]
    mine = {n: g for n, g in groups.items() if rank in g["ranks"]}
    return {"version": "2.9", "comm_lib_version": "2.27.3",
            "pg_config": {n: {"name": n, "desc": g["desc"], "ranks": json.dumps(g["ranks"])} for n, g in mine.items()},
            "pg_status": {k: {kk: str(v) for kk, v in st.items()} for k, st in status.items()},
            "entries": entries[-keep:]}


def write_job(out: Path, fault: str = "device", faulted=(5, 6), seed: int = 0, dumpless: bool = False,
              trim=(3, 43), as_json: bool = False, stale: bool = False) -> Truth:
    """The job's dumps in `out` (nccl_trace_rank_<r>, pickles unless `as_json`), and its truth."""
    groups, _progs, recs, seen, truth = simulate(fault, faulted, seed=seed)
    rng = random.Random(seed + 1)
    out.mkdir(parents=True, exist_ok=True)
    for r in range(WORLD):
        if dumpless and r in faulted:
            continue
        doc = dumps(groups, recs, seen, r, rng.randint(*trim), stale=stale)
        (out / f"nccl_trace_rank_{r}").write_bytes(json.dumps(doc).encode() if as_json else pickle.dumps(doc))
    return truth
