"""Background telemetry sampler: NVIDIA (nvidia-ml-py), AMD (amdsmi), and always the host.

One JSON object per line and source in `telemetry.jsonl`, each stamped `t_ns` with the Unix
epoch in nanoseconds: the clock of Kineto traces, whose event time is
`ts_us * 1000 + baseTimeNanoseconds`, so reports align samples with trace phases directly.

The sampler runs in a daemon thread of the launching process (one per host) and never raises
into the workload: a source that fails to start is dropped with one line saying why, and a
sample that fails is counted, not propagated.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path


class HostSource:
    """Per-core CPU utilization from /proc/stat deltas; RSS, context switches and CPU time per rank
    process; and the host's cumulative busy and steal CPU time, so an analysis can tell how much
    of the CPUs other work took while the ranks ran (analyzers/readers/telemetry.host_contention):
    a contended host slows a CPU transport as much as a slower link would."""

    name = "host"
    TICK_NS = 1_000_000_000 // (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)

    def __init__(self, pids: Callable[[], dict[int, int]], ranks_on_host: int | None = None):
        self._pids = pids
        self._ranks_on_host = ranks_on_host  # the job's ranks here, of which `pids` may name only some
        self._prev = self._stat()[1]

    @classmethod
    def _stat(cls) -> tuple[dict, list[tuple[int, int]]]:
        """One read of /proc/stat: the whole host's busy (not idle, not iowait; steal included),
        interrupt (irq + softirq: no process's own time, though the ranks' own loopback traffic makes
        some) and steal CPU time, ns; and per core (all time, idle time) in ticks."""
        host, cores = [0] * 8, []
        with open("/proc/stat") as f:
            for line in f:
                if not line.startswith("cpu"):
                    continue
                v = [int(x) for x in line.split()[1:]] + [0] * 8
                if line[3].isdigit():
                    cores.append((sum(v[:8]), v[3] + v[4]))
                else:
                    host = v
        busy = sum(host[:8]) - host[3] - host[4]
        return ({"cpu_busy_ns": busy * cls.TICK_NS, "cpu_irq_ns": (host[5] + host[6]) * cls.TICK_NS,
                 "cpu_steal_ns": host[7] * cls.TICK_NS}, cores)

    @classmethod
    def _proc_cpu_ns(cls, pid: int) -> int | None:
        """A process's user + system CPU time over all its threads, ns (/proc/PID/stat fields 14, 15)."""
        try:
            rest = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            return (int(rest[11]) + int(rest[12])) * cls.TICK_NS
        except (OSError, ValueError, IndexError):
            return None

    def sample(self) -> dict:
        host, cur = self._stat()
        util = []
        for (t1, i1), (t0, i0) in zip(cur, self._prev):
            dt = t1 - t0
            util.append(round(100.0 * (1 - (i1 - i0) / dt), 1) if dt > 0 else 0.0)
        self._prev = cur
        ranks = {}
        for rank, pid in self._pids().items():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            ranks[str(rank)] = {
                "pid": pid,
                "rss_bytes": int(fields.get("VmRSS", "0 kB").split()[0]) * 1024,
                "ctx_voluntary": int(fields.get("voluntary_ctxt_switches", "0")),
                "ctx_involuntary": int(fields.get("nonvoluntary_ctxt_switches", "0")),
                "cpu_ns": self._proc_cpu_ns(pid),
            }
        me = os.getpid()  # the sampling process (the launcher, or a rank under torchrun): not other work
        return {"cpu_util_pct": util, "cores": len(cur), **host, "ranks": ranks,
                "sampler": {"pid": me, "cpu_ns": self._proc_cpu_ns(me)},
                **({"ranks_on_host": self._ranks_on_host} if self._ranks_on_host else {})}


