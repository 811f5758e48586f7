"""Telemetry: the host sampler for real; fake vendor handles only to check the degradation paths."""

import json
import os
import sys
import time
import types
from types import SimpleNamespace

import pytest

from commprobe.probe.telemetry import NvmlSource, TelemetrySampler, _open_vendor_sources


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_host_sampler_reports_cores_and_this_process(tmp_path):
    with TelemetrySampler(tmp_path / "t.jsonl", 0.01, pids=lambda: {0: os.getpid()}, vendor_sources=[]) as s:
        x = 0
        t_end = time.time() + 0.4
        while time.time() < t_end:  # keep a core busy so utilization is visible
            x += 1
            if x % 10000 == 0:
                time.sleep(0)  # let the sampler thread take the GIL on a busy machine
    rows = _lines(tmp_path / "t.jsonl")
    assert len(rows) >= 5 and s.errors == 0  # 40 intervals; a loaded 2-core host delivers far fewer
    assert all(r["source"] == "host" and len(r["cpu_util_pct"]) == os.cpu_count() for r in rows)
    assert max(max(r["cpu_util_pct"]) for r in rows[1:]) > 50
    me = rows[-1]["ranks"]["0"]
    assert me["pid"] == os.getpid() and me["rss_bytes"] > 10e6 and me["ctx_voluntary"] >= 0
    ts = [r["t_ns"] for r in rows]
    assert ts == sorted(ts) and abs(ts[-1] - time.time_ns()) < 5e9  # Unix ns, the traces' clock


def test_missing_vendor_libraries_degrade_to_host_with_reasons(monkeypatch):
    broken = types.ModuleType("pynvml")

    def nvml_init():
        raise RuntimeError("NVML Shared Library Not Found")

    broken.nvmlInit = nvml_init
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import fails as without ROCm
    sources, why = _open_vendor_sources()
    assert sources == []
    assert why[0] == "NVIDIA: RuntimeError: NVML Shared Library Not Found" and why[1] == "AMD: amdsmi not installed"
    s = TelemetrySampler("/tmp/unused.jsonl")
    assert s.status_line.startswith("telemetry: host (no NVIDIA: RuntimeError")


def test_nvml_source_reads_what_the_driver_reports(monkeypatch):
    fake = SimpleNamespace(
        NVML_CLOCK_SM=0, NVML_CLOCK_MEM=1, NVML_PCIE_UTIL_TX_BYTES=0, NVML_PCIE_UTIL_RX_BYTES=1,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=87, memory=41),
        nvmlDeviceGetPowerUsage=lambda h: 612_000,
        nvmlDeviceGetClockInfo=lambda h, k: 1980 if k == 0 else 2619,
        nvmlDeviceGetPcieThroughput=lambda h, k: (_ for _ in ()).throw(RuntimeError("not supported")),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=123),
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX=138, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX=139,
        nvmlDeviceGetFieldValues=lambda h, ids: [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(ullVal=4096)),
                                                 SimpleNamespace(nvmlReturn=3, value=SimpleNamespace(ullVal=0))],
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    d = NvmlSource().sample()["devices"][0]
    assert (d["sm_util_pct"], d["mem_util_pct"], d["power_w"], d["sm_clock_mhz"]) == (87, 41, 612.0, 1980)
    assert d["pcie_tx_kBps"] is None  # a metric the driver does not report is null, not an error
    assert (d["nvlink_tx_KiB"], d["nvlink_rx_KiB"]) == (4096, None)  # RX field: NVML_ERROR_NOT_SUPPORTED


def test_link_counters_become_rates_on_the_trace_clock(tmp_path):
    """Cumulative NVLink (KiB) and XGMI (KB) counters turn into GB/s between samples."""
    from commprobe.analyzers.readers.telemetry import read_series

    f = tmp_path / "t.jsonl"
    base = 1_700_000_000_000_000_000
    rows = [{"t_ns": base + k * 500_000_000, "source": "nvidia",
             "devices": [{"gpu": 0, "sm_util_pct": 50, "nvlink_tx_KiB": k * 1_000_000, "nvlink_rx_KiB": None,
                          "pcie_tx_kBps": 2_000_000}]} for k in range(3)]
    rows += [{"t_ns": base + k * 1_000_000_000, "source": "amd",
              "devices": [{"gpu": 1, "activity": {"gfx_activity": 70}, "xgmi_read_KB": k * 5_000_000}]} for k in range(2)]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    got = read_series(f, base)
    tx = got["series"]["GPU 0 NVLink TX"]
    assert tx["unit"] == "GB/s" and tx["t_us"] == [500_000.0, 1_000_000.0]
    assert tx["v"] == [pytest.approx(1_000_000 * 1024 / 0.5 / 1e9)] * 2  # 2.048 GB/s
    assert "GPU 0 NVLink RX" not in got["series"] and got["series"]["GPU 0 PCIe TX"]["v"][0] == 2.0
    assert got["series"]["GPU 1 XGMI read"]["v"] == [pytest.approx(5.0)] and got["errors"] == 1


def test_a_failing_source_never_reaches_the_workload(tmp_path):
    class Broken:
        name = "nvidia"

        def sample(self):
            raise OSError("device fell off the bus")

    with TelemetrySampler(tmp_path / "t.jsonl", 0.01, vendor_sources=[Broken()]) as s:
        time.sleep(0.15)
    assert s.errors >= 5
    assert {r["source"] for r in _lines(tmp_path / "t.jsonl")} == {"host"}
