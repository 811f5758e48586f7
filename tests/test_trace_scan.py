"""The C trace scanner gives exactly the columns of the msgspec decoder, and hands back to it
whatever it does not accept (so bad input is still named by msgspec, one line)."""

import json
import os

import numpy as np
import pytest

from commprobe.analyzers.readers import native
from commprobe.analyzers.readers.kineto import load_trace
from commprobe.analyzers.readers.model import TraceError
from tests.conftest import ROOT

SHARED = ROOT / "tests" / "data" / "traces" / "hta"

pytestmark = pytest.mark.skipif(native.load_scanner()[0] is None, reason=f"no trace scanner: {native.load_scanner()[1]}")


def _both(path):
    fast = load_trace(path)
    os.environ["COMMPROBE_PURE_PYTHON"] = "1"
    try:
        slow = load_trace(path)
    finally:
        del os.environ["COMMPROBE_PURE_PYTHON"]
    return fast, slow


def _same(a, b):
    assert np.array_equal(a.ts, b.ts) and np.array_equal(a.dur, b.dur)
    assert [a.names[i] for i in a.name_id] == [b.names[i] for i in b.name_id]
    assert [a.cats[i] for i in a.cat_id] == [b.cats[i] for i in b.cat_id]
    assert (a.origin_ns, a.distributed, a.commprobe, a.rank) == (b.origin_ns, b.distributed, b.commprobe, b.rank)
    pairs = set(zip(a.tid_id.tolist(), b.tid_id.tolist()))  # the same threads, whatever their ids
    assert len(pairs) == len(set(a.tid_id.tolist())) == len(set(b.tid_id.tolist()))
    assert [a.args(i) for i in range(len(a.ts))] == [b.args(i) for i in range(len(b.ts))]
    assert np.array_equal(a.arg_seq, b.arg_seq)


@pytest.mark.parametrize("name", sorted(p.name for p in SHARED.glob("*.json.gz")) if SHARED.is_dir() else [])
def test_real_traces_scan_like_msgspec(name):
    a, b = _both(SHARED / name)
    _same(a, b)
    assert len(a.ts) > 0


def _awkward_doc():
    nccl = {"Collective name": "allreduce", "In msg nelems": 2**40, "dtype": "Float", "Group size": 2,
            "Process Group Name": "0", "Process Group Description": "tp \"group\" \u00e9", "nested": {"a": [1, {"b": None}]}}
    events = [
        {"ph": "X", "name": "a\\b \"quoted\" \u00e9\u4e2d", "cat": "cpu_op", "ts": 1.5e3, "dur": 2, "tid": "thread 7"},
        {"ph": "X", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "cat": "kernel", "ts": 0.1, "dur": 1e-3,
         "tid": 7, "args": nccl},
        {"ph": "X", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "cat": "kernel", "ts": 12345678901234.567,
         "dur": 0.30000000000000004, "tid": 7, "args": {**nccl, "In msg nelems": 8, "Seq": 41}},
        {"ph": "X", "ts": -0.0, "dur": 0},  # no name, cat, tid, args
        {"ph": "i", "name": "instant", "ts": 5, "s": "t"},
        {"ph": "X", "name": "c10d::allreduce_", "cat": "cpu_op", "ts": 7, "dur": 1.25e-7, "tid": -3, "args": None,
         "extra": [True, False, None, "x", 1e308, -2.5E-3]},
    ]
    doc = {"otherData": {"k": [1, 2]}, "traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_123_456_789,
           "distributedInfo": {"rank": 3, "world_size": 4}, "commprobe": json.dumps({"schema": "x"}),
           "deviceProperties": [{"name": "x", "flag": False}], "last": 12345}
    return events, doc


def test_awkward_json_scans_like_msgspec(tmp_path):
    events, doc = _awkward_doc()
    p = tmp_path / "awkward.json"
    p.write_text(json.dumps(doc, ensure_ascii=False, indent=1))
    a, b = _both(p)
    _same(a, b)
    assert a.rank == 3 and a.origin_ns == 1_700_000_000_123_456_789 and a.commprobe == {"schema": "x"}
    assert 'a\\b "quoted" é中' in a.names and len(a.ts) == 5
    assert sorted(a.arg_seq.tolist()) == [-1, -1, -1, -1, 41]
    q = tmp_path / "escaped.json"  # the same trace with every non-ASCII character escaped: same names
    q.write_text(json.dumps(events))  # and a bare list of events is a trace too
    c, d = _both(q)
    _same(c, d)
    assert [c.names[i] for i in c.name_id] == [a.names[i] for i in a.name_id]


