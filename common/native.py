"""Compile a C source with the system compiler into a cached shared library, and load it.

Used by the DDA kernels (collectives/dda_cpu.c) and the trace scanner (analyzers/trace_scan.c):
no build step at install, nothing for a laptop without a compiler to trip on (callers fall
back to Python), and one cache so processes starting together build once.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "commprobe"


def build_library(src: Path, flags: list[str], what: str, key_extra: str = "") -> tuple[ctypes.CDLL | None, str]:
    """Compile `src` into a shared library, once per source, compiler, flags and `key_extra`
    (cached in ~/.cache/commprobe; processes starting together build once, under a lock, and the
    file appears atomically), and load it; (None, why) when impossible."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc or not shutil.which(cc):
        return None, "no C compiler found (set CC)"
    if not src.exists():
        return None, f"{src.name} is not installed beside {what}'s Python code"
    key = hashlib.sha256(src.read_bytes() + " ".join([cc, *flags, key_extra]).encode()).hexdigest()[:16]
    cache = cache_dir()
    so = cache / f"{src.stem}-{key}.so"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not so.exists():
                tmp = so.with_suffix(f".{os.getpid()}.tmp")
                r = subprocess.run([cc, *flags, "-o", str(tmp), str(src)], capture_output=True, text=True)
                if r.returncode:
                    return None, f"compiling {src.name} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}"
                os.replace(tmp, so)
        return ctypes.CDLL(str(so)), ""
    except OSError as e:
        return None, f"could not build or load {what}: {e}"
