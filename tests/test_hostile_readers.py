"""The readers added after the Kineto one meet hostile input as it does (issue: reliability): every
case the issue names, as a user would meet it. Each either analyzes (bad rows skipped and counted in
the reader notes) or is refused in one line with exit 2; --json is strict JSON."""

from __future__ import annotations

import json
import pickle
import random
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from commprobe.analyzers.analysis import analyze
from commprobe.analyzers.hang import analyze_hang
from commprobe.common.errors import InputError
from tests.conftest import assert_one_line_exit_2, run_cli
from tests.fuzz import readers
from tests.test_hang import _dump, _entry
from tests.test_nsys import write_nsys
from tests.test_rocpd import write_rocpd


def _strict(text: str):
    """json.loads that refuses NaN and Infinity (RFC 8259), as jq and browsers do."""
    def no(c):
        raise ValueError(f"not JSON: {c}")
    return json.loads(text, parse_constant=no)


def _edit(path: Path, *sql: str) -> None:
    db = sqlite3.connect(path)
    for q in sql:
        db.execute(q)
    db.commit()
    db.close()


@pytest.mark.parametrize("value", [None, "soon", 1e300, -5, "\udc80"])
def test_a_bad_value_in_a_kernels_start_or_device_skips_those_rows_and_says_so(tmp_path, value):
    p = tmp_path / "run.sqlite"
    write_nsys(p)
    db = sqlite3.connect(p)
    for q in ("CREATE TABLE k AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL",  # as another tool may write it: no NOT NULL
              "DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL", "ALTER TABLE k RENAME TO CUPTI_ACTIVITY_KIND_KERNEL"):
        db.execute(q)
    v = value.encode("utf-8", "surrogateescape") if isinstance(value, str) and "\udc80" in value else value
    db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = ? WHERE rowid % 4 = 0", (v,))
    db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = ? WHERE rowid % 7 = 0", (v,))
    db.commit()
    db.close()
    a = analyze(p)
    if value == -5:  # an integer: read as written (a time before the session start is still a time)
        return
    notes = " ".join(a["source"]["reader_notes"])
    assert "row(s) of CUPTI_ACTIVITY_KIND_KERNEL skipped: a value that is not an integer" in notes, notes


@pytest.mark.parametrize("case", ["no-StringIds", "no-NVTX_EVENTS", "view-to-nowhere", "bad-utf8", "pages"])
def test_broken_exports_are_one_line(tmp_path, case):
    p = tmp_path / "run.sqlite"
    write_nsys(p)
    if case == "no-StringIds":
        _edit(p, "DROP TABLE StringIds")
    elif case == "no-NVTX_EVENTS":
        _edit(p, "DROP TABLE NVTX_EVENTS")
    elif case == "view-to-nowhere":
        _edit(p, "DROP TABLE StringIds", "CREATE VIEW StringIds AS SELECT * FROM nowhere")
    elif case == "bad-utf8":
        _edit(p, "UPDATE StringIds SET value = CAST(x'fffe41' AS TEXT) WHERE id % 2 = 0")
    else:
        data = bytearray(p.read_bytes())
        rng = random.Random(3)
        for _ in range(6):
            i = rng.randrange(100, len(data))
            data[i:i + 32] = bytes(32)
        p.write_bytes(bytes(data))
    r = run_cli("analyze", str(p), "--jobs", "1", "--json")
    if r.returncode == 0:  # what still stands analyzes (a missing NVTX table: no step ranges)
        _strict(r.stdout)
    else:
        assert_one_line_exit_2(r, str(p))


def test_rocpd_without_its_metadata_is_one_line(tmp_path):
    p = tmp_path / "1_results.db"
    write_rocpd(p, 0)
    db = sqlite3.connect(p)
    name = db.execute("SELECT name FROM sqlite_master WHERE type='table' AND name LIKE 'rocpd_metadata%'").fetchone()[0]
    db.execute("DROP VIEW rocpd_metadata")
    db.execute(f"DROP TABLE {name}")
    db.commit()
    db.close()
    assert_one_line_exit_2(run_cli("analyze", str(p), "--jobs", "1"), str(p))


def _dumps(d: Path, docs, as_json=False) -> Path:
    d.mkdir(exist_ok=True)
    for r, doc in enumerate(docs):
        data = doc if isinstance(doc, bytes) else json.dumps(doc).encode() if as_json else pickle.dumps(doc)
        (d / f"nccl_trace_rank_{r}").write_bytes(data)
    return d


