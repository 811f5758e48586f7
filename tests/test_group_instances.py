"""Several groups of one axis: a TP=2 x EP=2 run of the reference MoE on 4 ranks has two TP pairs
and two EP pairs. Each collective is matched within its own group, never across groups that never
meet (before, the 4 ranks' k-th TP allreduces were taken as one 4-rank collective and a rank of
one pair was named the late arriver of the other's). Truths computed here from the raw spans and
the bundle's layout."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from commprobe.analyzers.analysis import analyze_with_calls
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def tp_ep(tmp_path_factory):
    out = tmp_path_factory.mktemp("tpep") / "run"
    r = run_cli("profile", "--preset", "moe-tiny", "--tp", "2", "--ep", "2", "--steps", "4", "--repeats", "2",
                "--prompt-len", "16", "--backend", "gloo", "--oversubscribe", "--out", str(out),
                env={"COMMPROBE_FAULT": "hot-expert:3@90"})
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def _raw_spans(bundle, rank: int, prefix: str) -> list[tuple[float, float]]:
    """(start, end) µs on the Unix clock of the rank's spans named `prefix`..., in start order."""
    doc = json.load(gzip.open(bundle / f"rank{rank}.trace.json.gz"))
    base = doc["baseTimeNanoseconds"] / 1e3
    return sorted((e["ts"] + base, e["ts"] + base + e["dur"]) for e in doc["traceEvents"]
                  if e.get("ph") == "X" and e.get("name", "").startswith(prefix))


def test_each_collective_is_matched_within_its_own_group(tp_ep):
    res, red = analyze_with_calls(tp_ep)
    layout = {row["rank"]: row for row in res["manifest"]["world"]["layout"]}
    for r, c in red.calls.items():
        last, wait = red.waits[r][2], red.waits[r][0]
        assert (~np.isnan(wait)).all()  # every call matched, within its group
        for i in range(len(c)):
            group, _ = c.pairs[int(c.pair[i])]
            axis = group.split()[0]
            assert group == f"{axis} {layout[r][axis + '_group']}"
            assert int(last[i]) in layout[r][f"{axis}_group"], (r, i, group, int(last[i]))
    # the TP waits, from the raw spans of each pair alone: the later starter's time is the transfer
    # (starts within 1 µs: the one that left first), every other rank's excess over it its wait
    for pair in ([0, 1], [2, 3]):
        a, b = (_raw_spans(tp_ep, q, "commprobe/comm/tp/all_reduce") for q in pair)
        assert len(a) == len(b) > 0
        truth = {q: 0.0 for q in pair}
        for (s0, e0), (s1, e1) in zip(a, b):
            tied = abs(s0 - s1) <= 1.0
            t = (e0 - s0 if e0 <= e1 else e1 - s1) if tied else (e0 - s0 if s0 > s1 else e1 - s1)
            truth[pair[0]] += max(0.0, e0 - s0 - t)
            truth[pair[1]] += max(0.0, e1 - s1 - t)
        for q in pair:
            c = red.calls[q]
            tp = np.array([c.pairs[int(p)][0].startswith("tp") for p in c.pair])
            assert float(np.nansum(red.waits[q][0][tp])) == pytest.approx(truth[q], rel=1e-4, abs=1.0), (q, truth)


def test_each_ep_group_names_its_own_hot_rank(tp_ep):
    """Expert 3 lives on EP rank 1 of each EP pair: global rank 2 in [0, 2], rank 3 in [1, 3]. The
    busiest group is shown in full, the other in brief, each naming a global rank of its own."""
    res, _ = analyze_with_calls(tp_ep)
    for phase in ("prefill", "decode"):
        t = res["phases"][phase]["all_to_all"]
        groups = [t, *t["other_groups"]]
        assert sorted(g["group"] for g in groups) == ["ep [0, 2]", "ep [1, 3]"]
        for g in groups:
            assert g["hot_rank"] == g["ranks"][1] and g["imbalance"] > 1.25, g
        assert t["groups_summed"] == 1 and "other all-to-all group" in t["note"]
