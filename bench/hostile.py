"""Resource use on hostile inputs (the reliability issue's class 4): time and peak RSS of whole
`commprobe analyze` processes on inputs built to exhaust a reader.

    python bench/hostile.py [--tiny-events 5000000] [--huge-mb 4,8,16,32] [--bomb-gb 4.5]

- tiny: N complete events of ~87 bytes each (no args): memory per kept event;
- huge: one event whose args hold a string of M MiB, read in 64 KiB chunks (COMMPROBE_CHUNK_BYTES):
  time must grow linearly with M (a reader that rescans the cut event on each chunk is quadratic);
- bomb: an unclosed gzip of zeros-as-whitespace inside the events array (a few MB on disk, GBs
  inflated): refused without inflating it into memory.
Inputs are written to a temporary directory and removed at the end.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

# Peak RSS from VmHWM, which starts afresh at exec (ru_maxrss keeps the forking parent's peak:
# run from a large process such as pytest, it would report the parent's size).
PROBE = ("import sys\nfrom commprobe.probe.cli import main\ntry:\n    main()\nfinally:\n"
         "    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
         "    sys.stderr.write('RSS %s\\n' % hwm)")


def run(path: Path, env: dict | None = None) -> tuple[float, int, int, str]:
    """Seconds, peak RSS (bytes), exit code and the last stderr line of one `commprobe analyze`."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", PROBE, "analyze", str(path), "--json"], capture_output=True, text=True,
                       timeout=3600, env={**os.environ, **(env or {})})
    dt = time.perf_counter() - t
    lines = r.stderr.strip().splitlines()
    rss = int(lines[-1].split()[1]) * 1024
    return dt, rss, r.returncode, (lines[-2] if len(lines) > 1 else "")[:160]


def tiny(path: Path, n: int) -> int:
    with open(path, "w") as f:
        f.write('{"traceEvents": [\n')
        row = '{"ph": "X", "cat": "cpu_op", "name": "op%d", "ts": %d, "dur": 1, "pid": 0, "tid": %d},\n'
        block = 100_000
        for start in range(0, n, block):
            f.write("".join(row % (i % 50, i * 2, i % 4) for i in range(start, min(n, start + block))))
        f.write('{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 1, "pid": 0, "tid": 9}]}\n')
    return path.stat().st_size


def huge(path: Path, mib: int) -> int:
    blob = "x" * (mib << 20)
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 0, "dur": 5, '
                    f'"tid": 1, "args": {{"blob": "{blob}", "Collective name": "allreduce"}}}}]}}')
    return path.stat().st_size


def bomb(path: Path, gb: float) -> int:
    """A gzip member that inflates to `gb` GB of whitespace after an open events array, never closed."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [z.compress(b'{"traceEvents": [')]
    zeros = b" " * (64 << 20)
    for _ in range(int(gb * 1e9) // len(zeros)):
        out.append(z.compress(zeros))
    out.append(z.flush())
    path.write_bytes(b"".join(out))
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny-events", type=int, default=5_000_000)
    ap.add_argument("--huge-mb", default="4,8,16,32")
    ap.add_argument("--bomb-gb", type=float, default=4.5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="commprobe-hostile-"))
    try:
        print("| input | size | time (s) | peak RSS (MB) | exit | last line |\n|---|---|---|---|---|---|", flush=True)
        for mib in map(int, args.huge_mb.split(",")):
            p = tmp / f"huge{mib}.json"
            size = huge(p, mib)
            dt, rss, rc, line = run(p, {"COMMPROBE_CHUNK_BYTES": str(64 << 10)})
            print(f"| one {mib} MiB event, 64 KiB chunks | {size / 1e6:.0f} MB | {dt:.2f} | {rss / 1e6:.0f} | {rc} | |", flush=True)
            p.unlink()
        if args.bomb_gb:
            p = tmp / "bomb.json.gz"
            size = bomb(p, args.bomb_gb)
            dt, rss, rc, line = run(p)
            print(f"| unclosed gzip bomb ({args.bomb_gb} GB inflated) | {size / 1e6:.1f} MB | {dt:.1f} | {rss / 1e6:.0f} | {rc} "
                  f"| {line} |", flush=True)
            p.unlink()
        if args.tiny_events:
            p = tmp / "tiny.json"
            size = tiny(p, args.tiny_events)
            dt, rss, rc, line = run(p)
            print(f"| {args.tiny_events / 1e6:g} M tiny events | {size / 1e6:.0f} MB | {dt:.1f} | {rss / 1e6:.0f} | {rc} | "
                  f"{rss / args.tiny_events:.0f} B/event |", flush=True)
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