@pytest.mark.parametrize("text, needle", [
    ('{"traceEvents": [{"ph": "X", "ts": "5", "dur": 1}]}', "not a Kineto/Chrome trace"),
    ('{"traceEvents": [{"ph": "X", "ts": 5, "dur": 1, "tid": 1.5}]}', "not a Kineto/Chrome trace"),
    ('{"traceEvents": [{"ph": "X", "ts": 5, "dur": 1}], }', "not JSON"),
    ('{"traceEvents": [{"ph": "X", "ts": 05, "dur": 1}]}', "not JSON"),
    ('{"traceEvents": [{"ph": "X", "name": "a\\q", "ts": 5, "dur": 1}]}', "not JSON"),
    ('{"traceEvents": [{"ph": "X", "ts": 5, "dur": 1}]} x', "not JSON"),
    ('{"traceEvents": [{"ph": "X", "ts": 5, "dur": 1}', "the document ends early"),
    ('{"traceEvents": [{"ph": "X", "ts": 5, "dur": 1}], "traceEvents": []}', "appears twice"),
])
def test_input_the_scanner_refuses_is_named_by_msgspec(tmp_path, text, needle):
    """Refused input is named: by msgspec where it can read the document whole, by the scanner
    where a second decoder would only cost memory (truncated, too large, ambiguous)."""
    p = tmp_path / "bad.json"
    p.write_text(text)
    assert isinstance(native.scan([text.encode()], ()), native.Refused)
    with pytest.raises(TraceError, match=needle):
        load_trace(p)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 7, 13, 64, 333])
def test_every_cut_between_chunks_scans_the_same(tmp_path, monkeypatch, chunk):
    """The scanner streams: a chunk may end inside any token (number, literal, escape, key, a
    top-level value); the columns must not depend on where, plain or gzip."""
    import gzip

    from commprobe.analyzers.readers import limits

    events, doc = _awkward_doc()
    text = json.dumps(doc, ensure_ascii=False, indent=1)
    p, q = tmp_path / "cut.json", tmp_path / "cut.json.gz"
    p.write_text(text)
    q.write_bytes(gzip.compress(text.encode()))
    whole = load_trace(p)
    monkeypatch.setattr(limits, "CHUNK", chunk)
    for f in (p, q):
        a, b = _both(f)
        _same(a, b)
        _same(a, whole)
        assert np.array_equal(a.tid_id, whole.tid_id)  # nothing half-read was interned
    bad = tmp_path / "cut-bad.json"  # a truncated document is refused however it is cut
    bad.write_text(text[: len(text) // 2])
    with pytest.raises(TraceError):
        load_trace(bad)


def test_a_trace_too_large_to_decode_whole_is_streamed(tmp_path, monkeypatch):
    """Whole-trace decoding needs several times the trace in memory, the scanner a chunk plus
    columns: a trace over the first limit and under the second is analyzed, not refused."""
    from commprobe.analyzers.readers import limits

    events, doc = _awkward_doc()
    doc["traceEvents"] = events * 200
    p = tmp_path / "big.json"
    p.write_text(json.dumps(doc))
    size = p.stat().st_size
    monkeypatch.setattr(limits, "max_trace_bytes", lambda streamed=False: size * 4 if streamed else size // 2)
    monkeypatch.setattr(limits, "CHUNK", 4096)
    assert len(load_trace(p).ts) == 5 * 200
    monkeypatch.setenv("COMMPROBE_PURE_PYTHON", "1")
    with pytest.raises(TraceError, match="too large for memory"):
        load_trace(p)


def _fast_path_doc() -> str:
    """Strings and numbers placed across the scanner's 16-byte string windows and 8-digit number
    blocks: escapes, quotes and non-ASCII at every offset, numbers of 1-25 digits in each part,
    whitespace runs of every length."""
    import random

    rng = random.Random(7)
    events = []
    for n in range(40):
        for special in ("\\", '"', "\u00e9", "\u4e2d", "\n", "\t", "\ud83d\ude00"):
            k = rng.randrange(n + 1)
            name = "x" * k + special + "y" * (n - k)
            digits = "".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 26))).lstrip("0") or "0"
            frac = "".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 26)))
            ts = f"{digits}.{frac}" if rng.random() < 0.7 else digits
            if rng.random() < 0.2:
                ts += f"e{rng.choice(['', '-', '+'])}{rng.randrange(0, 12)}"
            dur = f"0.{'0' * rng.randrange(0, 12)}{rng.randrange(1, 10**9)}"
            events.append(f'{{"ph": "X",{" " * rng.randrange(0, 20)}"name": {json.dumps(name)},'
                          f'\n{" " * rng.randrange(0, 20)}"cat": "kernel", "ts": {ts}, "dur": {dur},\r\n\t"tid": {n}}}')
    return '{"traceEvents": [\n' + ",\n".join(events) + "\n]}"


