"""The trace scanner's throughput on uncompressed JSON already in memory (no disk, no gzip):
MB of JSON per second of `native.scan`, the columns copied out included. With --ref, the scanner
source of that commit is compiled too and the two alternate (A B A B ...), so the ratio
is measured side by side on this noisy machine; each figure is the best of the rounds (CPU time).

    python bench/scan_speed.py [--ref COMMIT] [--rounds 9] [--gen-mb 30]

Inputs: the shared NCCL trace and a sampled rank (real Kineto JSON, as written: indented), the
8-rank DLRM set's rank 0, and one rank of bench/rankset.py's generated set (compact JSON, a third of
its events kernel launches).
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from commprobe.common.vocab import LAUNCH_HINT, NAME_HINTS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from commprobe.analyzers.readers import limits, native

SHARED = ROOT / "tests" / "data" / "traces"


def inputs(gen_mb: float) -> dict[str, bytes]:
    out = {}
    for name, rel in (("nccl_parser_config_nccl_data", "hta/nccl_parser_config_nccl_data.json.gz"),
                      ("trace_filter_sampled_rank-0", "hta/trace_filter_sampled_rank-0.json.gz")):
        if (SHARED / rel).exists():
            out[name] = gzip.decompress((SHARED / rel).read_bytes())
    dlrm = sorted((SHARED / "facebookresearch-param").glob("worker0_*.json.gz"))
    if dlrm:
        out["dlrm worker0"] = gzip.decompress(dlrm[0].read_bytes())
    if gen_mb:
        from bench.rankset import generate

        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp), ranks=1, mb_per_rank=gen_mb, straggler=0)
            f = next(Path(tmp).glob("*.json"))
            out[f"generated {gen_mb:g} MB"] = f.read_bytes()
    return out


def lib_of(src: Path):
    """The scanner compiled from `src`, bound like native.load_scanner binds ours."""
    saved = native._SRC, native._LIB, native._WHY
    native._SRC, native._LIB, native._WHY = src, None, ""
    try:
        lib, why = native.load_scanner()
    finally:
        native._SRC, native._LIB, native._WHY = saved
    if lib is None:
        sys.exit(f"cannot build {src}: {why}")
    return lib


def once(lib, data: bytes) -> float:
    native._LIB, native._WHY = lib, ""
    chunks = [data[i:i + limits.CHUNK] for i in range(0, len(data), limits.CHUNK)]
    t0 = time.process_time()  # CPU time of this (one-threaded) work: less moved by other processes than wall time
    s = native.scan(chunks, (*NAME_HINTS, "#" + LAUNCH_HINT))
    dt = time.process_time() - t0
    assert isinstance(s, native.Scanned), s
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", help="a commit whose trace_scan.c is the A side (or a .c file)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--gen-mb", type=float, default=30)
    a = ap.parse_args()
    libs = {"this tree": lib_of(native._SRC)}
    if a.ref and Path(a.ref).is_file():  # a scanner source file (a variant being tried)
        libs = {Path(a.ref).name: lib_of(Path(a.ref).resolve()), **libs}
    elif a.ref:
        src = b""
        for where in ("analyzers/readers/trace_scan.c", "analyzers/trace_scan.c"):  # moved by the layers refactor
            r = subprocess.run(["git", "-C", str(ROOT), "show", f"{a.ref}:{where}"], capture_output=True)
            if r.returncode == 0:
                src = r.stdout
                break
        if not src:
            raise SystemExit(f"{a.ref}: no trace_scan.c")
        tmp = Path(tempfile.mkdtemp()) / "trace_scan.c"
        tmp.write_bytes(src)
        libs = {a.ref: lib_of(tmp), **libs}
    data = inputs(a.gen_mb)
    print("| input | MB | " + " | ".join(f"{k} MB/s best (median)" for k in libs) + (" | B/A |" if a.ref else " |"))
    print("|---|---|" + "---|" * (len(libs) + bool(a.ref)))
    for name, d in data.items():
        times: dict[str, list[float]] = {k: [] for k in libs}
        for _ in range(a.rounds):
            for k, lib in libs.items():
                times[k].append(once(lib, d))
        # the best run: on this shared machine a run is only ever slowed by others, never sped up
        mbs = {k: len(d) / 1e6 / min(v) for k, v in times.items()}
        med = {k: len(d) / 1e6 / statistics.median(v) for k, v in times.items()}
        cells = " | ".join(f"{mbs[k]:.0f} ({med[k]:.0f})" for k in mbs)
        ratio = f" | {list(mbs.values())[1] / list(mbs.values())[0]:.2f}x |" if a.ref else " |"
        print(f"| {name} | {len(d) / 1e6:.1f} | {cells}{ratio}", flush=True)


if __name__ == "__main__":
    main()
