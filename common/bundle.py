"""The run bundle's layout and its readers: the one place that knows what `commprobe profile`
leaves on disk. Torch-free, so the analyzers, the gate and the planner read bundles on a laptop.

    OUT/manifest.json            versions, host, device, world layout, model, backend, sizes, status
    OUT/rank{r}.trace.json.gz    one Kineto trace per rank (phase and collective spans)
    OUT/timings.json             un-profiled TTFT/TTIT samples (and profiled, for the overhead ratio)
    OUT/telemetry.jsonl          host (and GPU) samples on the traces' clock
    OUT/flight_recorder/         after a hang or a failed rank: each live rank's Flight Recorder
                                 records (rank{r}.fr.pkl, torch's own dump), its Python stacks
                                 (rank{r}.stacks.json) and its process groups (rank{r}.groups.json)
                                 (under torchrun: OUT/telemetry-HOST.jsonl, one per host)

With several backends, OUT holds one sub-bundle per backend (OUT/gloo/, OUT/dda/), each a
complete bundle, plus the shared telemetry and a top manifest listing them (`sub_bundles`).
Every write is atomic (temporary file, then rename), so a crash never leaves half a JSON file.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from .errors import InputError

SCHEMA = "commprobe.bundle/1"
TIMINGS_SCHEMA = SCHEMA  # timings.json carries the bundle's schema
CLOCK = ("trace event time in Unix ns = ts_us * 1000 + baseTimeNanoseconds; "
         "telemetry t_ns = Unix ns (time.time_ns)")
MANIFEST = "manifest.json"
TIMINGS = "timings.json"
TELEMETRY = "telemetry.jsonl"


class BundleError(InputError):
    """A bundle (or a file in it) that cannot be read as one."""


def trace_name(rank: int) -> str:
    return f"rank{rank}.trace.json.gz"


FLIGHT_RECORDER = "flight_recorder"
LIVE_SOCKETS = "live.json"  # {"sockets": {rank: path}}: where each rank of a running job answers (hang --live)
FR_TRIGGER = "DUMP"  # the launcher creates it in flight_recorder/: every live rank dumps once


def fr_dump_name(rank: int) -> str:
    return f"rank{rank}.fr.pkl"


def fr_stacks_name(rank: int) -> str:
    return f"rank{rank}.stacks.json"


def fr_groups_name(rank: int) -> str:
    return f"rank{rank}.groups.json"


def host_telemetry_name(host: str) -> str:
    """Under torchrun each host samples itself into its own file beside the manifest."""
    return f"telemetry-{host}.jsonl"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def read_json(path: Path, what: str = "JSON") -> dict:
    """A JSON object from `path`; BundleError naming the file otherwise."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise BundleError(f"{path}: cannot read ({e.strerror or e})") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise BundleError(f"{path}: unreadable {what} ({e})") from None
    if not isinstance(data, dict):
        raise BundleError(f"{path}: expected a JSON object")
    return data


def read_manifest(path: Path) -> dict | None:
    """A bundle directory's manifest, or None when `path` is not a bundle directory (or cannot be
    looked into: the trace reader then says why, in one line)."""
    m = path / MANIFEST
    try:
        if not path.is_dir() or not m.exists():
            return None
    except OSError:  # permission denied on a parent, a loop: not for us to name here
        return None
    return read_json(m, "manifest")


def sub_bundles(manifest: dict | None) -> dict[str, str]:
    """{backend: sub-directory} of a bundle with one sub-bundle per backend, else {}."""
    subs = (manifest or {}).get("sub_bundles") or {}
    return subs if isinstance(subs, dict) else {}


def single_manifest(path: Path) -> dict | None:
    """The manifest of a one-backend bundle (None when `path` is no bundle); a bundle with one
    sub-bundle per backend is refused, naming them."""
    doc = read_manifest(path)
    if doc and sub_bundles(doc):
        subs = ", ".join(sub_bundles(doc))
        raise BundleError(f"{path} holds one bundle per backend ({subs}): analyze one of them, "
                          f"or compare two with `commprobe compare`")
    return doc


def require_manifest(path: Path) -> dict:
    """The manifest of the bundle at `path`, which must be a finished commprobe bundle."""
    mpath = path / MANIFEST
    if not mpath.exists():
        raise BundleError(f"{path}: not a run bundle (no {MANIFEST})")
    manifest = read_json(mpath, "manifest")
    if not str(manifest.get("schema", "")).startswith("commprobe.bundle/"):
        raise BundleError(f"{mpath}: schema {manifest.get('schema')!r} is not a commprobe bundle")
    if manifest.get("status") not in ("ok", None):
        raise BundleError(f"{path}: the run did not finish ({manifest.get('status')}: {manifest.get('error')})")
    return manifest


