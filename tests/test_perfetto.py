"""The merged Perfetto trace (issue: look at it in Perfetto): `commprobe analyze PATH --perfetto OUT`.
Truths from the raw files by this test's own counting; the added tracks against the analysis'
numbers; offsets as stated; the file read back by commprobe's own reader; memory within the
analysis' bound."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commprobe.analyzers.perfetto import ARRIVED, PHASES, TRACK, WAITING, export
from commprobe.analyzers.readers.files import trace_files
from commprobe.analyzers.readers.sources import traces_in
from tests.conftest import assert_one_line_exit_2, run_cli


def _load(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _raw_x(path: Path) -> int:
    """Complete events in a raw Kineto JSON file, counted here."""
    with gzip.open(path, "rt") as f:
        return sum(1 for e in json.load(f)["traceEvents"] if e.get("ph") == "X")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A real TP=2 bundle whose rank 1 stalls 1 ms before every layer: rank 0 waits for it."""
    out = tmp_path_factory.mktemp("pf") / "run"
    r = run_cli("profile", "--preset", "tiny", "--tp", "2", "--steps", "6", "--repeats", "1", "--prompt-len", "16",
                "--backend", "dda", "--out", str(out), env={"COMMPROBE_FAULT": "host-stall:1@1000"})
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def test_every_rank_every_event_and_the_findings_as_tracks(bundle, tmp_path):
    out = tmp_path / "merged.json.gz"
    done = export(bundle, out)
    res, doc = done["result"], _load(out)
    ev = doc["traceEvents"]
    # one process per rank, named
    names = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    # the original events: as many per rank as the raw file holds (counted here)
    for r, f in enumerate(sorted(bundle.glob("rank*.trace.json.gz"))):
        mine = [e for e in ev if e["ph"] == "X" and e["pid"] == r and e["tid"] < TRACK]
        assert len(mine) == _raw_x(f) == done["written"][r]["events"]
    by_rank = {rk["rank"]: rk for rk in res["ranks"]}
    for r, rk in by_rank.items():
        slices = [e for e in ev if e["ph"] == "X" and e["pid"] == r and e["tid"] >= TRACK]
        # phase windows: their time is the analysis' end-to-end, each with the phase's verdict
        for ph, p in rk["phases"].items():
            win = [e for e in slices if e["tid"] == PHASES and e["name"] == ph]
            assert len(win) == p["windows"]
            assert sum(e["dur"] for e in win) == pytest.approx(p["e2e_us"], abs=0.01 * len(win))
            assert {e["args"]["verdict"] for e in win} == {res["phases"][ph]["verdict"]}
        # exposed communication: the analysis' exposed time, summed over phases
        exposed = sum(e["dur"] for e in slices if e["name"] == "exposed TP allreduce")
        want = sum(p["categories"]["tp_allreduce"]["exposed_us"] for p in rk["phases"].values())
        assert exposed == pytest.approx(want, rel=1e-4, abs=0.01 * max(1, len(slices)))
        # waiting: the analysis' waiting for the straggler, each slice naming whom it waited for
        waits = [e for e in slices if e["tid"] == WAITING]
        assert sum(e["dur"] for e in waits) == pytest.approx(res["collectives"]["ranks"][r]["wait_us"], rel=1e-4,
                                                              abs=0.01 * max(1, len(waits)))
    waits0 = [e for e in ev if e["ph"] == "X" and e["pid"] == 0 and e["tid"] == WAITING]
    late = [e for e in waits0 if e["args"].get("waiting_for") == 1]
    assert late and all(e["name"] == "waiting for rank 1" for e in late)
    assert sum(e["dur"] for e in late) > 0.8 * sum(e["dur"] for e in waits0)  # the stalled rank, mostly
    # flows: from the last arriver's call to each wait, paired by id
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert starts and starts.keys() == ends.keys()
    for k, s in starts.items():
        assert s["tid"] == ARRIVED and ends[k]["tid"] == WAITING and s["ts"] == ends[k]["ts"] and s["pid"] != ends[k]["pid"]
    # the clock, stated: base alignment, no offsets
    meta = doc["commprobe"]
    assert meta["origin_ns"] == res["origin_ns"] and meta["offsets_us"] == {"0": 0.0, "1": 0.0}
    # it reads back through commprobe's own reader: every complete event
    back = list(traces_in(out))
    assert sum(len(t.ts) for t in back) == sum(1 for e in ev if e["ph"] == "X")


def test_offsets_are_applied_as_stated(bundle, tmp_path):
    base = _load(Path(export(bundle, tmp_path / "base.json")["path"]))
    moved = export(bundle, tmp_path / "aligned.json", align="collective-end")
    doc = _load(Path(moved["path"]))
    off = {int(r): v for r, v in doc["commprobe"]["offsets_us"].items()}
    assert off == {int(r): v for r, v in moved["result"]["collectives"]["offsets_us"].items()}
    for r in (0, 1):
        a = [e["ts"] for e in base["traceEvents"] if e["ph"] == "X" and e["pid"] == r and e["tid"] < TRACK]
        b = [e["ts"] for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == r and e["tid"] < TRACK]
        assert len(a) == len(b) and b[0] == pytest.approx(a[0] - off[r], abs=0.002)


