"""The collective sweep: rows, bandwidth factors, JSON output, bad input."""

import json

import pytest

from commprobe.common.units import human_size, parse_size
from commprobe.probe.bench.sweep import bus_factor
from tests.conftest import run_cli


def test_sizes_and_factors():
    assert parse_size("4K") == 4096 and parse_size("64M") == 64 << 20 and parse_size("1GiB") == 1 << 30
    assert parse_size("100") == 100 and human_size(4096) == "4K" and human_size(100) == "100"
    with pytest.raises(ValueError):
        parse_size("lots")
    assert bus_factor("allreduce", 4) == 1.5 and bus_factor("all_to_all", 4) == 0.75  # nccl-tests' factors


def test_sweep_json_rows_are_consistent():
    r = run_cli("bench", "collectives", "--backend", "gloo,dda", "--op", "allreduce,all_to_all",
                "--min", "4K", "--max", "16K", "--batches", "2", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {(x["backend"], x["op"], x["bytes"]) for x in rows} == {
        (b, o, s) for b in ("gloo", "dda") for o in ("allreduce", "all_to_all") for s in (4096, 16384)}
    for x in rows:
        assert x["world"] == 2 and x["dtype"] == "float32" and x["time_us"] > 0
        assert x["algbw_GBps"] == pytest.approx(x["bytes"] / x["time_us"] / 1e3)
        assert x["busbw_GBps"] == pytest.approx(x["algbw_GBps"] * bus_factor(x["op"], 2))
        assert len(x["batches_us"]) == 2
        assert min(x["batches_us"]) <= x["p10_us"] <= x["time_us"] <= x["p90_us"] <= max(x["batches_us"])
        if x["backend"] == "dda":
            assert x["vs"] is None  # the reference
        else:
            ref = next(y for y in rows if y["backend"] == "dda" and (y["op"], y["bytes"]) == (x["op"], x["bytes"]))
            assert x["vs"]["ratio"] == pytest.approx(x["time_us"] / ref["time_us"])
            assert x["vs"]["low"] == pytest.approx(x["p10_us"] / ref["p90_us"])


def test_spread_and_beyond_the_noise():
    """p10/p50/p90 over batches; two variants differ beyond the noise only where their p10-p90
    ranges are apart, and the ratio's range runs from p10/p90 to p90/p10."""
    from commprobe.probe.bench.sweep import attach_versus, spread

    assert spread([5.0]) == (5.0, 5.0, 5.0)
    p10, p50, p90 = spread([10.0, 20.0, 30.0, 40.0, 50.0])
    assert (p10, p50, p90) == (pytest.approx(14.0), 30.0, pytest.approx(46.0))
    row = {"op": "allreduce", "bytes": 4096}
    rows = attach_versus([{**row, "backend": "dda", "time_us": 10.0, "p10_us": 9.0, "p90_us": 11.0},
                          {**row, "backend": "gloo", "time_us": 30.0, "p10_us": 25.0, "p90_us": 40.0},
                          {**row, "backend": "deepspeed", "time_us": 11.0, "p10_us": 10.5, "p90_us": 14.0}])
    assert rows[0]["vs"] is None
    assert rows[1]["vs"] == {"backend": "dda", "ratio": 3.0, "low": pytest.approx(25 / 11), "high": pytest.approx(40 / 9),
                             "beyond_noise": True}
    assert rows[2]["vs"]["beyond_noise"] is False  # 10.5-14 overlaps 9-11


def test_pinned_variants_bind_each_rank_to_its_own_core_and_alternate():
    """`<backend>+pin`: the rank is bound to one core for that variant's batches and freed again
    for the next variant's; the sweep runs both in one launch."""
    from commprobe.probe.launch import launch
    from tests import workers

    every = sorted(__import__("os").sched_getaffinity(0))
    got = launch(workers.pin_placement, 2, (), timeout=120)
    for rank, (pinned, free) in enumerate(got):
        assert pinned == [every[rank % len(every)]] and free == every
    r = run_cli("bench", "collectives", "--backend", "dda,dda+pin,gloo+pin", "--min", "4K", "--max", "4K",
                "--batches", "3", "--json")
    assert r.returncode == 0, r.stderr
    assert [x["backend"] for x in json.loads(r.stdout)] == ["dda", "dda+pin", "gloo+pin"]


def test_missing_peer_is_reported_not_fatal():
    r = run_cli("bench", "collectives", "--backend", "dda,deepspeed", "--min", "4K", "--max", "4K", "--batches", "1")
    assert r.returncode == 0, r.stderr
    try:
        import deepspeed  # noqa: F401
    except Exception:
        assert "backend deepspeed skipped: deepspeed is not installed" in r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--backend", "mpi"], "unknown backend 'mpi'"),
    (["--op", "gather"], "unknown op 'gather'"),
    (["--min", "lots"], "not a size"),
    (["--min", "1M", "--max", "4K"], "need --min <= --max"),
    (["--load", "-1"], "--load must be 0 or more"),
    (["--backend", "dda-nap"], "unknown backend 'dda-nap'"),
    (["--backend", "mpi+pin"], "unknown backend 'mpi'"),
    (["--backend", "dda+pin,dda+pin"], "lists a backend twice"),
])
def test_bad_sweep_arguments(args, needle):
    r = run_cli("bench", "collectives", *args)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1


def _busy_processes() -> list[int]:
    """Pids of the bench's competing busy processes (probe/bench/load.py) still alive."""
    from pathlib import Path

    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and b"end = time.monotonic()" in (d / "cmdline").read_bytes():
                out.append(int(d.name))
        except OSError:
            pass
    return out


def test_sweep_under_load_names_it_and_leaves_nothing_running():
    """`--load 1`: wait modes side by side beside one busy process, which the bench starts,
    and stops when the sweep ends."""
    from commprobe.probe.bench.load import busy_load

    with busy_load(2, 30) as procs:  # the context manager itself: started, then gone
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs)
    r = run_cli("bench", "collectives", "--backend", "dda-futex,dda-spin,dda-adaptive", "--load", "1",
                "--min", "4K", "--max", "64K", "--factor", "16", "--batches", "2")
    assert r.returncode == 0, r.stderr
    assert "beside 1 busy process" in r.stdout and "vs dda-futex" in r.stdout
    assert r.stdout.count("dda-spin") >= 2 and not _busy_processes()


def test_time_sharing_benchmark_rows():
    """`bench time-sharing`: one rank per core against more ranks than cores in one launch; the
    rows carry what `plan calibrate` reads, consistent with their own per-round times."""
    import statistics

    from commprobe.collectives.dda import usable_cores

    cores = usable_cores()
    r = run_cli("bench", "time-sharing", "--world", str(cores + 1), "--work", "64K", "--rounds", "3", "--json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    s = (cores + 1) / cores
    assert row["bench"] == "time-sharing" and row["world"] == cores + 1 and row["cores"] == cores
    assert len(row["base_us"]) == len(row["shared_us"]) == 3 and row["work_bytes"] == 64 << 10
    assert row["interval_us"] == pytest.approx(s * statistics.median(row["base_us"]))
    assert row["extra_us"] == pytest.approx(max(0.0, statistics.median(row["shared_us"]) - row["interval_us"]) / (s - 1))
    r = run_cli("bench", "time-sharing", "--world", str(cores))
    assert r.returncode == 2 and "must exceed" in r.stderr and len(r.stderr.strip().splitlines()) == 1
