"""The shared vocabulary (common/vocab.py): one list of name hints for the scanner and the
classifier, the kernel table's names kept and linked, the enums the JSON uses."""

from __future__ import annotations

import re
import tomllib

import pytest

from commprobe.analyzers.analysis import analyze
from commprobe.analyzers.per_rank.classify import _KERNELS_TOML, classify_name
from commprobe.analyzers.readers.kineto_args import args_kind
from commprobe.common.vocab import CATEGORIES, COMM_CATS, KERNEL_HINTS, NAME_HINTS, WORK_CATEGORIES, Category, Verdict
from tests.kineto_events import HOST, ev, launched, write

TABLE = tomllib.loads(_KERNELS_TOML.read_text())["kernel"]
EXAMPLES = [(k["pattern"], k["op"], e) for k in TABLE for e in k["examples"]]


def test_every_hint_the_classifier_uses_is_one_the_scanner_keeps():
    assert set(KERNEL_HINTS) <= set(NAME_HINTS)
    assert all(h == h.lower() for h in NAME_HINTS)


def test_every_table_entry_has_examples():
    assert all(k.get("examples") for k in TABLE), [k["pattern"] for k in TABLE if not k.get("examples")]


@pytest.mark.parametrize("pattern,op,name", EXAMPLES, ids=[e[2][:40] for e in EXAMPLES])
def test_kernel_table_names_are_hinted_kept_and_classified(pattern, op, name):
    """Each example matches its pattern, carries a kernel hint (the classifier tests it), and the
    scanner keeps its args and correlation (args_kind 1): a name the classifier can call
    communication is one whose launch can be linked."""
    flags = re.IGNORECASE if "i" in next(k.get("flags", "") for k in TABLE if k["pattern"] == pattern) else 0
    assert re.search(pattern, name, flags)
    assert any(h in name.lower() for h in KERNEL_HINTS)
    assert args_kind(name) == 1
    want = Category.COMPUTE if op == "compute" else None
    got = classify_name(name, "kernel").category
    assert got == want if want is not None else got in {Category[c.upper()] for c in COMM_CATS}


@pytest.mark.parametrize("kernel", ["uccl::internode_ll::clean_low_latency_buffer",
                                    "void deep_ep::internode_ll::clean_low_latency_buffer(int*, int)"])
@pytest.mark.parametrize("pure_python", [False, True])
def test_a_renamed_deepep_kernel_under_a_host_op_is_linked(tmp_path, monkeypatch, kernel, pure_python):
    """The defect of two hint lists: a DeepEP fork's kernel (uccl::) was classified EP all-to-all but
    its correlation never read, so never linked. Both readers now link it to the host op."""
    if pure_python:
        monkeypatch.setenv("COMMPROBE_PURE_PYTHON", "1")
    e = [ev("ProfilerStep#1", 0, 10_000, HOST, "user_annotation"), ev("nccl:all_to_all", 100, 500, HOST)]
    e += launched(kernel, 700, 300, corr=41, launch_ts=150)
    r = analyze(write(tmp_path / "t.json.gz", e))
    links = r["kernel_links"]
    assert links["comm_kernels"] == 1 and links["linked"] == 1 and links["no_correlation"] == 0, links
    assert r["phases"]["step"]["exposed_share"]["ep_all_to_all"] > 0


def test_enums_name_the_json_words():
    assert CATEGORIES == ["compute", "tp_allreduce", "cp_ring", "ep_all_to_all", "other_comm", "memcpy", "other",
                          "marker"]
    assert WORK_CATEGORIES == tuple(CATEGORIES[:7]) and Category.MARKER.key == "marker"
    assert [v.css for v in Verdict] == ["communication", "imbalance", "communication", "compute", "data", "host", "unknown"]
    import json

    from tests.conftest import ROOT

    schema = json.loads((ROOT / "analyzers" / "analysis.schema.json").read_text())
    enum = schema["properties"]["phases"]["additionalProperties"]["properties"]["verdict"]["enum"]
    assert sorted(enum) == sorted(str(v) for v in Verdict)


@pytest.mark.parametrize("pure_python", [False, True])
def test_nccl_all_to_allv_is_ep_all_to_all_and_links_its_kernel(tmp_path, monkeypatch, pure_python):
    """PyTorch's record_param_comms says "all_to_allv" for all_to_all_single with split sizes —
    MoE dispatch and combine (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, alltoall_base):
    the SendRecv kernel under it is that all-to-all, not an unlinked p2p."""
    from tests.kineto_events import rpc

    if pure_python:
        monkeypatch.setenv("COMMPROBE_PURE_PYTHON", "1")
    host = rpc(0, 200, "all_to_allv", 4096, group="7", group_size=2)
    events = [ev("ProfilerStep#1", -10, 1000, HOST, "user_annotation"), host,
              *launched("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 300, 100, 1, 50)]
    r = analyze(write(tmp_path / "rank0.json.gz", events))
    step = r["ranks"][0]["phases"]["step"]["categories"]
    assert step["ep_all_to_all"]["total_us"] == pytest.approx(100.0)
    assert r["kernel_links"]["linked"] == 1
