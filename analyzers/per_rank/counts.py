"""What one rank's trace holds on the device, counted: kernels, copies and memsets, the kernels
classified as communication, and their summed durations (not the union the attribution uses).
A user checks the reader against the producer's own tools with these numbers (rocprofv3's and
rpd's `top`, nsys stats), and the tests check each reader against an independent count."""

from __future__ import annotations

import numpy as np

from commprobe.common.vocab import COMM_CODES, copy_direction

from ..readers.model import Trace
from .classify import Classified

_KINDS = {"kernel": ("kernel", "Kernel"), "memcpy": ("gpu_memcpy", "Memcpy"), "memset": ("gpu_memset", "Memset")}


def device_counts(trace: Trace, cls: Classified) -> dict:
    """{kernel, memcpy, memset, comm_kernel: {n, us}}: event counts and summed durations in µs, and
    `copy_us_by_direction` (H2D, D2H, D2D, peer, memset): what the data-movement verdict names."""
    out = {}
    copies = np.zeros(len(trace.ts), bool)
    comm = np.isin(cls.category, COMM_CODES)
    for key, cats in _KINDS.items():
        ids = [i for i, c in enumerate(trace.cats) if c in cats]
        sel = np.isin(trace.cat_id, ids)
        out[key] = {"n": int(sel.sum()), "us": float(trace.dur[sel].sum())}
        if key != "kernel":
            copies |= sel
        if key == "kernel":
            k = sel & comm
            out["comm_kernel"] = {"n": int(k.sum()), "us": float(trace.dur[k].sum())}
    by_dir: dict[str, float] = {}
    idx = np.flatnonzero(copies)
    if idx.size:
        per_name = np.bincount(trace.name_id[idx], weights=trace.dur[idx], minlength=len(trace.names))
        for nid in np.flatnonzero(per_name).tolist():
            d = copy_direction(trace.names[nid])
            by_dir[d] = by_dir.get(d, 0.0) + float(per_name[nid])
    out["copy_us_by_direction"] = dict(sorted(by_dir.items()))
    return out
