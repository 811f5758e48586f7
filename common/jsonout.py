"""The one way commprobe writes JSON for a person's tools to read (`--json`, `--out`): strict JSON
(RFC 8259) whatever the analysis met. A number that is not finite (a NaN median, an infinite rate)
becomes null, bytes become text (invalid UTF-8 replaced), numpy scalars their Python values, and
any other object its str(); `json.dumps(allow_nan=False)` then holds the line."""

from __future__ import annotations

import json
import math


def clean(o):
    """`o` with every value JSON can hold strictly."""
    if isinstance(o, dict):
        return {k if isinstance(k, str) else str(clean(k)): clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [clean(v) for v in o]
    if isinstance(o, bool) or o is None or isinstance(o, str):
        return o
    if isinstance(o, int):
        return o
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, (bytes, bytearray)):
        return bytes(o).decode("utf-8", "replace")
    item = getattr(o, "item", None)  # numpy scalars
    if callable(item):
        try:
            return clean(item())
        except (TypeError, ValueError):
            pass
    return str(o)


def dumps(o, indent: int | None = 1) -> str:
    return json.dumps(clean(o), indent=indent, allow_nan=False)
