"""Hang forensics (issue: hang forensics from torch's Flight Recorder): real Flight Recorder records
from torch 2.13 on gloo, written by `commprobe profile` when a rank hangs or fails, diagnosed per
process group; NCCL-format dumps with their timings; dumps from elsewhere read without trusting them.

The truth for each injected fault is read from the raw records (plain pickle on our own files) and
the source lines, never from the diagnosis."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

from commprobe.analyzers.hang import analyze_hang
from tests.conftest import ROOT, assert_one_line_exit_2, run_cli

def _invariants():
    import importlib.util

    spec = importlib.util.spec_from_file_location("invariants", ROOT / "bench" / "invariants.py")
    inv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(inv)
    return inv


FAST = ["--preset", "tiny", "--steps", "4", "--repeats", "2", "--prompt-len", "16", "--timeout", "18"]


def _line_of(path: Path, text: str, after: str | None = None) -> int:
    lines = path.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if after in ln) if after else 0
    return next(i + 1 for i in range(start, len(lines)) if text in lines[i])


def _raw(out: Path, rank: int) -> dict:
    return pickle.loads((out / "flight_recorder" / f"rank{rank}.fr.pkl").read_bytes())  # our own file: trusted here


def _profile(tmp_path, fault: str, *extra: str) -> tuple[Path, object]:
    out = tmp_path / "run"
    r = run_cli("profile", *FAST, *extra, "--out", str(out), env={"COMMPROBE_FAULT": fault})
    assert r.returncode == 1, r.stderr
    return out, r


def test_a_hung_rank_is_found_missing_with_its_group_seq_and_stack_lines(tmp_path):
    out, r = _profile(tmp_path, "hang:1")
    # truth from the raw records: rank 0's last collective on the default group is entered and not
    # retired; rank 1 never enqueued that sequence number
    last0 = [e for e in _raw(out, 0)["entries"] if e["pg_id"] == 0][-1]
    seqs1 = {e["collective_seq_id"] for e in _raw(out, 1)["entries"] if e["pg_id"] == 0}
    assert not last0["retired"] and last0["collective_seq_id"] not in seqs1
    op, seq = last0["profiling_name"].split(":")[1], last0["collective_seq_id"]
    res = analyze_hang(out)
    assert _invariants().check_hang(res, out / "flight_recorder") == []
    (f,) = res["findings"]
    assert (f["kind"], f["seq"], f["op"], f["missing"], f["concerned"], f["ranks"], f["axis"]) == \
        ("missing_rank", seq, op, [1], [0], [0, 1], "tp")
    # where each waits, checked against the source: rank 0 in the barrier before prefill, rank 1 in the fault's sleep
    assert f["stacks"]["0"]["file"].endswith("probe/run.py")
    assert f["stacks"]["0"]["line"] == _line_of(ROOT / "probe" / "run.py", "dist.barrier()", after="setup_cache")
    assert f["stacks"]["1"]["file"].endswith("probe/faults.py")
    assert f["stacks"]["1"]["line"] == _line_of(ROOT / "probe" / "faults.py", "time.sleep(3600)")
    # profile's hang line carries the finding, and `commprobe hang` prints it
    assert f"rank 1 never entered TP {op} seq {seq} (group [0, 1]); rank 0 waits in it at probe/run.py:" in r.stderr
    h = run_cli("hang", str(out))
    assert h.returncode == 0 and "missing_rank" in h.stdout
    doc = json.loads(run_cli("hang", str(out), "--json").stdout)
    assert doc["schema"] == "commprobe.hang/2" and doc["findings"] == res["findings"]


def test_a_collective_type_mismatch(tmp_path):
    out, r = _profile(tmp_path, "mismatch:1")
    e0 = [e for e in _raw(out, 0)["entries"] if "all_gather" in e["profiling_name"] or not e["retired"]]
    e1 = {e["collective_seq_id"]: e for e in _raw(out, 1)["entries"]}
    seq = next(e["collective_seq_id"] for e in e0 if e1.get(e["collective_seq_id"], {}).get("profiling_name")
               not in (None, e["profiling_name"]))
    (f,) = analyze_hang(out)["findings"]
    assert (f["kind"], f["seq"], f["values"]) == ("type_mismatch", seq, {"0": "all_reduce", "1": "all_gather"})
    model = ROOT / "reference_impl" / "model.py"
    assert f["stacks"]["1"]["file"].endswith("reference_impl/model.py")
    assert f["stacks"]["1"]["line"] == _line_of(model, "return self.reduce(self.wo(y))")
    assert "ranks disagree on the op: rank 0: all_reduce, rank 1: all_gather" in r.stderr


def test_a_size_mismatch_kills_a_rank_and_is_named_from_its_log_and_the_peers_records(tmp_path):
    """gloo aborts the rank that receives more than it expects (a C++ abort: no Python handler
    runs, so its records are lost); its log keeps gloo's message and faulthandler's stack."""
    out, r = _profile(tmp_path, "size:1")
    assert "killed by SIGABRT" in r.stderr
    log = (out / "ranks" / "rank1.log").read_text()
    assert "Received data size doesn't match expected size" in log
    last0 = [e for e in _raw(out, 0)["entries"] if e["pg_id"] == 0][-1]
    (f,) = analyze_hang(out)["findings"]
    assert (f["kind"], f["seq"], f["op"]) == ("size_mismatch", last0["collective_seq_id"], "all_reduce")
    assert f["stacks"]["1"]["line"] == _line_of(ROOT / "reference_impl" / "model.py", "return self.reduce(self.wo(y))")
    assert not (out / "flight_recorder" / "rank1.fr.pkl").exists()


def test_four_ranks_tp_by_cp_a_hung_rank_in_its_own_groups(tmp_path):
    out, _ = _profile(tmp_path, "hang:3", "--tp", "2", "--cp", "2", "--oversubscribe")
    layout = json.loads((out / "manifest.json").read_text())["world"]["layout"]
    mine = {"tp": [row["rank"] for row in layout if row["tp_group"] == layout[3]["tp_group"]],
            "cp": [row["rank"] for row in layout if row["cp_group"] == layout[3]["cp_group"]],
            "world": [0, 1, 2, 3]}
    res = analyze_hang(out)
    assert _invariants().check_hang(res, out / "flight_recorder") == []  # torch's own records, read raw
    (root,) = res["findings"]  # one cause (rank 3's host), the other groups behind it
    assert root["missing"] == [3] and root["cause"] == "host"
    assert all(c["missing"] == [3] for c in root["consequences"] if c["kind"] == "missing_rank")
    for f in [root, *root["consequences"]]:
        assert f["kind"] == "missing_rank" and f["ranks"] == mine[f["axis"]], f


# --- dumps from elsewhere -------------------------------------------------------------------------

def _entry(seq, op, sizes=((4, 4),), state="completed", started=0, pg=("0", "default_pg"), record=0):
    """An NCCL Flight Recorder entry as PyTorch's own tests build one
    (pytorch/pytorch test/distributed/flight_recorder/test_fr_analysis.py, create_one_entry), with the
    start time NCCL records (time_discovered_started_ns)."""
    return {"record_id": record, "pg_id": int(pg[0]), "process_group": pg, "collective_seq_id": seq, "p2p_seq_id": 0,
            "op_id": seq, "profiling_name": f"nccl:{op}", "time_created_ns": 1_700_000_000_000_000_000 + seq,
            "input_sizes": [list(s) for s in sizes], "input_dtypes": ["Float"], "output_sizes": [list(s) for s in sizes],
            "output_dtypes": ["Float"], "state": state, "time_discovered_started_ns": started,
            "time_discovered_completed_ns": None, "retired": state == "completed", "timeout_ms": 600000,
            "is_p2p": False, "frames": [{"name": "train_step", "filename": "/job/train.py", "line": 40 + seq}]}


def _dump(entries, ranks="[0, 1]") -> dict:
    return {"version": "2.10", "comm_lib_version": "2.21.5", "pg_config": {"0": {"name": "0", "desc": "default_pg",
            "ranks": ranks}}, "pg_status": {}, "entries": entries}


def _write(d: Path, rank: int, doc: dict, as_json: bool = False) -> None:
    d.mkdir(exist_ok=True)
    p = d / f"nccl_trace_rank_{rank}"
    p.write_bytes(json.dumps(doc).encode() if as_json else pickle.dumps(doc))


def test_nccl_dumps_stuck_in_transfer_with_who_started_last(tmp_path):
    d = tmp_path / "dumps"
    t0 = 1_800_000_000_000_000_000
    _write(d, 0, _dump([_entry(1, "all_reduce"), _entry(2, "all_reduce", state="started", started=t0)]))
    _write(d, 1, _dump([_entry(1, "all_reduce"), _entry(2, "all_reduce", state="started", started=t0 + 3_500_000_000)]),
           as_json=True)
    (f,) = analyze_hang(d)["findings"]
    assert (f["kind"], f["seq"], f["started_last"]) == ("stuck_in_transfer", 2, 1)
    assert f["waited_s"] == {"0": 3.5, "1": 0.0}
    assert f["stacks"]["0"] == {"file": "/job/train.py", "line": 42, "name": "train_step"}


def test_nccl_dumps_size_and_dtype_mismatch(tmp_path):
    d = tmp_path / "dumps"
    _write(d, 0, _dump([_entry(1, "all_reduce"), _entry(2, "all_gather", sizes=((8,),), state="scheduled")]))
    _write(d, 1, _dump([_entry(1, "all_reduce"), _entry(2, "all_gather", sizes=((6,),), state="scheduled")]))
    (f,) = analyze_hang(d)["findings"]
    assert (f["kind"], f["seq"], f["values"]) == ("size_mismatch", 2, {"0": [[8]], "1": [[6]]})
    d2 = tmp_path / "dumps2"
    e = _entry(1, "all_reduce")
    _write(d2, 0, _dump([e]))
    _write(d2, 1, _dump([{**e, "input_dtypes": ["BFloat16"]}]))
    assert analyze_hang(d2)["findings"][0]["kind"] == "dtype_mismatch"


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


MARKER = Path("/tmp") / f"commprobe-pwned-{os.getpid()}"


def _one_line_exit_2(path: Path, needle: str) -> None:
    assert_one_line_exit_2(run_cli("hang", str(path)), needle)


def test_a_hostile_pickle_is_refused_without_running(tmp_path):
    d = tmp_path / "dumps"
    d.mkdir()
    (d / "nccl_trace_rank_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [_Payload()]}))
    MARKER.unlink(missing_ok=True)
    _one_line_exit_2(d, "refused: the pickle uses STACK_GLOBAL, which can run code")
    assert not MARKER.exists()


def test_truncated_partial_and_mixed_dumps(tmp_path):
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "nccl_trace_rank_0").write_bytes(pickle.dumps(_dump([_entry(1, "all_reduce")]))[:50])
    _one_line_exit_2(cut, "truncated or not a pickle")
    # one rank only: a stated partial answer
    one = tmp_path / "one"
    _write(one, 0, _dump([_entry(1, "all_reduce"), _entry(2, "all_reduce", state="scheduled")]))
    res = analyze_hang(one)
    assert res["notes"] == ["no records from rank(s) [1]: a partial answer from ranks [0]"]
    # two jobs mixed: records days apart
    mixed = tmp_path / "mixed"
    _write(mixed, 0, _dump([_entry(1, "all_reduce")]))
    late = _entry(1, "all_reduce")
    late["time_created_ns"] += 3 * 86400 * 10**9
    _write(mixed, 1, _dump([late]))
    _one_line_exit_2(mixed, "dumps of two jobs mixed?")
    _one_line_exit_2(tmp_path / "nothing-here", "no such file or directory")
    (tmp_path / "empty").mkdir()
    _one_line_exit_2(tmp_path / "empty", "no Flight Recorder dumps")


def test_the_last_collectives_before_the_hang_from_kineto_traces_beside_the_dumps(tmp_path):
    """record_param_comms' Seq is the Flight Recorder's collective_seq_id (PyTorch writes it for
    NCCL; gloo's CPU traces in torch 2.13 have no record_param_comms, checked in the real-run tests
    above, so this one is NCCL-shaped)."""
    from tests.kineto_events import rpc, write

    d = tmp_path / "dumps"
    t0 = 1_800_000_000_000_000_000
    _write(d, 0, _dump([_entry(q, "all_reduce") for q in (1, 2, 3)] + [_entry(4, "all_gather", state="started",
                                                                             started=t0)]))
    _write(d, 1, _dump([_entry(q, "all_reduce") for q in (1, 2, 3)]))
    for r in (0, 1):
        events = [rpc(100.0 * q, 10, "allreduce", 16, group="0", seq=q, group_size=2) for q in (1, 2, 3)]
        if r == 0:
            events.append(rpc(400.0, 10, "allgather", 16, group="0", seq=4, group_size=2))
        write(d / f"rank{r}.trace.json.gz", events, rank=r, world=2)
    (f,) = analyze_hang(d)["findings"]
    assert (f["kind"], f["seq"], f["missing"]) == ("missing_rank", 4, [1])
    assert f["before"] == {"0": [{"seq": 2, "op": "allreduce"}, {"seq": 3, "op": "allreduce"},
                                 {"seq": 4, "op": "allgather"}],
                           "1": [{"seq": 1, "op": "allreduce"}, {"seq": 2, "op": "allreduce"},
                                 {"seq": 3, "op": "allreduce"}]}


def test_dumps_are_found_by_content_whatever_their_prefix(tmp_path):
    """TORCH_FR_DUMP_TEMP_FILE can be any prefix: torch writes prefix + rank. Dumps named
    `/scratch/job42/dump-0` and `dump-1` (no 'trace', 'fr' or 'flight' in the name) are found by
    what they hold (a pickle or JSON with an entries list); a log and a config beside them are not dumps."""
    d = tmp_path / "dumps"
    d.mkdir()
    t0 = 1_800_000_000_000_000_000
    (d / "dump-0").write_bytes(pickle.dumps(_dump([_entry(1, "all_reduce"),
                                                   _entry(2, "all_reduce", state="started", started=t0)])))
    (d / "dump-1").write_bytes(json.dumps(_dump([_entry(1, "all_reduce"), _entry(2, "all_reduce", state="started",
                                                                               started=t0 + 2_000_000_000)])).encode())
    (d / "job.log").write_text("NCCL watchdog timeout on rank 1\n")
    (d / "config-7.json").write_text(json.dumps({"world": 2}))
    res = analyze_hang(d)
    assert res["ranks"] == [0, 1]
    (f,) = res["findings"]
    assert (f["kind"], f["seq"], f["started_last"]) == ("stuck_in_transfer", 2, 1)


# --- a 16-rank NCCL MoE job (tests/fr_jobs.py: simulated, its truth from the simulation) -----------

def _first_line(d: Path) -> str:
    r = run_cli("hang", str(d))
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()[0]


def test_a_16_rank_job_whose_gpus_stop_completing_puts_them_first_with_the_rest_as_consequences(tmp_path):
    from tests.fr_jobs import write_job

    for i, (seed, as_json, stale) in enumerate(((0, False, False), (1, True, False), (2, False, True))):
        d = tmp_path / f"job{i}"
        t = write_job(d, "device", faulted=(5, 6), seed=seed, as_json=as_json, stale=stale)
        res = analyze_hang(d)
        root = res["findings"][0]
        assert (root["kind"], root["group"], root["op"], root["seq"]) == ("device_stalled", t.group, t.op, t.seq)
        assert root["missing"] == t.faulted and sorted(map(int, root["stalled"])) == t.faulted
        assert root["completed_through"] == t.peers_completed
        assert {int(r): q - 1 for r, q in root["stalled"].items()} == t.faulted_completed
        # every other group is a consequence of it, none another root (no "link fault" among them)
        assert len(res["findings"]) == 1 and root["consequences"]
        assert all(c["role"] == "consequence" and "link fault" not in c["summary"] for c in root["consequences"])
        first = _first_line(d)
        assert first.startswith("root cause (device_stalled): ranks 5, 6 stopped completing GPU work")
        assert f"never entered all_to_all seq {t.seq}" in first or "never entered" in run_cli("hang", str(d)).stdout


def test_a_16_rank_job_whose_hosts_stop_names_them_missing_first_with_or_without_their_dumps(tmp_path):
    from tests.fr_jobs import write_job

    t = write_job(tmp_path / "host", "host", faulted=(5, 6), seed=3)
    (root,) = analyze_hang(tmp_path / "host")["findings"]
    assert (root["kind"], root["group"], root["seq"], root["missing"], root["cause"]) == \
        ("missing_rank", t.group, t.seq, [5, 6], "host")
    assert _first_line(tmp_path / "host").startswith(f"root cause (missing_rank): ranks 5, 6 never entered all_to_all "
                                                     f"seq {t.seq}")
    t = write_job(tmp_path / "gone", "host", faulted=(5, 6), seed=3, dumpless=True)
    res = analyze_hang(tmp_path / "gone")
    (root,) = res["findings"]
    assert (root["kind"], root["group"], root["seq"], root["missing"]) == ("no_records", t.group, t.seq, [5, 6])
    assert res["notes"] == ["no records from rank(s) [5, 6]: a partial answer from ranks "
                            f"{[r for r in range(16) if r not in (5, 6)]}"]


def test_uneven_all_to_all_is_not_a_mismatch_but_a_wrong_total_is(tmp_path):
    """MoE dispatch sends what each rank's tokens routed: inputs differ by rank (4107/4034 rows of
    5120, as in the real job); only what all send against what all receive must agree."""
    d = tmp_path / "even"
    a2a = [_entry(1, "all_to_all", sizes=((4107, 5120),)), _entry(1, "all_to_all", sizes=((4034, 5120),))]
    a2a[0]["output_sizes"], a2a[1]["output_sizes"] = [[4034, 5120]], [[4107, 5120]]
    _write(d, 0, _dump([a2a[0]]))
    _write(d, 1, _dump([a2a[1]]))
    assert analyze_hang(d)["findings"] == []
    bad = tmp_path / "bad"
    a2a[1]["output_sizes"] = [[4000, 5120]]
    _write(bad, 0, _dump([a2a[0]]))
    _write(bad, 1, _dump([a2a[1]]))
    (f,) = analyze_hang(bad)["findings"]  # (4107 + 4034) x 5120 sent, (4034 + 4000) x 5120 received
    assert f["kind"] == "size_mismatch" and "sends 41,681,920 elements in all and receives 41,134,080" in f["summary"]


def test_pg_status_is_read_before_saying_none_completed(tmp_path):
    """Two ranks whose entries still read 'scheduled' (a trimmed ring, states not updated): their
    pg_status says rank 0 completed seq 3 and rank 1 seq 1, so rank 1's device is behind, not a link."""
    d = tmp_path / "status"
    for r, done in ((0, 3), (1, 1)):
        doc = _dump([_entry(q, "all_reduce", state="scheduled") for q in (2, 3, 4)][: 3 if r == 0 else 2])
        doc["pg_status"] = {"0": {"last_enqueued_collective": "4" if r == 0 else "3",
                                  "last_started_collective": "-1", "last_completed_collective": str(done)}}
        _write(d, r, doc, as_json=True)
    (f,) = analyze_hang(d)["findings"]
    assert (f["kind"], f["stalled"], f["completed_through"], f["missing"], f["seq"]) == \
        ("device_stalled", {"1": 2}, 3, [1], 4)