def test_cut_to_ranks_and_a_window(bundle, tmp_path):
    done = export(bundle, tmp_path / "cut.json", ranks="1", window="decode")
    doc = _load(Path(done["path"]))
    assert {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"} == {1}
    wins = done["written"][1]["windows"]["decode"]
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["tid"] < TRACK:
            assert any(e["ts"] < b + 0.01 and e["ts"] + e["dur"] > a - 0.01 for a, b in wins), e
    assert {e["name"] for e in doc["traceEvents"] if e.get("tid") == PHASES and e["ph"] == "X"} == {"decode"}
    assert doc["commprobe"]["window"] == "decode" and doc["commprobe"]["ranks"] == [1]


def test_strings_from_traces_stay_valid_json(bundle, tmp_path):
    """A name with quotes, a newline, a backslash, markup and a line separator: the file still loads and
    keeps the name as it was."""
    d = tmp_path / "odd"
    d.mkdir()
    src = sorted(bundle.glob("rank*.trace.json.gz"))[0]
    doc = json.load(gzip.open(src, "rt"))
    odd = 'a "quoted"\nname \\ <b>x</b> \u2028 ü'
    first = next(e for e in doc["traceEvents"] if e.get("ph") == "X")
    first["name"] = odd
    with gzip.open(d / src.name, "wt") as f:
        json.dump(doc, f)
    out = Path(export(d, tmp_path / "odd.json")["path"])
    back = _load(out)
    assert odd in {e.get("name") for e in back["traceEvents"]}


@pytest.mark.parametrize("source", ["facebookresearch-param", "hta/trace_filter_sampled_rank-0.json.gz",
                                    "hpcgroup-pipit/perlmutter-cloverleaf-cuda.sqlite",
                                    "amd/rocprofv3_mi350_pid908_results.json.gz", "amd/rpd_vllm_mi300_mytrace.rpd.gz"])
def test_every_reader_exports_every_event(real_traces, tmp_path, source):
    """Kineto (8 ranks), Nsight, rocprofv3 JSON and RPD: per rank, as many events as the reader reads
    (for Kineto, as many as the raw file holds, counted here)."""
    path = real_traces / source
    done = export(path, tmp_path / "x.json.gz")
    read = sorted(len(t.ts) for f in trace_files(path) for t in traces_in(f))
    assert sorted(w["events"] for w in done["written"].values()) == read
    if source.endswith(("param", ".json.gz")) and "rocprofv3" not in source:
        raw = sorted(_raw_x(f) for f in trace_files(path))
        assert read == raw
    assert len(done["written"]) == len(done["result"]["ranks"])
    _load(tmp_path / "x.json.gz")  # valid JSON


def _peak_mb(*args: str) -> float:
    code = ("import resource, sys; from commprobe.probe.cli import main; sys.argv = ['commprobe', *sys.argv[1:]]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600)
    line = [x for x in r.stderr.splitlines() if x.startswith("PEAK")]
    assert line, r.stderr[-1000:]
    return float(line[0].split()[1])


def test_memory_stays_within_the_analysis_bound(real_traces, tmp_path):
    """The largest shared set (rocprofv3's 66,000 events; the 8-rank Kineto set): exporting reads one rank
    at a time and streams it out, so its peak is the analysis' plus little."""
    for source in ("amd/rocprofv3_mi350_pid908_results.json.gz", "facebookresearch-param"):
        path = str(real_traces / source)
        alone = _peak_mb("analyze", path, "--json", "--jobs", "1")
        both = _peak_mb("analyze", path, "--json", "--jobs", "1", "--perfetto", str(tmp_path / "m.json.gz"))
        assert both <= alone * 1.25 + 40, (source, alone, both)


def test_bad_requests_are_one_line(bundle, tmp_path):
    assert_one_line_exit_2(run_cli("analyze", str(bundle), "--perfetto", str(tmp_path / "x.txt")), "must end in .json")
    assert_one_line_exit_2(run_cli("analyze", str(bundle), "--perfetto", str(tmp_path / "x.json"), "--window", "nope"),
                           "phases are")
    assert_one_line_exit_2(run_cli("analyze", str(bundle), "--ranks", "1"), "give --perfetto")
    assert_one_line_exit_2(run_cli("analyze", str(bundle), "--perfetto", str(tmp_path / "x.json"), "--ranks", "a"),
                           "--ranks")
    assert not (tmp_path / "x.json").exists()  # nothing half-written is left
    r = run_cli("analyze", str(bundle), "--perfetto", str(tmp_path / "ok.json.gz"))
    assert r.returncode == 0 and "ui.perfetto.dev" in r.stdout + r.stderr
    shutil.rmtree(tmp_path)


def test_a_rocpd_database_exports_like_the_same_scenario_in_kineto(tmp_path):
    """rocpd (SQLite, built from the rocprofiler-sdk schema: no real database is shared here) beside the
    same scenario in Kineto JSON: the same events per rank, the same added waiting."""
    from tests.test_rocpd import write_kineto, write_rocpd

    kineto, roc = tmp_path / "kineto", tmp_path / "rocpd"
    kineto.mkdir()
    roc.mkdir()
    for r in (0, 1):
        write_kineto(kineto / f"rank{r}.json", r)
        write_rocpd(roc / f"{5000 + r}_results.db", r)
    a, b = export(kineto, tmp_path / "k.json"), export(roc, tmp_path / "r.json")
    read = {r: len(t.ts) for f in trace_files(roc) for t in traces_in(f) for r in [t.rank]}
    assert {r: w["events"] for r, w in b["written"].items()} == {r: w["events"] for r, w in a["written"].items()}
    assert sorted(w["events"] for w in b["written"].values()) == sorted(read.values())
    assert [b["written"][r]["waiting_slices"] for r in (0, 1)] == pytest.approx(
        [a["written"][r]["waiting_slices"] for r in (0, 1)], abs=1e-3)