class NvmlSource:
    name = "nvidia"

    def __init__(self):
        import pynvml  # from nvidia-ml-py

        pynvml.nvmlInit()
        self.nv = pynvml
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        if not self.handles:
            raise RuntimeError("NVML found no device")

    def _try(self, fn, *args):
        try:
            return fn(*args)
        except Exception:  # a metric this driver or device does not report
            return None

    def sample(self) -> dict:
        nv, devs = self.nv, []
        for i, h in enumerate(self.handles):
            util = self._try(nv.nvmlDeviceGetUtilizationRates, h)
            power = self._try(nv.nvmlDeviceGetPowerUsage, h)
            d = {
                "gpu": i,
                "sm_util_pct": getattr(util, "gpu", None),
                "mem_util_pct": getattr(util, "memory", None),
                "power_w": power / 1000 if power is not None else None,
                "sm_clock_mhz": self._try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                "mem_clock_mhz": self._try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                "pcie_tx_kBps": self._try(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_TX_BYTES),
                "pcie_rx_kBps": self._try(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_RX_BYTES),
            }
            mem = self._try(nv.nvmlDeviceGetMemoryInfo, h)
            d["mem_used_bytes"] = getattr(mem, "used", None)
            d["nvlink_tx_KiB"], d["nvlink_rx_KiB"] = self._nvlink(h)
            devs.append(d)
        return {"devices": devs}

    def _nvlink(self, h) -> tuple[int | None, int | None]:
        """Cumulative NVLink data sent/received (KiB, all links) through NVML field values; rates
        are derived from successive samples by the analyzers. None where the driver has no such field."""
        nv = self.nv
        ids = [getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", None),
               getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", None)]
        if None in ids or not hasattr(nv, "nvmlDeviceGetFieldValues"):
            return None, None
        vals = self._try(nv.nvmlDeviceGetFieldValues, h, ids)
        out = []
        for v in (vals or [None, None])[:2]:
            ok = v is not None and getattr(v, "nvmlReturn", 0) == 0
            out.append(int(v.value.ullVal) if ok and hasattr(v, "value") else None)
        return out[0], out[1]

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except Exception:
            pass


class AmdSource:
    name = "amd"

    def __init__(self):
        import amdsmi

        amdsmi.amdsmi_init()
        self.smi = amdsmi
        self.handles = amdsmi.amdsmi_get_processor_handles()
        if not self.handles:
            raise RuntimeError("amdsmi found no device")

    def sample(self) -> dict:
        smi, devs = self.smi, []
        for i, h in enumerate(self.handles):
            d: dict = {"gpu": i}
            for key, fn in (("activity", smi.amdsmi_get_gpu_activity), ("power", smi.amdsmi_get_power_info),
                            ("clock", lambda h: smi.amdsmi_get_clock_info(h, smi.AmdSmiClkType.GFX))):
                try:
                    d[key] = fn(h)
                except Exception:
                    d[key] = None
            d["xgmi_read_KB"], d["xgmi_write_KB"] = self._xgmi(h)
            devs.append(d)
        return {"devices": devs}

    def _xgmi(self, h) -> tuple[int | None, int | None]:
        """Cumulative XGMI data read/written (KB, summed over links) from the GPU metrics table."""
        try:
            m = self.smi.amdsmi_get_gpu_metrics_info(h)
        except Exception:  # no metrics table on this device or driver
            return None, None

        def total(key: str) -> int | None:
            vals = [v for v in (m.get(key) or []) if isinstance(v, int)] if isinstance(m, dict) else []
            return sum(vals) if vals else None

        return total("xgmi_read_data_acc"), total("xgmi_write_data_acc")

    def close(self) -> None:
        try:
            self.smi.amdsmi_shut_down()
        except Exception:
            pass


def _open_vendor_sources() -> tuple[list, list[str]]:
    """Vendor sources that can start here, and one reason per vendor that cannot."""
    sources, why = [], []
    for label, cls in (("NVIDIA", NvmlSource), ("AMD", AmdSource)):
        try:
            sources.append(cls())
        except ImportError as e:
            why.append(f"{label}: {e.name or 'library'} not installed")
        except Exception as e:  # library present but no device/driver
            why.append(f"{label}: {type(e).__name__}: {str(e)[:80]}")
    return sources, why


class TelemetrySampler:
    """Context manager: samples every `interval_s` into `path` until closed."""

    def __init__(self, path: str | Path, interval_s: float = 0.05, pids: Callable[[], dict[int, int]] = dict,
                 vendor_sources: Iterable | None = None, ranks_on_host: int | None = None):
        self.path = Path(path)
        self.interval_s = interval_s
        self.errors = 0
        self.samples = 0
        if vendor_sources is None:
            vendor, self.degraded = _open_vendor_sources()
        else:
            vendor, self.degraded = list(vendor_sources), []
        self.sources = [*vendor, HostSource(pids, ranks_on_host)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="commprobe-telemetry", daemon=True)

    @property
    def status_line(self) -> str:
        names = ", ".join(s.name for s in self.sources)
        return f"telemetry: {names}" + (f" (no {'; '.join(self.degraded)})" if self.degraded else "")

    def __enter__(self) -> TelemetrySampler:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", buffering=1)
        self._thread.start()
        return self

    def _loop(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            for src in self.sources:
                try:
                    rec = {"t_ns": time.time_ns(), "source": src.name, **src.sample()}
                    self._f.write(json.dumps(rec, default=str) + "\n")
                    self.samples += 1
                except Exception:  # never into the workload
                    self.errors += 1
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for src in self.sources:
            close = getattr(src, "close", None)
            if close:
                close()
        self._f.close()


def rank_pids_from_env() -> dict[int, int]:
    """Under torchrun each process samples only itself."""
    return {int(os.environ.get("RANK", 0)): os.getpid()}
