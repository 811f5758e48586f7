"""Hostile and odd inputs (issue: reliability): each gives the right analysis or one line and
exit 2, never a traceback, and the two readers (C scanner, msgspec) agree on what both accept."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from commprobe.analyzers.analysis import analyze
from commprobe.common.vocab import NAME_HINTS
from tests.conftest import run_cli

EVENT = {"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 5, "pid": 0, "tid": 1}


def rpc(**args):
    return {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 0, "dur": 1, "tid": 1,
            "args": {"Collective name": "allreduce", **args}}


def doc(*events, **top) -> bytes:
    return json.dumps({**top, "traceEvents": [EVENT, *events]}).encode()


def one_line_exit_2(path, needle, env=None):
    for reader in ({}, {"COMMPROBE_PURE_PYTHON": "1"}):
        r = run_cli("analyze", str(path), env={**reader, **(env or {})})
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, (reader, r.stderr)


@pytest.mark.parametrize("name, data, needle", [
    ("utf8", doc(rpc(dtype="Float")).replace(b'"Float"', b'"Fl\xffoat"'), "UTF-8"),
    ("huge-number-args", doc(rpc(**{"In msg nelems": 1}), ).replace(b'"In msg nelems": 1', b'"In msg nelems": 1e400'),
     "out of range"),
    ("huge-number-ts", doc().replace(b'"ts": 0', b'"ts": 1e400'), "out of range"),
    ("world-size-list", doc(distributedInfo={"rank": 0, "world_size": [2]}), "world_size is not an integer"),
    ("deep-args", doc().replace(b'"name": "k"', b'"name": "record_param_comms", "args": '
                                + b'{"a":' * 3000 + b"1" + b"}" * 3000), "nested too deeply"),
])
def test_invalid_json_is_one_line_in_both_readers(tmp_path, name, data, needle):
    p = tmp_path / f"{name}.json"
    p.write_bytes(data)
    one_line_exit_2(p, needle)


def test_special_files_loops_and_permissions(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    one_line_exit_2(fifo, "not a regular file or a directory")
    one_line_exit_2("/dev/zero", "not a regular file or a directory")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    one_line_exit_2(tmp_path / "a", "symbolic link loop")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text("[]")
    one_line_exit_2(bundle, "expected a JSON object")


def test_unprivileged_user_gets_one_line_for_an_unreadable_trace(tmp_path):
    """Root ignores chmod 000, so the check runs the CLI as `nobody` (where setpriv exists)."""
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to drop to nobody with setpriv")
    locked = tmp_path / "locked.json"
    locked.write_bytes(doc())
    locked.chmod(0)
    tmp_path.chmod(0o755)
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                        "commprobe.probe.cli", "analyze", str(locked)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Permission denied" in lines[0], r.stderr


def _same(a: dict, b: dict) -> None:
    for d in (a, b):
        d.pop("elapsed_s")
    assert a == b


def test_multi_member_gzip_is_read_whole(tmp_path, monkeypatch):
    """pigz, bgzip and `cat a.gz b.gz` write several gzip members; all of them are the trace."""
    data = doc(*[dict(EVENT, ts=10 * i) for i in range(1, 50)])
    one, many = tmp_path / "one" / "t.json.gz", tmp_path / "many" / "t.json.gz"
    for p in (one, many):
        p.parent.mkdir()
    one.write_bytes(gzip.compress(data))
    many.write_bytes(b"".join(gzip.compress(data[i:i + 100]) for i in range(0, len(data), 100)))
    a, b = analyze(one), analyze(many)
    assert b["ranks"][0]["phases"]["trace"]["e2e_us"] == a["ranks"][0]["phases"]["trace"]["e2e_us"] == 495
    monkeypatch.setenv("COMMPROBE_PURE_PYTHON", "1")
    c = analyze(many)
    assert c["ranks"][0]["phases"] == b["ranks"][0]["phases"]


@pytest.mark.parametrize("name, event", [
    ("seq-beyond-int64", rpc(Seq=10 ** 30)),
    ("group-size-beyond-int64", rpc(**{"Group size": 10 ** 30})),
])
def test_out_of_range_integers_are_unknown_and_readers_agree(tmp_path, monkeypatch, name, event):
    p = tmp_path / f"{name}.json"
    p.write_bytes(doc(event))
    a = analyze(p)
    assert a["axis_provenance"] == {"tp_allreduce": {"inferred": 1}}  # read, its bad number left unknown
    monkeypatch.setenv("COMMPROBE_PURE_PYTHON", "1")
    _same(a, analyze(p))


@pytest.mark.parametrize("name, old, new", [
    ("escaped-ph-key", b'"ph": "X", "cat": "kernel"', b'"p\\u0068": "X", "cat": "kernel"'),
    ("escaped-dur-key", b'"dur": 5', b'"du\\u0072": 5'),
    ("escaped-name", b'"name": "record_param_comms"', b'"name": "record\\u005fparam_comms"'),
])
def test_escapes_are_the_same_string_in_both_readers(tmp_path, monkeypatch, name, old, new):
    """JSON's rules: an escape is the same character. The scanner refuses escaped keys (msgspec then
    reads the trace) and keeps the args of escaped names, so both readers give the same analysis."""
    data = doc(rpc(**{"In msg nelems": 256, "dtype": "Float"}))
    assert old in data
    p = tmp_path / f"{name}.json"
    p.write_bytes(data.replace(old, new, 1))
    a = analyze(p)
    assert a["ranks"][0]["phases"]["trace"]["e2e_us"] == 5
    assert a["axis_provenance"] == {"tp_allreduce": {"inferred": 1}}
    monkeypatch.setenv("COMMPROBE_PURE_PYTHON", "1")
    _same(a, analyze(p))


def test_a_second_trace_events_key_is_refused_by_both_readers(tmp_path):
    """JSON leaves duplicate keys undefined: one reader concatenated, the other kept the last.
    Which array is the trace is ambiguous, so both refuse, naming it."""
    p = tmp_path / "twice.json"
    p.write_bytes(doc()[:-1] + b', "traceEvents": [' + json.dumps(EVENT).encode() + b"]}")
    one_line_exit_2(p, '"traceEvents" appears twice')


def test_a_token_over_the_limit_is_refused_not_cast(tmp_path):
    """Lengths stay int64 until checked: a string (or args object) over the limit is refused with
    its position, never wrapped into a negative int32 (the limit is 1 GiB; 64 bytes here)."""
    from commprobe.analyzers.readers import native

    if native.load_scanner()[0] is None:
        pytest.skip(f"no trace scanner: {native.load_scanner()[1]}")
    for long in (b'"name": "' + b"n" * 100 + b'"', b'"cat": "' + b"c" * 100 + b'"', b'"tid": "' + b"t" * 100 + b'"',
                 b'"args": {"x": "' + b"a" * 100 + b'"}', b'"' + b"k" * 100 + b'": 1'):
        data = b'{"traceEvents": [{"ph": "X", "ts": 0, "dur": 1, ' + long + b"}]}"
        r = native.scan([data], ("nccl",), max_token=64)
        assert isinstance(r, native.Refused) and r.code == 5 and 30 < r.pos < 60, (long[:10], r)
        assert "over 64 bytes" in r.reason(64)
        assert not isinstance(native.scan([data], ("nccl",), max_token=200), native.Refused)


def test_a_huge_event_cut_by_every_chunk_is_scanned_in_linear_work(tmp_path, monkeypatch):
    """An event longer than a chunk is scanned again from its start with what follows; waiting until
    the cut part has doubled bounds the bytes handed to the scanner by a small multiple of the
    input (re-scanning on every chunk handed over ~n²/2chunk: 128x the input here)."""
    from commprobe.analyzers.readers import limits, native

    if native.load_scanner()[0] is None:
        pytest.skip(f"no trace scanner: {native.load_scanner()[1]}")
    data = doc(rpc(blob="x" * (4 << 20)))
    chunks = [data[i:i + (16 << 10)] for i in range(0, len(data), 16 << 10)]
    s = native.scan(chunks, NAME_HINTS)
    assert isinstance(s, native.Scanned) and s.nbytes == len(data) and len(s.kept_row) == 1
    assert s.fed < 4 * len(data), s.fed / len(data)
    p = tmp_path / "huge.json"
    p.write_bytes(data)
    monkeypatch.setattr(limits, "CHUNK", 16 << 10)
    assert analyze(p)["axis_provenance"] == {"tp_allreduce": {"inferred": 1}}


def test_an_unclosed_gzip_bomb_is_refused_while_streaming_not_inflated_whole(tmp_path, monkeypatch):
    """A few kB of gzip inflating to whitespace inside an open events array: the scanner reads it
    chunk by chunk and refuses it at its end, and no whole-document decoder gets it after."""
    import zlib

    from commprobe.analyzers.readers import kineto as trace
    from commprobe.analyzers.readers import native
    from commprobe.analyzers.readers.model import TraceError

    if native.load_scanner()[0] is None:
        pytest.skip(f"no trace scanner: {native.load_scanner()[1]}")
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(z.compress(b'{"traceEvents": [') + b"".join(z.compress(b" " * (1 << 20)) for _ in range(64)) + z.flush())
    assert p.stat().st_size < 200_000

    def whole(path):
        raise AssertionError("handed to the whole-document decoder")

    monkeypatch.setattr(trace, "read_bytes", whole)
    with pytest.raises(TraceError, match="ends early"):
        trace.load_trace(p)


def _peak_rss(path) -> int:
    """Peak RSS (bytes) of a whole `commprobe analyze --json` of `path` (bench/hostile.py's probe)."""
    import sys

    from tests.conftest import ROOT

    sys.path.insert(0, str(ROOT))
    try:
        from bench.hostile import run
    finally:
        sys.path.pop(0)
    _, rss, rc, line = run(path)
    assert rc == 0, line
    return rss


def test_memory_is_bound_by_the_events_kept_not_the_json(tmp_path):
    """The README's bound: the interpreter plus limits.BYTES_PER_EVENT per complete event, for plain
    tiny events (the most events per JSON byte) and for events that are all communication kernels,
    their launches and host collective ops (the most memory per event: the links' arrays)."""
    import sys

    from commprobe.analyzers.readers import limits
    from tests.conftest import ROOT

    sys.path.insert(0, str(ROOT))
    try:
        from bench.hostile import tiny
        from bench.sqlite_vs_json import write_json
    finally:
        sys.path.pop(0)
    small = tmp_path / "one.json"
    tiny(small, 1)
    base = _peak_rss(small)
    n = 300_000
    tiny(tmp_path / "tiny.json", n)
    peak = _peak_rss(tmp_path / "tiny.json")
    assert peak - base <= limits.BYTES_PER_EVENT * n, ("tiny", base, peak, (peak - base) / n)
    write_json(tmp_path / "comm.json", 24)  # ~150 k events of 157 bytes
    n = len(json.loads((tmp_path / "comm.json").read_text())["traceEvents"])
    peak = _peak_rss(tmp_path / "comm.json")
    assert peak - base <= limits.BYTES_PER_EVENT * n, ("comm", base, peak, (peak - base) / n)


def test_more_events_than_memory_holds_is_refused_while_reading(tmp_path):
    events = [dict(EVENT, ts=i) for i in range(150)]
    p = tmp_path / "many.json"
    p.write_bytes(json.dumps({"traceEvents": events}).encode())
    limit = {"COMMPROBE_MAX_TRACE_BYTES": str(350 * 100)}  # 100 events' worth (and 35 kB of JSON)
    r = run_cli("analyze", str(p), env=limit)
    assert r.returncode == 2 and "more complete events than the memory here holds" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run_cli("analyze", str(p), env={**limit, "COMMPROBE_PURE_PYTHON": "1"})
    assert r.returncode == 2 and "more complete events than the memory here holds" in r.stderr, r.stderr


def test_option_checks_live_in_the_library_and_are_one_line_at_the_cli(tmp_path):
    """The CLI holds no policy: a bad --align, --jobs, --plan or gate threshold is refused by the
    library with the one InputError, which the CLI prints as one line and exit 2."""
    from commprobe.common.errors import InputError
    from commprobe.gate import Thresholds
    from commprobe.plan.request import load_plan_doc

    p = tmp_path / "rank0.trace.json"
    p.write_bytes(doc())
    with pytest.raises(InputError, match="--align"):
        analyze(p, align="wall")
    with pytest.raises(InputError, match="jobs"):
        analyze(p, jobs=-1)
    with pytest.raises(InputError, match="alpha"):
        Thresholds(alpha=2.0)
    (tmp_path / "plan.json").write_text('{"schema": "other"}')
    with pytest.raises(InputError, match="not a plan result"):
        load_plan_doc(tmp_path / "plan.json")
    for args, needle in ((["analyze", str(p), "--align", "wall"], "--align"),
                         (["analyze", str(p), "--jobs", "-1"], "jobs"),
                         (["report", str(p), "--plan", str(tmp_path / "plan.json"), "-o", str(tmp_path / "r.html")],
                          "not a plan result"),
                         (["gate", "--baseline", str(p), "--current", str(p), "--alpha", "2"], "alpha")):
        r = run_cli(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], (args, r.stderr)