@pytest.mark.parametrize("chunk", [None, 7, 16, 17])
def test_the_scanners_fast_paths_read_like_msgspec(tmp_path, monkeypatch, chunk):
    from commprobe.analyzers.readers import limits

    text = _fast_path_doc()
    p = tmp_path / "fast.json"
    p.write_text(text)
    if chunk:
        monkeypatch.setattr(limits, "CHUNK", chunk)
    a, b = _both(p)
    _same(a, b)
    expected = sorted(float(e["ts"]) for e in json.loads(text)["traceEvents"])
    assert len(a.ts) == 280 and a.ts.tolist() == expected  # every number exactly as Python's float() reads it
    for ch in ("\x01", "\x1f", "\n"):  # a raw control character in a string, at every offset: invalid JSON
        for k in range(18):
            doc = '{"traceEvents": [{"ph": "X", "name": "' + "a" * k + ch + 'b", "ts": 1, "dur": 1}]}'
            assert isinstance(native.scan([doc.encode()], ()), native.Refused), (k, ch)


def test_unique_rows_is_numpys_unique_by_rows():
    """The args' distinct rows come from one lexsort; they must be np.unique(axis=0)'s, in its order."""
    from commprobe.analyzers.readers.model import unique_rows

    rng = np.random.default_rng(7)
    for n, k, hi in [(0, 3, 2), (1, 1, 1), (50, 1, 3), (3700, 9, 4), (500, 12, 40)]:
        a = rng.integers(-1, hi, (n, k))
        rows, inv = unique_rows(a)
        want_rows, want_inv = np.unique(a, axis=0, return_inverse=True)
        assert np.array_equal(rows, want_rows) and np.array_equal(inv, want_inv.reshape(-1))
        assert np.array_equal(rows[inv], a)


def test_the_scanners_name_flags_are_the_args_rule(tmp_path):
    """Which names keep args (candidates) or a correlation (launches) is read off the scanner's
    hint flags; escaped spellings are decided on the decoded name. Both must be _args_kind's."""
    from commprobe.analyzers.readers import kineto as trace
    from commprobe.analyzers.readers import kineto_args

    events, _ = _awkward_doc()
    events = events + [
        {"ph": "X", "name": "\\u006eccl:all_reduce", "cat": "cpu_op", "ts": 9, "dur": 1, "tid": 1, "args": {"Seq": 3}},
        {"ph": "X", "name": "nccl:all_reduce", "cat": "cpu_op", "ts": 10, "dur": 1, "tid": 1, "args": {"Seq": 4}},
        {"ph": "X", "name": "cuda\\u004caunchKernel", "cat": "cuda_runtime", "ts": 11, "dur": 1, "tid": 1,
         "args": {"correlation": 5}},
        {"ph": "X", "name": "cudaGraphLaunch", "cat": "cuda_runtime", "ts": 12, "dur": 1, "tid": 1, "args": {"correlation": 6}},
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 13, "dur": 1, "tid": 1},
    ]
    p = tmp_path / "flags.json"
    p.write_text(json.dumps(events).replace("\\\\u", "\\u"))  # the escapes written as escapes
    paths = [p, *(sorted(SHARED.glob("*.json.gz")) if SHARED.is_dir() else [])]
    for path in paths:
        cols = trace._columns_native(path)
        assert cols.kinds.tolist() == [kineto_args.args_kind(n) for n in cols.names], path
    assert {"nccl:all_reduce", "cudaLaunchKernel"} <= set(trace._columns_native(p).names)  # the escapes were decoded