def test_the_hang_invariants_hold_over_built_jobs_and_fire_on_broken_results(tmp_path):
    """bench/invariants.py check_hang, from the raw dumps: over 16-rank jobs of every fault (seeds,
    trims, pickle and JSON, states kept or not), and it fires on a result altered to break it."""
    import copy

    from tests.fr_jobs import write_job

    inv = _invariants()
    for i in range(12):
        d = tmp_path / f"j{i}"
        t = write_job(d, ("device", "host")[i % 2], faulted=((5, 6), (9,), (12, 15))[i % 3], seed=i,
                      as_json=i % 4 == 1, stale=i % 3 == 2, dumpless=i % 5 == 4, trim=((3, 43), (1, 5), (40, 90))[i % 3])
        res = analyze_hang(d)
        assert inv.check_hang(res, d) == [], i
        root = res["findings"][0]  # the simulation's truth in the first finding
        assert (root["group"], root["seq"], root["missing"]) == (t.group, t.seq, t.faulted), (i, root["summary"])
    broken = copy.deepcopy(res)
    root = broken["findings"][0]
    root["missing"] = [r for r in root["ranks"] if r not in root["missing"]][:1]
    assert any("named missing" in b for b in inv.check_hang(broken, d))
    broken = copy.deepcopy(res)
    broken["findings"][0]["consequences"][0]["blocked_by"]["seq"] = -7
    assert any("without its root" in b for b in inv.check_hang(broken, d))


def test_analyze_on_a_directory_of_dumps_points_at_hang(tmp_path):
    from tests.fr_jobs import write_job

    write_job(tmp_path / "dumps", "host", seed=1)
    assert_one_line_exit_2(run_cli("analyze", str(tmp_path / "dumps")), "commprobe hang")