def read_timings(path: Path) -> dict:
    tpath = path / TIMINGS
    if not tpath.exists():
        raise BundleError(f"{path}: no {TIMINGS} in the bundle")
    return read_json(tpath, "timings")


def unprofiled_medians(path: Path) -> dict[str, float]:
    """A bundle's un-profiled medians (ms) of TTFT and TTIT, the slowest rank's (a token is ready
    when every rank is done); {} where the bundle has no readable timings (another producer's
    trace, a damaged file: callers then do without)."""
    try:
        ranks = json.loads((Path(path) / TIMINGS).read_text()).get("ranks") or []
    except (OSError, ValueError, AttributeError):
        return {}
    out = {}
    for m in ("ttft", "ttit"):
        vals = [r.get(f"{m}_median_ms") for r in ranks if isinstance(r, dict)]
        vals = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")]
        if vals:
            out[m] = float(max(vals))
    return out


def telemetry_path(path: Path, manifest: dict | None) -> Path | None:
    """The bundle's telemetry file (a sub-bundle's points at the shared one), if it exists."""
    if not manifest or not manifest.get("telemetry"):
        return None
    f = (path / manifest["telemetry"]).resolve()
    return f if f.exists() else None


def machine_facts(manifest: dict) -> dict:
    """What makes times comparable: the hardware and software, not the host name."""
    dev = manifest.get("device") or {}
    return {"kind": dev.get("kind"), "processor": dev.get("processor"), "cpu_count": dev.get("cpu_count"),
            "gpu": dev.get("name"), "gpu_count": dev.get("count"), "torch": manifest.get("torch_version"),
            "os": (manifest.get("platform") or "").split("-")[0] or None, "arch": dev.get("machine")}


def run_context(manifest: dict) -> dict:
    """The workload a bundle measured: what must match for two runs' times to be compared."""
    run, world = manifest.get("run") or {}, manifest.get("world") or {}
    return {"preset": (manifest.get("model") or {}).get("name"),
            "world": {k: world.get(k) for k in ("size", "tp", "cp", "ep")},
            "backend": manifest.get("backend"), "batch": run.get("batch"),
            "prompt_len": run.get("prompt_len"), "decode_steps": run.get("decode_steps")}


def job_of(manifest: dict | None) -> dict | None:
    """The job a bundle ran, whatever the backend: what must match for one run's per-window figures
    (the profiler's share of a window, say) to stand for another's. None outside a bundle."""
    if not manifest:
        return None
    ctx = run_context(manifest)
    ctx.pop("backend", None)
    return ctx


def per_sample(rows: list[list[float]], how) -> list[float]:
    """Combine ranks sample by sample (ranks record the same repetitions and steps)."""
    n = min((len(r) for r in rows), default=0)
    return [how([r[i] for r in rows]) for i in range(n)]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def timing_samples(timings: dict) -> dict[str, list[float]]:
    """TTFT and TTIT in ms (slowest rank per sample: a token is ready when every rank is done)
    and the blocked-communication share per phase and axis (mean over ranks), sample by sample:
    `ttft_ms`, `ttit_ms`, `{prefill,decode}_comm_share/{axis}`."""
    ranks = timings.get("ranks") or []
    samples = [r.get("samples") or {} for r in ranks if isinstance(r, dict)]
    if not samples or not all(isinstance(s, dict) and "ttit_s" in s and "ttft_s" in s for s in samples):
        raise BundleError("timings.json has no per-rank ttft_s/ttit_s samples")
    out = {"ttft_ms": [1e3 * x for x in per_sample([s["ttft_s"] for s in samples], max)],
           "ttit_ms": [1e3 * x for x in per_sample([s["ttit_s"] for s in samples], max)]}
    for phase, key, total in (("prefill", "prefill_comm_s", "ttft_s"), ("decode", "decode_comm_s", "ttit_s")):
        axes = set.intersection(*(set(s.get(key) or {}) for s in samples))
        for axis in sorted(axes):
            shares = [[c / t if t > 0 else 0.0 for c, t in zip(s[key][axis], s[total])] for s in samples]
            out[f"{phase}_comm_share/{axis}"] = per_sample(shares, _mean)
    return out
