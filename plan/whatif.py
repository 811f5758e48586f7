"""`--what-if`: alternatives to a planned deployment, each predicted and ranked.

Spec: comma-separated `key=alt|alt|...`; a key's own value list may also use commas
(`tp=4,8,16`). Keys: allreduce (ring, dda, dda-oneshot, dda-twoshot, or xF to scale the TP
allreduce time), all_to_all (overlap, exposed), cp_variant (auto, pass-kv, pass-q),
expert_imbalance (busiest EP rank's routed rows over the mean, e.g. 1.5), tp, cp, ep, batch,
prompt_len. Every combination of the base and the alternatives is predicted;
combinations the model cannot shard are listed with the reason.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from commprobe.common import whatif_spec
from commprobe.reference_impl.cp_variant import VARIANTS

from .costmodel import ALLREDUCE_ALGORITHMS, Layout, Options, Prediction, Workload, predict
from .hardware import Hardware, PlanError

KEYS = (*whatif_spec.MODEL, *whatif_spec.LAYOUT)


def parse(spec: str) -> dict[str, list[str]]:
    """A plan's alternatives, key -> values (the one --what-if parser, common/whatif_spec.py)."""
    try:
        return whatif_spec.for_model(spec)
    except whatif_spec.WhatIfError as e:
        raise PlanError(str(e)) from None


def _apply(w: Workload, lay: Layout, opt: Options, key: str, val: str) -> tuple[Workload, Layout, Options]:
    try:
        if key == "allreduce":
            if val.startswith("x"):
                return w, lay, replace(opt, allreduce_scale=float(val[1:]))
            if val not in ALLREDUCE_ALGORITHMS:
                raise PlanError(f"--what-if allreduce={val}: ring, dda, dda-oneshot, dda-twoshot or xF")
            return w, lay, replace(opt, allreduce=val)
        if key == "all_to_all":
            if val not in ("overlap", "exposed"):
                raise PlanError(f"--what-if all_to_all={val}: overlap or exposed")
            return w, lay, replace(opt, overlap_all_to_all=val == "overlap")
        if key == "cp_variant":
            if val not in VARIANTS:
                raise PlanError(f"--what-if cp_variant={val}: auto, pass-kv or pass-q")
            return w, lay, replace(opt, cp_variant=val)
        if key == "expert_imbalance":
            return w, lay, replace(opt, expert_imbalance=float(val))
        if key in ("tp", "cp", "ep"):
            return w, replace(lay, **{key: int(val)}), opt
        return replace(w, **{key: int(val)}), lay, opt
    except ValueError:
        raise PlanError(f"--what-if {key}={val}: not a number") from None


def alternatives(w: Workload, lay: Layout, hw: Hardware, opt: Options, spec: str) -> tuple[list[tuple[str, Prediction]], list[str]]:
    """[(label, prediction)] for the base and every combination; [skipped: reason]."""
    keys = parse(spec)
    rows, skipped, seen = [], [], set()
    choices = [[None, *vals] for vals in keys.values()]
    for combo in itertools.product(*choices):
        ww, ll, oo = w, lay, opt
        label = []
        for key, val in zip(keys, combo):
            if val is None:
                continue
            ww, ll, oo = _apply(ww, ll, oo, key, val)
            label.append(f"{key}={val}")
        name = ", ".join(label) or "base"
        if (ww, ll, oo) in seen:  # an alternative equal to the base (tp=8 when TP is 8) adds nothing
            continue
        seen.add((ww, ll, oo))
        try:
            rows.append((name, predict(ww, ll, hw, oo)))
        except PlanError as e:
            skipped.append(f"{name}: {e}")
    return rows, skipped