def test_hostile_flight_recorder_dumps(tmp_path):
    t0 = 1_800_000_000_000_000_000
    good = _dump([_entry(1, "all_reduce"), _entry(2, "all_reduce", state="started", started=t0)])
    # lists nested 50,000 deep (JSON): one line
    deep = json.dumps(good)[:-1] + ', "x": ' + "[" * 50_000 + "]" * 50_000 + "}"
    d = _dumps(tmp_path / "deep", [deep.encode(), deep.encode()])
    with pytest.raises(InputError, match="nested too deeply"):
        analyze_hang(d)
    # an integer of 5,000 digits: not a dump's JSON (refused as such, nothing else in the directory)
    huge = json.dumps(good).replace('"pg_id": 0', '"pg_id": ' + "9" * 5000).encode()
    with pytest.raises(InputError):
        analyze_hang(_dumps(tmp_path / "huge", [huge, huge]))
    # frames, stacks and groups of the wrong types; infinite and far-apart times: an answer
    bad = _dump([{**_entry(1, "all_reduce"), "frames": 7, "time_created_ns": float("inf")},
                 {**_entry(2, "all_reduce", state="started", started=t0), "frames": [{"line": "x"}, 3],
                  "input_sizes": "many", "time_discovered_started_ns": 1e300}])
    d = _dumps(tmp_path / "types", [bad, bad])
    (d / "rank0.stacks.json").write_text(json.dumps({"stacks": {"not": "a list"}, "job": [1], "error": {}}))
    (d / "rank1.groups.json").write_text(json.dumps({"groups": [1, 2]}))
    res = analyze_hang(d)
    assert res["ranks"] == [0, 1]
    r = run_cli("hang", str(d), "--json")
    assert r.returncode == 0, r.stderr
    _strict(r.stdout)  # never Infinity, never bytes


def test_hang_on_20000_groups_takes_seconds(tmp_path):
    rng = random.Random(1)
    docs = []
    for r in (0, 1):
        doc = readers.dump_doc(rng, groups=20_000)
        e0 = doc["entries"][0]
        doc["entries"] = [{**e0, "process_group": [str(g), f"pg{g}"], "pg_id": g, "collective_seq_id": 1,
                           "state": "started" if g % 1000 == 0 and r == 0 else "completed"} for g in range(20_000)]
        docs.append(doc)
    d = _dumps(tmp_path / "many", docs)
    t = time.perf_counter()
    res = analyze_hang(d)
    assert time.perf_counter() - t < 30  # 120 s before the per-dump index; ~3 s here, bounded loosely (shared CI)
    assert len(res["groups"]) == 20_000


