"""A long fuzz run of the trace readers: the property of tests/fuzz/harness.py (sanitized scanner,
both readers equal or both refusing in one line, accepted traces analyze) over N hypothesis cases.

    python bench/fuzz.py [--cases 100000] [--seed 1] [--analyze-every 4]
    python bench/fuzz.py --readers [--cases 100000] [--seed 1] [--jobs 2]   # the newer readers

With --readers: tests/fuzz/readers.py's property (analyzes, or one InputError line; never another
exception, never over 10 s a case, never over 2 GB) over the SQLite formats, rocprofv3 JSON,
Flight Recorder dumps and engine names / --rank-from, the cases split evenly across targets and
run in --jobs processes; every distinct failure is printed with its case, and the peak RSS.

Prints the cases run, how many each reader accepted and refused, and the time; a failing case is
shrunk by hypothesis and printed. The table goes to bench/RESULTS.md by hand.
"""

from __future__ import annotations

import argparse
import collections
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

from tests.fuzz import harness  # noqa: E402


def _readers_worker(job: tuple[str, int, int]) -> tuple[str, dict, dict, float, int]:
    """One process's share of the readers' run: (target, outcomes, failures by place, seconds, peak RSS KB)."""
    import random
    import resource
    import traceback

    from tests.fuzz import readers

    target, n, seed_ = job
    work = Path(tempfile.mkdtemp(prefix=f"commprobe-fuzz-{target}-"))
    seeds = readers.seeds(work)
    rng = random.Random(f"{target}-{seed_}")
    seen: collections.Counter = collections.Counter()
    fails: dict = {}
    t0 = time.perf_counter()
    for _ in range(n):
        try:
            seen[readers.check(target, rng, work, seeds)] += 1
        except AssertionError as e:
            cause = e.__cause__
            tb = traceback.extract_tb(cause.__traceback__)[-1] if cause is not None and cause.__traceback__ else None
            where = f"{Path(tb.filename).name}:{tb.lineno}" if tb else str(e)[:60]
            key = f"{type(cause).__name__ if cause else 'limit'} at {where}"
            fails.setdefault(key, [0, str(e)[:300]])[0] += 1
            seen["failed"] += 1
    shutil.rmtree(work, ignore_errors=True)
    return target, dict(seen), fails, time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def readers_main(cases: int, seed_: int, jobs: int) -> None:
    from concurrent.futures import ProcessPoolExecutor

    from tests.fuzz import readers

    per = max(1, cases // len(readers.TARGETS))
    chunks = [(t, per // jobs + (1 if k < per % jobs else 0), seed_ * 1000 + k) for t in readers.TARGETS for k in range(jobs)]
    t0 = time.perf_counter()
    total: collections.Counter = collections.Counter()
    with ProcessPoolExecutor(jobs) as pool:
        for target, seen, fails, dt, rss in pool.map(_readers_worker, chunks):
            total.update(seen)
            print(f"  {target}: {seen} in {dt:.0f} s, peak RSS {rss / 1024:.0f} MB", flush=True)
            for key, (n, example) in fails.items():
                print(f"    FAIL {n}x {key}: {example}", flush=True)
    dt = time.perf_counter() - t0
    n = sum(total.values())
    print(f"{n} reader cases in {dt:.0f} s on {platform.machine()}, seed {seed_}: {total['ok']} analyzed, "
          f"{total['refused']} refused in one line, {total['failed']} failed", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--analyze-every", type=int, default=4, help="run the whole analysis on 1 in N cases (it is the slow part)")
    ap.add_argument("--readers", action="store_true", help="fuzz the SQLite, rocprofv3 JSON, Flight Recorder and name readers")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    if args.readers:
        readers_main(args.cases, args.seed, args.jobs)
        return
    work = Path(tempfile.mkdtemp(prefix="commprobe-fuzz-"))
    driver = harness.Driver.build(work)
    if driver is None:
        print(f"no sanitizer build: {harness.Driver.why}; the readers are still compared", flush=True)
    seen: collections.Counter = collections.Counter()

    @seed(args.seed)
    @settings(max_examples=args.cases, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=harness.cases)
    def run(case):
        data, chunk, gz = case
        n = sum(seen.values())
        seen[harness.check(data, chunk, gz, work, driver, analyzed=n % args.analyze_every == 0)] += 1
        n += 1
        if n % 10_000 == 0:
            print(f"  {n} cases, {time.perf_counter() - t0:.0f} s", flush=True)

    t0 = time.perf_counter()
    try:
        run()
    finally:
        if driver is not None:
            driver.close()
        shutil.rmtree(work, ignore_errors=True)
    dt = time.perf_counter() - t0
    n = sum(seen.values())
    print(f"{n} cases in {dt:.0f} s ({n / dt:.0f}/s) on {platform.machine()}, seed {args.seed}: "
          f"{seen['ok']} accepted by both readers (1 in {args.analyze_every} analyzed), {seen['refused']} refused by both in one line; "
          f"sanitized scanner: {'yes' if driver else 'no'}; nothing found", flush=True)


if __name__ == "__main__":
    main()
