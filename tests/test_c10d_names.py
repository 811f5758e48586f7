"""Collective names as the installed torch writes them (issue: fidelity on real producers): a real
two-rank gloo job calls every c10d API under torch.profiler (tests/c10d_job.py), and every
communication event inside each API's window must be classified to that API's op. The truth is
the API the job called, not our reading of PyTorch's sources.

What torch 2.13 records on gloo (CPU traces): `c10d::<op>_` around `gloo:<op>`, no
record_param_comms; gloo runs `reduce_scatter` as its allreduce (`c10d::reduce_scatter_` holds
`gloo:all_reduce`), which alone would read as a TP allreduce. NCCL-only names come from
record_param_comms (PyTorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp: "all_to_allv" for
all_to_all_single with split sizes) and are checked in tests/test_vocab.py.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from commprobe.analyzers.per_rank.classify import classify
from commprobe.analyzers.readers.kineto import load_trace
from tests.c10d_job import EXPECTED
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("c10d")
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "c10d_job.py"), str(r), str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    for p in procs:
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the c10d job did not finish in 120 s")
    assert all(p.returncode == 0 for p in procs), [p.stdout.read() for p in procs]
    return [out / f"rank{r}.pt.trace.json" for r in (0, 1)]


@pytest.mark.parametrize("rank", [0, 1])
def test_every_c10d_api_is_classified_to_its_op(traces, rank):
    t = load_trace(traces[rank])
    c = classify(t, [])
    names = np.array(t.names, dtype=object)[t.name_id]
    end = t.ts + t.dur
    seen = {}
    for i in np.flatnonzero([n.startswith("api:") for n in names]):
        api = names[i][4:]
        inside = [j for j in np.flatnonzero((t.ts >= t.ts[i]) & (end <= end[i])) if j != i and c.comm_op[j] is not None]
        assert inside, f"{api}: no communication event recorded"
        got = {(names[j], c.comm_op[j]) for j in inside}
        assert {op for _, op in got} == {EXPECTED[api]}, (api, got)
        seen[api] = sorted(got)
    assert set(seen) == set(EXPECTED)
    # what makes reduce_scatter a trap: gloo's inner op is an allreduce. Paired with the c10d op it
    # runs (issue 57: one call per collective), it is that op's work: no call of its own, of its category
    from commprobe.common.vocab import CATEGORIES

    (i,) = np.flatnonzero(names == "api:reduce_scatter")
    work = [j for j in np.flatnonzero((t.ts >= t.ts[i]) & (end <= end[i])) if names[j] == "gloo:all_reduce"]
    assert work and all(c.comm_op[j] is None and CATEGORIES[c.category[j]] == "other_comm" for j in work)


def test_an_allreduce_inside_reduce_scatter_is_not_tp_time(traces):
    """Attribution follows: the reduce_scatter window's communication is other_comm, never TP allreduce."""
    from commprobe.common.vocab import CATEGORIES

    t = load_trace(traces[0])
    c = classify(t, [])
    names = np.array(t.names, dtype=object)[t.name_id]
    (i,) = np.flatnonzero(names == "api:reduce_scatter")
    inside = np.flatnonzero((t.ts >= t.ts[i]) & (t.ts + t.dur <= t.ts[i] + t.dur[i]) & (names != "api:reduce_scatter"))
    cats = {CATEGORIES[c.category[j]] for j in inside if CATEGORIES[c.category[j]] in ("tp_allreduce", "other_comm")}
    assert cats == {"other_comm"}
