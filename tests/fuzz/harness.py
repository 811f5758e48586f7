"""Fuzzing the trace readers: hypothesis cases, one check, the C scanner under sanitizers.

Why hypothesis (not atheris or libFuzzer): the property worth checking is differential — the C
scanner and the msgspec decoder give the same trace or the same refusal, and whatever is accepted
analyzes without a traceback — which lives in Python; hypothesis composes structured mutations of
a corpus with a dictionary of hostile tokens, shrinks a failing case to a small one, runs inside
pytest with a bounded number of cases, and needs no clang (libFuzzer's coverage guidance does;
this machine has gcc only). Memory safety is checked by feeding every case, cut at a chosen chunk
size, to `scan_driver.c` built with -fsanitize=address,undefined: one persistent process, so a
case costs a pipe round trip, not a process start.

`check(data, chunk, gz)` is the whole property; tests/test_fuzz.py runs a smoke of it in CI and
bench/fuzz.py runs it for as many cases as asked.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from commprobe.analyzers.analysis import analyze
from commprobe.analyzers.readers import kineto as trace
from commprobe.analyzers.readers import limits
from commprobe.common.errors import InputError
from commprobe.common.vocab import LAUNCH_HINT, NAME_HINTS

HERE = Path(__file__).resolve().parent
CORPUS = sorted((HERE / "corpus").glob("*.json"))
SCANNER = HERE.parent.parent / "analyzers" / "trace_scan.c"

# Tokens that broke a reader once or sit on a parser's edges.
TOKENS = [b"\\u0068", b"\\u005f", b"\\", b'"', b"1e400", b"-1e400", b"-0", b"0.0e-0", b"99999999999999999999999",
          b"9223372036854775808", b"-9223372036854775809", b"1.5", b"null", b"true", b"{", b"}", b"[", b"]", b",", b":",
          b"\xff", b"\xc3", b"\x00", b"\x1f", b" ", b'"traceEvents": [', b'"traceEvents": []', b'"ph": "X"', b'"ph": "B"',
          b'"args": {', b'"correlation": 11', b'"Seq": 4', b'"name": "nccl:all_reduce"', b'"name": "cudaLaunchKernel"',
          b'"cat": "kernel"', b'"tid": "x"', b'"dur": -1', b'"ts": 1e308', b'"world_size": 4', b'"rank": 9',
          b'"Collective name": "all_to_all"', b'"Process Group Description": "ep"', b"[" * 40, b"{\"a\":" * 40,
          b'"distributedInfo": {"rank": 1}', b'"baseTimeNanoseconds": 1', b'"baseTimeNanoseconds": -1', b"\\ud800"]


def _mutate(data: bytes, ops: list[tuple[int, float, int, int]]) -> bytes:
    for op, where, token, span in ops:
        i = int(where * len(data))
        t = TOKENS[token % len(TOKENS)]
        if op == 0:
            data = data[:i] + t + data[i:]
        elif op == 1:
            data = data[:i] + data[i + span:]
        elif op == 2:
            data = data[:i] + t + data[i + span:]
        elif op == 3:
            data = data[:i] + data[i:i + span] + data[i:]  # duplicate a span
        elif op == 4:
            data = data[:i]  # truncate
        elif op == 5 and i < len(data):
            data = data[:i] + bytes([data[i] ^ (1 << (span % 8))]) + data[i + 1:]
    return data


# insert, delete, replace, duplicate, truncate, flip a bit: truncation is rare (one refusal class
# among many), so that most cases stay parseable and the readers' answers are compared, not refused
ops = st.lists(st.tuples(st.sampled_from([0, 0, 0, 1, 2, 2, 2, 3, 3, 5, 5, 4]), st.floats(0, 1), st.integers(0, 10_000),
                         st.integers(1, 64)), max_size=3)
# Structured traces: valid JSON whose fields take odd values (the readers and analyzers must agree
# and not crash on what parses), then at most one mutation.
json_values = st.recursive(st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats(allow_nan=False,
                           allow_infinity=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                           max_leaves=6)
NAMES = ["record_param_comms", "nccl:all_reduce", "nccl:all_to_all", "c10d::allreduce_", "cudaLaunchKernel",
         "cudaGraphLaunch", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclDevKernel_SendRecv", "ncclKernel_AllGather",
         "commprobe/comm/tp/allreduce/1024", "ProfilerStep#3", "execute_context_1(5)_generation_3(3)",
         "step[EXTEND bs=2 toks=64]", "aten::mm", "deep_ep::internode::dispatch", "cuda_graph_replay"]
ARGS = {"correlation": st.integers(-3, 40) | json_values, "Collective name": st.sampled_from(
        ["allreduce", "all_to_all", "send", "recv", "allgather", "broadcast", ""]) | json_values,
        "Seq": st.integers(-2, 2 ** 64) | json_values, "In msg nelems": st.integers(-1, 2 ** 40) | json_values,
        "Out msg nelems": st.integers(0, 2 ** 20), "dtype": st.sampled_from(["Float", "BFloat16", "Int"]) | json_values,
        "Group size": st.integers(-1, 2 ** 65) | json_values, "Process Group Name": st.sampled_from(["0", "1", "tp"]) |
        json_values, "Process Group Description": st.sampled_from(["tp", "ep", "default_pg", "undefined"]) | json_values,
        "Input Dims": st.lists(st.lists(st.integers(0, 4096), max_size=3), max_size=2) | json_values,
        "Input type": st.sampled_from(["float", "c10::BFloat16"]) | json_values, "stream": json_values}
events = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "B", "i", "f"]), "name": st.sampled_from(NAMES) | st.text(max_size=12),
     "cat": st.sampled_from(["kernel", "cpu_op", "cuda_runtime", "user_annotation", "gpu_memcpy", "python_function"]),
     "ts": st.integers(0, 10 ** 6) | st.floats(0, 1e6), "dur": st.integers(0, 1000) | st.floats(0, 1e3),
     "tid": st.integers(-5, 10) | st.text(max_size=3)},
    optional={"args": st.fixed_dictionaries({}, optional=ARGS), "pid": json_values})
traces = st.fixed_dictionaries({"traceEvents": st.lists(events, max_size=12)}, optional={
    "distributedInfo": st.fixed_dictionaries({}, optional={"rank": json_values | st.integers(0, 8), "world_size":
                                                           json_values | st.integers(1, 8)}),
    "baseTimeNanoseconds": st.integers(-(2 ** 63), 2 ** 63 - 1), "otherData": json_values})
structured = st.tuples(traces, st.booleans()).map(lambda t: json.dumps(t[0], ensure_ascii=t[1]).encode())
mutated = st.tuples(st.sampled_from(CORPUS), ops).map(lambda t: _mutate(t[0].read_bytes(), t[1]))
cases = st.tuples(mutated | st.tuples(structured, ops.map(lambda o: o[:1])).map(lambda t: _mutate(*t)),
                  st.sampled_from([0, 1, 2, 3, 7, 64, 4096]), st.booleans())


class Driver:
    """scan_driver.c under ASan and UBSan, one process for many cases; None where it cannot be
    built (no compiler, no sanitizer runtime): `Driver.why` says why."""

    why = ""

    def __init__(self, exe: Path):
        env = {**os.environ, "ASAN_OPTIONS": "abort_on_error=1:detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([str(exe), *[h.lower() for h in (*NAME_HINTS, "#" + LAUNCH_HINT)]],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, env=env)

    @classmethod
    def build(cls, out_dir: Path) -> Driver | None:
        cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
        if not cc:
            cls.why = "no C compiler"
            return None
        exe = out_dir / "scan_driver_asan"
        r = subprocess.run([cc, "-g", "-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                            "-fno-omit-frame-pointer", "-std=gnu11", str(HERE / "scan_driver.c"), str(SCANNER), "-o",
                            str(exe)], capture_output=True, text=True)
        if r.returncode:
            cls.why = f"the sanitizer build failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}"
            return None
        return cls(exe)

    def scan(self, data: bytes, chunk: int, max_token: int = 0) -> str:
        try:
            self.proc.stdin.write(struct.pack("<IIQ", len(data), chunk, max_token) + data)
            self.proc.stdin.flush()
            answer = self.proc.stdout.read(1)
        except BrokenPipeError:
            answer = b""
        if not answer:
            self.proc.wait()
            self.err.seek(0)
            raise AssertionError(f"scanner died under the sanitizers on {data[:200]!r}...:\n"
                                 + self.err.read().decode(errors="replace")[-3000:])
        return answer.decode()

    def close(self) -> None:
        self.proc.stdin.close()
        rc = self.proc.wait(timeout=60)
        self.err.seek(0)
        report = self.err.read().decode(errors="replace")
        self.err.close()
        assert rc == 0, f"sanitizer driver exited {rc} (leaks are reported at exit):\n{report[-3000:]}"


def _load(path: Path, pure: bool):
    """load_trace through one reader: ('ok', trace) or ('refused', message)."""
    if pure:
        os.environ["COMMPROBE_PURE_PYTHON"] = "1"
    try:
        return "ok", trace.load_trace(path)
    except InputError as e:
        assert "\n" not in str(e), f"an error of more than one line: {e}"
        return "refused", str(e)
    finally:
        os.environ.pop("COMMPROBE_PURE_PYTHON", None)


def same_trace(a, b) -> None:
    """The two readers' traces are equal column by column (thread ids up to renaming)."""
    assert np.array_equal(a.ts, b.ts) and np.array_equal(a.dur, b.dur)
    assert [a.names[i] for i in a.name_id] == [b.names[i] for i in b.name_id]
    assert [a.cats[i] for i in a.cat_id] == [b.cats[i] for i in b.cat_id]
    assert (a.origin_ns, a.distributed, a.commprobe, a.rank) == (b.origin_ns, b.distributed, b.commprobe, b.rank)
    pairs = set(zip(a.tid_id.tolist(), b.tid_id.tolist()))
    assert len(pairs) == len(set(a.tid_id.tolist())) == len(set(b.tid_id.tolist()))
    assert [a.args(i) for i in range(len(a.ts))] == [b.args(i) for i in range(len(b.ts))]
    assert np.array_equal(a.arg_seq, b.arg_seq) and np.array_equal(a.arg_corr, b.arg_corr)


def check(data: bytes, chunk: int, gz: bool, work: Path, driver: Driver | None, analyzed: bool = True) -> str:
    """The property, for one case: the sanitized scanner survives it; both readers accept it with
    equal traces or both refuse it in one line; an accepted trace analyzes without a traceback."""
    if driver is not None:
        driver.scan(data, chunk)
    path = work / ("case.json.gz" if gz else "case.json")
    path.write_bytes(gzip.compress(data, 1) if gz else data)
    old = limits.CHUNK
    limits.CHUNK = chunk or old
    try:
        fast, slow = _load(path, False), _load(path, True)
    finally:
        limits.CHUNK = old
    assert fast[0] == slow[0], f"the readers disagree: scanner {fast[0]} ({fast[1] if fast[0] != 'ok' else ''}), " \
                               f"msgspec {slow[0]} ({slow[1] if slow[0] != 'ok' else ''})"
    if fast[0] == "ok":
        same_trace(fast[1], slow[1])
        if analyzed:
            try:
                analyze(path)
            except InputError as e:
                assert "\n" not in str(e)
    return fast[0]
