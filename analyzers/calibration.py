"""One calibration reader (issue 58): what `analyze --calibration`, `report --calibration` and
`plan --from` / `plan calibrate` read, validated once here.

A calibration is any of, one or several (a list, or paths joined by commas):
- a sweep's JSON (`commprobe bench collectives --json`, or `plan collectives` from a hardware
  profile): rows of (backend, op, bytes, world, time_us[, p10_us, batches_us]), a list or an
  object with them under "rows"; `bench time-sharing --json` rows (bench "time-sharing") ride along
  for the planner and are left out of collective rows;
- a healthy run of the same job: a bundle (each backend of a multi-backend bundle), traces or their
  analysis JSON: its median transfer per op and size, measured as the trace measures (profiler
  spans included, which a sweep leaves out), with the run's time outside its calls and its
  un-profiled / profiled ratio.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from commprobe.common.errors import InputError


class CalibrationError(InputError):
    """A calibration that cannot be read: one line, exit 2."""


CALIBRATION_FILE = "calibration.json"
CALIBRATION_SCHEMA = "commprobe.calibration/1"


def paths_of(calibration) -> list:
    """One calibration path, several (a list), or several joined by commas; a `commprobe calibrate`
    directory stands for its rounds' bundles."""
    if isinstance(calibration, (list, tuple)):
        return [p for c in calibration for p in paths_of(c)]
    parts = [p for p in str(calibration).split(",") if p] if isinstance(calibration, str) else [calibration]
    out = []
    for p in parts:
        doc = calibrate_doc(p)
        out.extend([str(Path(p) / r["dir"]) for r in doc["rounds"]] if doc is not None else [p])
    return out


def calibrate_doc(path) -> dict | None:
    """A `commprobe calibrate` directory's checked calibration.json; None for any other path.
    CalibrationError where the file is there but unusable (no round finished, or not ours)."""
    f = Path(path) / CALIBRATION_FILE
    if not f.is_file():
        return None
    doc = read_json(f)
    if not isinstance(doc, dict) or doc.get("schema") != CALIBRATION_SCHEMA:
        raise CalibrationError(f"{f}: not a commprobe calibration ({CALIBRATION_SCHEMA})")
    rounds = doc.get("rounds")
    if not isinstance(rounds, list) or not rounds or not all(
            isinstance(r, dict) and isinstance(r.get("dir"), str) and (Path(path) / r["dir"]).is_dir() for r in rounds):
        raise CalibrationError(f"{path}: the calibration holds no finished round (run `commprobe calibrate` again)")
    return doc


def calibrate_docs(calibration) -> list[tuple[str, dict]]:
    """The `commprobe calibrate` directories among a calibration's paths, with their documents."""
    if isinstance(calibration, (list, tuple)):
        return [x for c in calibration for x in calibrate_docs(c)]
    parts = [p for p in str(calibration).split(",") if p] if isinstance(calibration, str) else [calibration]
    return [(str(p), d) for p in parts if (d := calibrate_doc(p)) is not None]


def sweep_rows(doc, path: str | Path) -> list[dict]:
    """The checked collective rows of a parsed sweep; CalibrationError where there are none."""
    ok = [row for r in listed(doc) if (row := collective_row(r)) is not None]
    if not ok:
        raise CalibrationError(f"{path}: no sweep rows (backend, op, bytes, time_us): write one with "
                               f"`commprobe bench collectives --json > FILE`")
    return ok


def time_sharing_rows(doc) -> list[dict]:
    """The checked `bench time-sharing --json` rows of a parsed document (the planner's), or []."""
    keys = ("work_bytes", "world", "cores", "interval_us", "extra_us")
    out = []
    for r in listed(doc):
        if isinstance(r, dict) and r.get("bench") == "time-sharing":
            try:
                vals = [float(r[k]) for k in keys]
            except (TypeError, KeyError, ValueError, OverflowError):
                continue
            if all(math.isfinite(v) for v in vals):
                out.append({**r, **dict(zip(keys, vals))})
    return out


def read_json(path: str | Path) -> object:
    """A calibration file's parsed JSON; CalibrationError in one line where it is not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CalibrationError(f"{path}: not a calibration file ({type(e).__name__})") from None


def read_sweep(path: str | Path) -> list[dict]:
    """The checked collective rows of a sweep's JSON file."""
    return sweep_rows(read_json(path), path)


def listed(doc) -> list:
    rows = doc.get("rows") if isinstance(doc, dict) else doc
    return rows if isinstance(rows, list) else []


def collective_row(r) -> dict | None:
    """One checked collective row, or None."""
    if not isinstance(r, dict) or r.get("bench") == "time-sharing":
        return None
    try:
        row = {"backend": str(r["backend"]), "op": str(r["op"]), "bytes": int(r["bytes"]),
               "world": int(r.get("world", 0)), "time_us": float(r["time_us"])}
        batches = [float(b) for b in r.get("batches_us") or [] if float(b) > 0]
        row["p10_us"] = float(r.get("p10_us") or (min(batches) if batches else row["time_us"]))
    except (TypeError, KeyError, ValueError, OverflowError):
        return None
    return row if row["bytes"] > 0 and math.isfinite(row["time_us"]) and row["time_us"] > 0 else None
