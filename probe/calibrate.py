"""`commprobe calibrate`: the calibration a prediction needs, measured in one command (issue 58).

A what-if is only as good as what it was calibrated on. On a shared machine one run per backend is
not enough (a TP=2 gloo -> dda prediction from one calibration bundle missed by +24 %, measured):
a backend's time outside its calls and its un-profiled / profiled ratio move with whatever else
the machine runs. So the same job runs K rounds, each a `profile` launch of every backend named,
their order alternated from round to round (gloo,dda then dda,gloo ...) so a drifting machine
favours neither. After the rounds, each round is predicted from the others (plan/intervals.py):
the spread of those errors is the interval every later prediction from this calibration carries.

Layout of OUT:
    calibration.json      schema commprobe.calibration/1: the job, the backends, the rounds done
                          (directory, order, seconds), status, and the cross-validated errors
    round-01/ ...         one run bundle per round (`profile --backend B1,B2`), each readable alone
A round that fails stops the calibration; the rounds done are kept and listed (status "partial").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from commprobe.analyzers.calibration import CALIBRATION_FILE, CALIBRATION_SCHEMA

from .run import RunConfig

DEFAULT_ROUNDS = 7  # chosen by measurement: bench/RESULTS.md "commprobe calibrate: rounds"


@dataclass
class Progress:
    """What the progress bar shows after each round."""

    done: int
    rounds: int
    elapsed_s: float
    left_s: float | None  # the rounds still to run at the mean round's time so far


@dataclass
class Calibration:
    """The job (a RunConfig's fields, less the output directory and backends), the backends,
    the number of rounds and the time bound."""

    job: dict
    backends: list[str]
    rounds: int = DEFAULT_ROUNDS
    max_seconds: float = 1800.0
    done: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError("--rounds must be >= 1")
        if len(self.backends) < 2:
            raise ValueError("calibrate needs two backends or more (--backend gloo,dda): a what-if predicts one "
                             "from the other")
        if self.max_seconds <= 0:
            raise ValueError("--max-minutes must be > 0")
        RunConfig(**self.job, backends=self.backends)  # checks the job (one line where it is wrong)

    def order(self, i: int) -> list[str]:
        """Round i's backend order: rotated each round, so each backend runs first as often."""
        k = i % len(self.backends)
        return self.backends[k:] + self.backends[:k]


def write(out: Path, cal: Calibration, status: str, errors: dict | None = None) -> None:
    doc = {"schema": CALIBRATION_SCHEMA, "job": cal.job, "backends": cal.backends, "rounds_asked": cal.rounds,
           "rounds": cal.done, "status": status, "cross_validation": errors or {}}
    tmp = out / (CALIBRATION_FILE + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(out / CALIBRATION_FILE)


def run_calibration(cal: Calibration, out: Path, run_round: Callable[[RunConfig], None],
                    on_progress: Callable[[Progress], None] = lambda p: None,
                    on_status: Callable[[str], None] = lambda s: None) -> dict:
    """Run the rounds (each through `run_round`, a profile launch), writing calibration.json after
    each, then cross-validate them. Stops starting rounds when the next would pass the time bound
    (at the mean round's time so far), and at a failed round (re-raised after the file is written)."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    status = "partial"
    try:
        for i in range(cal.rounds):
            elapsed = time.monotonic() - t0
            mean = elapsed / i if i else None
            if mean is not None and elapsed + mean > cal.max_seconds:
                on_status(f"time bound reached ({cal.max_seconds / 60:.0f} min): {i} of {cal.rounds} rounds run")
                break
            d = f"round-{i + 1:02d}"
            start = time.monotonic()
            cfg = RunConfig(**cal.job, backends=cal.order(i), out_dir=str(out / d))
            run_round(cfg)
            cal.done.append({"dir": d, "order": cal.order(i), "seconds": round(time.monotonic() - start, 2)})
            write(out, cal, "running")
            elapsed = time.monotonic() - t0
            left = (cal.rounds - i - 1) * elapsed / (i + 1)
            on_progress(Progress(i + 1, cal.rounds, elapsed, left))
        else:
            status = "ok"
    finally:
        write(out, cal, status if cal.done else "failed")
    from commprobe.plan.intervals import cross_validate

    errors = cross_validate(out) if len(cal.done) >= 2 else {}
    write(out, cal, status, errors)
    return json.loads((out / CALIBRATION_FILE).read_text())


def job_like(path: str | Path) -> dict:
    """The job a commprobe bundle ran (`calibrate --like RUN`): model, layout, batch, prompt, steps,
    seed, device; a bundle of several backends gives its first's (they ran the same job)."""
    from commprobe.common.bundle import BundleError, read_manifest, require_manifest, sub_bundles

    p = Path(path)
    subs = sub_bundles(read_manifest(p)) if (p / "manifest.json").is_file() else {}
    m = require_manifest(p / next(iter(subs.values())) if subs else p)
    run, world, model = m.get("run") or {}, m.get("world") or {}, m.get("model") or {}
    try:
        job = {"preset": model["name"], "tp": int(world["tp"]), "cp": int(world["cp"]), "ep": int(world["ep"]),
               "cp_variant": world.get("cp_variant") or "auto", "batch": int(run["batch"]),
               "prompt_len": int(run["prompt_len"]), "decode_steps": int(run["decode_steps"]),
               "seed": int(run.get("seed", 0)), "device": run.get("device") or "auto"}
    except (KeyError, TypeError, ValueError) as e:
        raise BundleError(f"{path}: its manifest does not say the job it ran ({e})") from None
    if run.get("checkpoint"):
        job["checkpoint"] = run["checkpoint"]
    return job


__all__ = ["Calibration", "Progress", "run_calibration", "job_like", "DEFAULT_ROUNDS"]
