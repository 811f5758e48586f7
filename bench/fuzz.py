"""A long fuzz run of the trace readers: the property of tests/fuzz/harness.py (sanitized scanner,
both readers equal or both refusing in one line, accepted traces analyze) over N hypothesis cases.

    python bench/fuzz.py [--cases 100000] [--seed 1] [--analyze-every 4]

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--analyze-every", type=int, default=4, help="run the whole analysis on 1 in N cases (it is the slow part)")
    args = ap.parse_args()
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
