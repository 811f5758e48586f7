"""Which rank each trace is, chosen over the set (analyzers/cross_rank/identity.py): every rule in
its order, the one refusal (two traces of one process), and a bad --rank-from as one line."""
from __future__ import annotations

import pytest

from commprobe.analyzers.cross_rank.identity import assign
from commprobe.analyzers.readers.model import TraceError, evidence, host_pid_in_name
from tests.conftest import assert_one_line_exit_2, run_cli
from tests.kineto_events import write as write_trace


def test_host_and_pid_from_file_names_as_nsys_and_torch_write_them():
    assert host_pid_in_name("node-a.cluster_4242.1700000000000.pt.trace.json") == ("node-a.cluster", 4242)
    assert host_pid_in_name("nid008553_1701896.sqlite") == ("nid008553", 1701896)
    for other in ("dp0_pp0_tp0_dcp0_ep0_rank0.1.pt.trace.json.gz", "worker0_step_12.169.pt.trace.json.gz",
                  "rank-3.json", "trace_filter_sampled_rank-0.json.gz"):
        assert host_pid_in_name(other) == (None, None), other


def _ev(name, **kw):
    return {**evidence(name, kw.pop("own", None), host=kw.pop("host", None), pid=kw.pop("pid", None),
                       device=kw.pop("device", None), part=kw.pop("part", 0))}


def test_rules_in_order():
    own = [_ev("a.json", own=1), _ev("b.json", own=0)]
    assert (assign(own).ranks, assign(own).rule) == ([1, 0], "the trace's own rank")
    named = [_ev("x_rank3.json"), _ev("x_rank1.json")]
    assert (assign(named).ranks, assign(named).rule) == ([3, 1], "the file name")
    # two-node torchrun, Kineto traces named by torch's default worker name, no rank recorded
    hp = [_ev("nodeb_20.1.pt.trace.json"), _ev("nodea_31.1.pt.trace.json"), _ev("nodea_30.1.pt.trace.json"),
          _ev("nodeb_12.1.pt.trace.json")]
    got = assign(hp)
    assert (got.ranks, got.rule) == ([3, 1, 0, 2], "(host, pid)")
    assert got.notes == ["no rank recorded in 4 traces on 2 hosts; ranks from (host, pid) "
                         "(--rank-from REGEX names ranks from the file names)"]
    # uneven devices per host: consecutive in (host, device) order
    dev = [_ev("b.sqlite", host="b", device=0), _ev("a.sqlite", host="a", device=1), _ev("a2.sqlite", host="a", device=0)]
    assert assign(dev).ranks == [2, 1, 0]
    # one process driving two GPU agents whose ids are no device index (rocprofv3): two parts, not a repeat
    agents = [_ev("p_results.json", pid=908, part=0), _ev("p_results.json", pid=908, part=1)]
    assert (assign(agents).ranks, assign(agents).rule) == ([0, 1], "(host, pid)")
    nothing = [_ev("x.json"), _ev("y.json")]
    assert (assign(nothing).ranks, assign(nothing).rule) == ([0, 1], "the order of first work")
    assert assign([_ev("w1.json"), _ev("w2.json")], rank_from=r"w(\d)").ranks == [1, 2]


def test_refusals_name_both_files():
    with pytest.raises(TraceError, match=r"rank 0 appears in two files \(a.json and b.json; by the trace's own rank\)"):
        assign([_ev("a.json", own=0), _ev("b.json", own=0)])
    with pytest.raises(TraceError, match=r"two traces of one process \(h_7.1.json and h_7.2.json\)"):
        assign([_ev("h_7.1.json"), _ev("h_7.2.json")])
    with pytest.raises(TraceError, match="is not a regular expression"):
        assign([_ev("a.json")], rank_from="(")
    with pytest.raises(TraceError, match="has no group"):
        assign([_ev("a.json")], rank_from="a")


def test_kineto_traces_of_two_nodes_named_host_pid_analyze(tmp_path):
    """torch.profiler traces with no distributedInfo (the rank is not recorded), named by torch's
    default worker name `<host>_<pid>`: ranks by (host, pid), each naming its host."""
    for name in ("nodeb_500", "nodea_900", "nodea_100"):
        write_trace(tmp_path / f"{name}.1700000000.pt.trace.json", [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 50, "pid": 1, "tid": 1}], rank=None)
    from commprobe.analyzers.analysis import analyze

    a = analyze(tmp_path)
    assert [(r["rank"], r["identity"]) for r in a["ranks"]] == [
        (0, {"host": "nodea", "pid": 100}), (1, {"host": "nodea", "pid": 900}), (2, {"host": "nodeb", "pid": 500})]
    assert a["source"]["rank_rule"] == "(host, pid)"


def test_a_bad_rank_from_is_one_line_before_any_file_is_read(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    assert_one_line_exit_2(run_cli("analyze", str(tmp_path), "--rank-from", "("), "is not a regular expression")
