"""Facts about the host this process runs on, read in one place (the DDA kernels, the
bundle's manifest, the launcher and the sweep all need them)."""

from __future__ import annotations

import os
from pathlib import Path


def usable_cores() -> int:
    """Cores this process may run on (taskset, cgroup cpusets), not the machine's count: the
    spin-or-sleep decision and the oversubscription check are about the cores we really get."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # platforms without affinity
        return os.cpu_count() or 1


def local_world_size(default: int) -> int:
    """The job's ranks on this host: LOCAL_WORLD_SIZE (torchrun and commprobe's launcher set
    it), else `default` (the caller's guess: a process group of unknown layout shares the host)."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return int(local) if local and local.isdigit() else default


def shm_dir() -> Path:
    """Where shared-memory segments live: /dev/shm where there is one, else TMPDIR."""
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(os.environ.get("TMPDIR", "/tmp"))


def _cpuinfo_field(*keys: str) -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(keys):
                return line.split(":", 1)[1].strip() if ":" in line else line
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's marketing name (x86 `model name`), else what platform says."""
    import platform  # here, not at import: an analysis that never asks starts sooner

    return _cpuinfo_field("model name") or platform.processor()


def cpu_flags() -> str:
    """The CPU's feature flags (x86 `flags`, Arm `Features`), else the architecture: part of the
    cache key of code built with -march=native, which must not run on another CPU."""
    return _cpuinfo_field("flags", "Features") or os.uname().machine


def cpu_has(flag: str) -> bool:
    """Whether the CPU advertises `flag` (x86 `flags`, Arm `Features`); True when it cannot be
    told (no /proc/cpuinfo), so a check on it never refuses on a platform it cannot read."""
    flags = _cpuinfo_field("flags", "Features")
    return flags is None or flag in flags.split()


def host_name() -> str:
    """This host's name in bundles and telemetry file names; COMMPROBE_HOST overrides it (two
    agents on one machine standing for two hosts)."""
    import socket

    return os.environ.get("COMMPROBE_HOST") or socket.gethostname()
