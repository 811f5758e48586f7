"""A contended host: how much of the CPUs other work took while the ranks ran, from the probe's
host telemetry, and what it keeps the cause analysis from naming. The bundles in
tests/data/runs/host-contention-tp2-dda are real runs of the reference model (README there): a
healthy calibration, a healthy run beside one busy process, and a quiet healthy run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commprobe.analyzers.analysis import analyze
from commprobe.analyzers.readers.telemetry import CONTENDED_CORES, host_contention

RUNS = Path(__file__).parent / "data" / "runs" / "host-contention-tp2-dda"


def _raw_other_cores(path: Path) -> float:
    """Our own reading of the raw lines: (busy - interrupts - ranks' CPU - the sampler's) over the
    first to the last sample."""
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    recs = [r for r in recs if r.get("source") == "host" and r.get("ranks")]
    a, b = recs[0], recs[-1]

    def own(r):
        return sum(d["cpu_ns"] for d in r["ranks"].values()) + r["sampler"]["cpu_ns"] + r["cpu_irq_ns"]

    return max(0.0, (b["cpu_busy_ns"] - a["cpu_busy_ns"]) - (own(b) - own(a))) / (b["t_ns"] - a["t_ns"])


def test_a_run_beside_a_busy_process_reads_contended_and_names_no_slower_transport():
    res = analyze(RUNS / "contended", calibration=RUNS / "calibration")
    c = res["phases"]["decode"]["communication_cause"]
    host = c["host"]
    raw = _raw_other_cores(RUNS / "contended" / "telemetry.jsonl")
    assert 0.5 < raw < 1.0 and host["other_cores"] == pytest.approx(raw, abs=1e-9)  # one busy process of 2 cores
    assert host["contended"] and host["cores"] == 2 and host["busy_cores"] > 1.9
    # the evidence that named a slower transport before: its fastest tenth >= 2x the calibration's
    w = c["slow_transfer_withheld"]
    assert w["floor_ratio"] >= 2.0 and w["ratio"] > 10
    assert "slow-transfer" not in [x["cause"] for x in c["causes"]]
    notes = res["phases"]["decode"]["notes"]
    assert any("cannot be told from a contended host" in n and f"{raw:.2f} of the host's 2 cores" in n for n in notes)


def test_a_quiet_run_reads_uncontended_and_carries_no_host_note():
    res = analyze(RUNS / "quiet", calibration=RUNS / "calibration")
    c = res["phases"]["decode"]["communication_cause"]
    raw = _raw_other_cores(RUNS / "quiet" / "telemetry.jsonl")
    assert raw < CONTENDED_CORES and c["host"]["other_cores"] == pytest.approx(raw, abs=1e-9)
    assert not c["host"]["contended"] and not c["host_notes"] and "slow_transfer_withheld" not in c
    assert c["cause"] == "none"


def _sample(t_s, busy_s, ranks_s, sampler_s=0.0, steal_s=0.0, pids=(10, 11), irq_s=0.0):
    ns = 1_000_000_000
    return json.dumps({"t_ns": int(t_s * ns), "source": "host", "cpu_util_pct": [0.0] * 4, "cores": 4,
                       "cpu_busy_ns": int(busy_s * ns), "cpu_steal_ns": int(steal_s * ns), "cpu_irq_ns": int(irq_s * ns),
                       "ranks": {str(i): {"pid": p, "cpu_ns": int(ranks_s / len(pids) * ns)} for i, p in enumerate(pids)},
                       "sampler": {"pid": 99, "cpu_ns": int(sampler_s * ns)}})


def test_contention_is_counted_over_intervals_that_saw_every_rank(tmp_path):
    f = tmp_path / "telemetry.jsonl"
    lines = [_sample(0, 0, 0), _sample(1, 3.9, 2.0, 0.1, 0.5),  # 1.8 cores of other work, 0.5 stolen
             _sample(2, 7.8, 4.0, 0.2, 1.0),
             _sample(3, 100, 50, pids=(10,)),  # a rank gone: no interval to or from it
             json.dumps({"t_ns": 4, "source": "nvidia", "devices": []}), "not json"]
    f.write_text("\n".join(lines) + "\n")
    h = host_contention(f)
    assert h["intervals"] == 2 and h["other_cores"] == pytest.approx(1.8) and h["steal_cores"] == pytest.approx(0.5)
    assert h["busy_cores"] == pytest.approx(3.9) and h["contended"]  # 3.9 of 4 cores busy
    f.write_text("\n".join([_sample(0, 0, 0), _sample(1, 2.3, 2.0)]) + "\n")  # 0.3 cores of other work, 2 free
    assert not host_contention(f)["contended"]
    # interrupts are no process's: left out; and tick noise (+-0.2 cores per 50 ms interval, summing to
    # none) is not added up as other work by clipping each interval
    f.write_text("\n".join([_sample(0, 0, 0), _sample(1, 4.0, 3.5, irq_s=0.5)]) + "\n")
    assert host_contention(f)["other_cores"] == pytest.approx(0.0)
    noisy, busy, ranks = [], 0.0, 0.0
    for i in range(41):
        noisy.append(_sample(i * 0.05, busy, ranks))
        busy, ranks = busy + 0.2, ranks + 0.2 + (0.01 if i % 2 else -0.01)
    f.write_text("\n".join(noisy) + "\n")
    h = host_contention(f)
    assert h["other_cores"] < 0.01 and h["other_cores_max"] < 0.05


def test_a_sampler_that_saw_one_of_the_hosts_ranks_tells_nothing(tmp_path):
    """Under torchrun the sampler sees its own rank and says how many ran on the host: the others'
    CPU time is theirs, not other work (1.8 cores here would otherwise read as contention)."""
    f = tmp_path / "telemetry.jsonl"
    rows = [json.loads(_sample(t, 4.0 * t, 2.0 * t, pids=(10,))) | {"ranks_on_host": 2} for t in (0, 1, 2)]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert host_contention(f) is None
    f.write_text("\n".join(json.dumps(r | {"ranks_on_host": 1}) for r in rows) + "\n")
    assert host_contention(f)["other_cores"] == pytest.approx(2.0)


def test_older_telemetry_without_the_counters_tells_nothing(tmp_path):
    f = tmp_path / "telemetry.jsonl"
    f.write_text(json.dumps({"t_ns": 1, "source": "host", "cpu_util_pct": [50.0], "ranks": {"0": {"pid": 1}}}) + "\n")
    assert host_contention(f) is None
    assert host_contention(tmp_path / "absent.jsonl") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux only")
def test_a_real_profile_beside_a_busy_process_measures_the_other_work(tmp_path):
    """A real run of ours on gloo with one process spinning beside it: the probe's counters see
    that process's core (0.67-0.74 here with DDA, whose ranks keep both cores busy)."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        subprocess.run([sys.executable, "-m", "commprobe.probe.cli", "profile", "--preset", "tiny", "--tp", "2",
                        "--steps", "8", "--repeats", "2", "--prompt-len", "16", "--backend", "dda",
                        "--out", str(tmp_path / "run")], check=True, env=env, capture_output=True, timeout=120)
    finally:
        spin.kill()
        spin.wait()
    h = host_contention(tmp_path / "run" / "telemetry.jsonl")
    assert h is not None and h["other_cores"] >= 0.3 and h["contended"], h


def test_a_run_of_ours_already_on_dda_is_not_advised_dda():
    """The contended run's small TP allreduces are latency-bound; it runs DDA already (its manifest),
    so the advice is what is left (fewer calls, overlap), not `--backend dda`."""
    res = analyze(RUNS / "contended")
    assert res["manifest"]["backend"] in ("dda", ["dda"])
    recs = [x for p in res["phases"].values() for x in p["recommendations"] if "small allreduces" in x]
    assert recs and all("already uses DDA" in x and "--backend dda" not in x for x in recs)
