"""Competing busy processes for `bench collectives --load N`: contention as a reproducible
condition of a sweep. Real CPU inference servers share cores with tokenizers, HTTP threads and
other tenants; a collective that is fast only on idle cores gives wrong advice there.

Each process spins in pure Python (one core's worth of demand, no memory traffic to speak of)
and ends by itself after `seconds`, so that none outlives the bench even when the bench is
killed; the context manager also terminates them on exit.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    pass\n"


@contextmanager
def busy_load(n: int, seconds: float) -> Iterator[list[subprocess.Popen]]:
    """Run `n` busy processes (each bounded to `seconds`) for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN.format(s=float(seconds))],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(max(0, n))]
    try:
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
