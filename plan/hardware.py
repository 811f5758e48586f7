"""Hardware profiles: data files (TOML), not code. Copy one to describe your own machine.

A profile names its peak figures and where they come from, the efficiencies reached in
practice (reasoned or calibrated, never tuned to reproduce an end-to-end number), and
alpha-beta links: `intra` (inside a host), `inter` (between hosts), and optionally `ring` /
`dda` for machines where the library's ring and commprobe's DDA were measured separately
(this machine, by `commprobe plan calibrate`). `[time_sharing]` (optional, calibrated from a
sweep with more ranks than cores) prices ranks that outnumber a host's devices beyond the
plain ranks/devices factor: `extra_us[i]`, what each collective call costs beyond that
factor (per extra rank per device) when calls come every `interval_us[i]` (waking ranks
that sleep in the collective while the peer they wait for shares a core, imbalance
between cores), interpolated between the measured intervals and held at the ends.
`straggler_prefill` / `straggler_decode` (calibrated; 0 in the published-hardware profiles):
what ranks wait in collectives for their slowest peer beyond the modelled transfer, as a
fraction of the work between the collectives.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from commprobe.common.errors import InputError

HERE = Path(__file__).with_name("hardware")


class PlanError(InputError):
    """Bad planner input: one line, exit 2."""


@dataclass(frozen=True)
class Link:
    alpha_us: float  # fixed cost of one step (latency, synchronization)
    bw_GBps: float  # bandwidth per device and direction

    def time_us(self, nbytes: float) -> float:
        return self.alpha_us + nbytes / (self.bw_GBps * 1e3)


@dataclass
class Hardware:
    name: str
    description: str
    devices_per_host: int
    peak_tflops: float
    mem_bw_GBps: float
    compute_eff: float
    mem_eff: float
    links: dict[str, Link]
    mem_GB: float = 0.0
    dtype_bytes: int = 2
    layer_overhead_us: float = 0.0  # per layer and forward (decode; prefill too unless set apart)
    prefill_layer_overhead_us: float | None = None
    mem_bw_scope: str = "device"  # "device" (GPU HBM) or "host" (a CPU memory bus shared by its ranks)
    # (interval between collective calls µs, extra µs per call per extra rank per device), measured
    time_sharing: list[tuple[float, float]] = field(default_factory=list)
    # waiting for stragglers in collectives, as a fraction of the work between them (calibrated)
    straggler_prefill: float = 0.0
    straggler_decode: float = 0.0
    sources: list[str] = field(default_factory=list)
    calibration: dict = field(default_factory=dict)

    @property
    def flops_per_us(self) -> float:
        return self.peak_tflops * 1e6 * self.compute_eff

    @property
    def bytes_per_us(self) -> float:
        return self.mem_bw_GBps * 1e3 * self.mem_eff

    def overhead_us(self, decode: bool) -> float:
        if decode or self.prefill_layer_overhead_us is None:
            return self.layer_overhead_us
        return self.prefill_layer_overhead_us

    def straggler(self, decode: bool) -> float:
        return self.straggler_decode if decode else self.straggler_prefill

    def time_share_extra_us(self, interval_us: float) -> float:
        """Extra µs per collective call and extra rank per device, for calls `interval_us` apart:
        interpolated in log interval between the measured points, held beyond them."""
        if not self.time_sharing:
            return 0.0
        xs, ys = zip(*sorted(self.time_sharing))
        return float(np.interp(np.log(max(interval_us, 1e-3)), np.log(xs), ys))

    def link(self, across_hosts: bool, algorithm: str = "") -> Link:
        if across_hosts:
            return self.links["inter"]
        return self.links.get(algorithm) or self.links["intra"]


def available() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.toml"))


def load_hardware(name_or_path: str | Path) -> Hardware:
    p = Path(name_or_path)
    if not p.suffix:
        p = HERE / f"{name_or_path}.toml"
    if not p.exists():
        raise PlanError(f"unknown hardware {str(name_or_path)!r} (known: {', '.join(available())}; or a .toml path)")
    try:
        d = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise PlanError(f"{p}: unreadable hardware profile ({e})") from None
    try:
        links = {k: Link(float(v["alpha_us"]), float(v["bw_GBps"])) for k, v in d["links"].items()}
        if "intra" not in links or "inter" not in links:
            raise KeyError("links.intra and links.inter")
        return Hardware(name=d["name"], description=d.get("description", ""), devices_per_host=int(d["devices_per_host"]),
                        peak_tflops=float(d["peak_tflops"]), mem_bw_GBps=float(d["mem_bw_GBps"]),
                        compute_eff=float(d["compute_eff"]), mem_eff=float(d["mem_eff"]), links=links,
                        mem_GB=float(d.get("mem_GB", 0)), dtype_bytes=int(d.get("dtype_bytes", 2)),
                        layer_overhead_us=float(d.get("layer_overhead_us", 0)), sources=list(d.get("sources", [])),
                        prefill_layer_overhead_us=(float(d["prefill_layer_overhead_us"])
                                                   if "prefill_layer_overhead_us" in d else None),
                        mem_bw_scope=str(d.get("mem_bw_scope", "device")),
                        time_sharing=_time_sharing(d.get("time_sharing", {})),
                        straggler_prefill=float(d.get("straggler_prefill", 0.0)),
                        straggler_decode=float(d.get("straggler_decode", 0.0)),
                        calibration=dict(d.get("calibration", {})))
    except (KeyError, TypeError, ValueError) as e:
        raise PlanError(f"{p}: hardware profile lacks or mistypes {e}") from None


def _time_sharing(t: dict) -> list[tuple[float, float]]:
    xs, ys = t.get("interval_us", []), t.get("extra_us", [])
    if len(xs) != len(ys) or any(float(x) <= 0 for x in xs):
        raise ValueError("time_sharing.interval_us (positive) and extra_us must have the same length")
    return [(float(x), float(y)) for x, y in zip(xs, ys)]


def to_toml(hw: Hardware) -> str:
    """A profile file for `hw` (what `commprobe plan calibrate` writes)."""
    def q(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [f"name = {q(hw.name)}", f"description = {q(hw.description)}", "sources = ["]
    lines += [f"  {q(s)}," for s in hw.sources] + ["]"]
    lines += [f"devices_per_host = {hw.devices_per_host}", f"peak_tflops = {hw.peak_tflops:.6g}",
              f"mem_bw_GBps = {hw.mem_bw_GBps:.6g}", f"mem_GB = {hw.mem_GB:.6g}", f"dtype_bytes = {hw.dtype_bytes}",
              f"compute_eff = {hw.compute_eff:.6g}", f"mem_eff = {hw.mem_eff:.6g}",
              f"layer_overhead_us = {hw.layer_overhead_us:.6g}", f'mem_bw_scope = "{hw.mem_bw_scope}"']
    if hw.prefill_layer_overhead_us is not None:
        lines.append(f"prefill_layer_overhead_us = {hw.prefill_layer_overhead_us:.6g}")
    if hw.straggler_prefill or hw.straggler_decode:
        lines += [f"straggler_prefill = {hw.straggler_prefill:.6g}", f"straggler_decode = {hw.straggler_decode:.6g}"]
    lines.append("")
    for k, link in hw.links.items():
        lines += [f"[links.{k}]", f"alpha_us = {link.alpha_us:.6g}", f"bw_GBps = {link.bw_GBps:.6g}", ""]
    if hw.time_sharing:
        xs, ys = zip(*sorted(hw.time_sharing))
        lines += ["[time_sharing]", "interval_us = [" + ", ".join(f"{x:.6g}" for x in xs) + "]",
                  "extra_us = [" + ", ".join(f"{y:.6g}" for y in ys) + "]", ""]
    if hw.calibration:
        lines.append("[calibration]")
        for k, v in hw.calibration.items():
            lines.append(f"{k} = {q(str(v))}" if not isinstance(v, (int, float)) else f"{k} = {v}")
    return "\n".join(lines) + "\n"