def test_a_file_name_with_a_newline_is_one_line(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank0\nevil.json").write_text("{not json")
    r = run_cli("analyze", str(d), "--jobs", "1")
    assert_one_line_exit_2(r, "rank0\\nevil.json")


def test_every_json_output_is_strict(tmp_path, real_traces):
    for args in (("analyze", str(real_traces / "hta" / "nccl_parser_config_nccl_data.json.gz"), "--json", "--jobs", "1"),
                 ("analyze", str(real_traces / "amd" / "rpd_vllm_mi300_mytrace.rpd.gz"), "--json", "--jobs", "1")):
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
        _strict(r.stdout)
    from commprobe.common.jsonout import dumps

    assert _strict(dumps({"a": float("nan"), "b": [float("inf"), b"\xff"], 3: 1})) == {"a": None, "b": [None, "\ufffd"],
                                                                                     "3": 1}


@pytest.mark.parametrize("target", readers.TARGETS)
def test_fuzz_readers_smoke(target, tmp_path_factory):
    """A quick run of tests/fuzz/readers.py per target (bench/fuzz.py --readers runs it long)."""
    work = tmp_path_factory.mktemp(f"fuzz-{target}")
    n = {"names": 300, "flight-recorder": 25, "rpd": 40}.get(target, 60)
    seen = readers.run(target, n, seed=7, work=work, seed_files=_seed_files(tmp_path_factory))
    assert sum(seen.values()) == n


_SEEDS: dict = {}


def _seed_files(factory) -> dict:
    if not _SEEDS:
        _SEEDS.update(readers.seeds(factory.mktemp("seeds")))
    return _SEEDS


def test_the_seeds_themselves_analyze(tmp_path_factory):
    for name, f in _seed_files(tmp_path_factory).items():
        analyze(f)  # a seed that did not analyze would make every mutation a refusal
    shutil.rmtree(tmp_path_factory.getbasetemp() / "unused", ignore_errors=True)


def test_an_sqlite_table_beyond_the_memory_bound_is_one_line_naming_it(tmp_path):
    """Bounded work: an integer query stops once its rows pass what memory can analyze, naming the table."""
    p = tmp_path / "run.sqlite"
    write_nsys(p)
    _edit(p, *["INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL"] * 14)  # 24 -> 393,216 rows
    r = run_cli("analyze", str(p), "--jobs", "1", env={"COMMPROBE_MAX_TRACE_BYTES": str(100_000 * 350)})
    assert_one_line_exit_2(r, "CUPTI_ACTIVITY_KIND_KERNEL holds more than 100,000 rows")


def test_plan_and_compare_json_are_strict(tmp_path, real_traces):
    r = run_cli("plan", "--model", "llama3-70b", "--hardware", "h100x8", "--tp", "8", "--json")
    assert r.returncode == 0, r.stderr
    _strict(r.stdout)
    a = real_traces / "hta" / "trace_filter_sampled_rank-0.json.gz"
    r = run_cli("compare", str(a), str(real_traces / "hta" / "trace_filter_sampled_rank-1.json.gz"), "--json")
    assert r.returncode == 0, r.stderr
    _strict(r.stdout)


def _recursive_view(path: Path, table: str, forever: bool = True) -> None:
    """`table` replaced by a view of its own columns over a recursive CTE (that never ends)."""
    db = sqlite3.connect(path)
    cols = [r[1] for r in db.execute(f'PRAGMA table_info("{table}")')]
    db.execute(f'DROP TABLE "{table}"')
    stop = "" if forever else " WHERE x < 100"
    db.execute(f'CREATE VIEW "{table}" AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c{stop}) '
               f'SELECT {", ".join(f"x AS {c!r}" for c in cols)} FROM c')
    db.commit()
    db.close()


@pytest.mark.parametrize("fmt", ["nsys", "rpd"])
def test_a_view_that_recurses_forever_is_one_line_within_the_query_bound(tmp_path, real_traces, fmt):
    """Every SQLite query runs against a deadline (5 s on a small file, sqlite_export.Bounded): a
    view whose recursive CTE never ends is one line naming the bound, exit 2, in seconds."""
    if fmt == "nsys":
        p, table = tmp_path / "run.sqlite", "CUPTI_ACTIVITY_KIND_KERNEL"
        write_nsys(p)
    else:
        import gzip

        p, table = tmp_path / "run.rpd", "rocpd_api"
        with gzip.open(real_traces / "amd" / "rpd_vllm_mi300_mytrace.rpd.gz") as f:
            p.write_bytes(f.read())
    _recursive_view(p, table)
    t0 = time.perf_counter()
    r = run_cli("analyze", str(p), "--jobs", "1", env={"COMMPROBE_SQL_SECONDS": ""})
    took = time.perf_counter() - t0
    assert_one_line_exit_2(r, "a query ran past 5 s, the bound on one SQLite query")
    assert 4.5 < took < 20, took
    # a view that ends is read (the bound is on time, not on views)
    q = tmp_path / "ends.sqlite"
    write_nsys(q)
    _recursive_view(q, "CUPTI_ACTIVITY_KIND_MEMCPY", forever=False)
    r = run_cli("analyze", str(q), "--jobs", "1")
    assert r.returncode in (0, 2) and "a query ran past" not in r.stderr


def test_rank_from_a_group_of_other_digits_is_one_line_naming_the_regex_and_file(tmp_path, real_traces):
    """'²'.isdigit() is True and int('²') raises; '٣' is a digit int() reads as 3: a captured group
    not in ASCII digits is one line naming the pattern, the file and what it captured."""
    src = real_traces / "hta" / "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
    for digit in "²٣":
        d = tmp_path / f"d{ord(digit)}"
        d.mkdir()
        shutil.copy(src, d / f"rank{digit}_a.json.gz")
        r = run_cli("analyze", str(d), "--rank-from", f"rank({digit})", "--jobs", "1")
        assert_one_line_exit_2(r, f"--rank-from 'rank({digit})' does not match the file name with a number in ASCII "
                                  f"digits as its first group (it captured '{digit}')")
        assert f"rank{digit}_a.json.gz" in r.stderr
