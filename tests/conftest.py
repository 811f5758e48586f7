import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REAL_TRACES = ROOT / "tests" / "data" / "traces"


@pytest.fixture(scope="session")
def real_traces() -> Path:
    """The real profiler output shipped with the repository (tests/data/traces/README.md: sources and
    licences): a test that needs it fails, never skips, where it is missing."""
    assert (REAL_TRACES / "README.md").is_file(), f"real traces missing from {REAL_TRACES} (part of the repository)"
    return REAL_TRACES


def run_cli(*args: str, env: dict | None = None, timeout: float = 300):
    """Run the real console entry point in a subprocess (exit codes and stderr as a user sees them)."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "commprobe.probe.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=timeout)


def assert_one_line_exit_2(r, needle: str) -> None:
    """Bad input as a user meets it: exit 2, one line on stderr naming the problem, no traceback."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr


def invariant_violations(result: dict, raw: Path | None = None, source=None) -> list[str]:
    """bench/invariants.py's check (loaded once): the invariants every analysis keeps, on any input;
    `source`: the input itself, whose per-call waits are held to the last arrivers too (check_waits)."""
    import importlib.util

    global _INVARIANTS
    if _INVARIANTS is None:
        spec = importlib.util.spec_from_file_location("invariants", ROOT / "bench" / "invariants.py")
        _INVARIANTS = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_INVARIANTS)
    bad = _INVARIANTS.check(result, raw)
    if source is not None:
        from commprobe.analyzers.analysis import analyze_with_calls

        again, red = analyze_with_calls(source)
        bad += _INVARIANTS.check_waits(again, red.calls, red.waits)
    return bad


_INVARIANTS = None

