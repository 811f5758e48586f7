"""The cost of decoding NCCL's NVTX payloads (readers/nvtx_payloads.py), per NCCL range: the real
FastVideo export (tests/data/traces/nsys-ai-fastvideo) with its blobs filled as in the tests,
one process's grouped ncclSend/ncclRecv rows repeated to REPEATS copies (shifted in time), grouped
and turned into per-peer bytes ROUNDS times; the median and the range of the rounds.

    python bench/nvtx_payloads.py [REPEATS] [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from commprobe.analyzers.readers import nvtx_payloads as nv
from commprobe.analyzers.readers.nsys import Export

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.test_nvtx_payloads import BEFORE, _fill  # noqa: E402  (the tests' own filling of the real export)


def main(repeats: int = 3000, rounds: int = 5) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "blobs.sqlite"
        _fill(BEFORE, p, {144: 1, 145: 0})
        ex = Export(p)
        rows = [r for r in ex.nccl_rows(144, "nccl%") if r[3] in nv.GROUP_NAMES]
        big = [(s + k * 10**9, e + k * 10**9, t, n, b) for k in range(repeats) for s, e, t, n, b in rows]
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            got = nv.splits(nv.groups(big, ex.payload_schemas), {})
            times.append(time.perf_counter() - t0)
        ex.db.close()
    med = statistics.median(times)
    print(f"{len(big)} NCCL ranges, {len(got)} groups with sizes: median {med:.2f} s over {rounds} rounds "
          f"(range {min(times):.2f}-{max(times):.2f} s), {med / len(big) * 1e6:.2f} µs per range")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
