"""`--what-if`: one parser, one typed answer, for every prediction (issue 58: three parsers before).

A spec is comma-separated `key=value|value|...` (a key's own list may use commas: `tp=4,8,16`).
What each key switches:
- `backend=B`: every collective of a measured trace to backend B (from a trace or bundle);
- `OP=B` for an op (allreduce, all_to_all, all_gather, send_recv, reduce_scatter, broadcast) with a
  backend named in PROFILE_BACKENDS or measured by a sweep: only that op's calls, from a trace;
- `tp=N`, `cp=N`, `ep=N`: a layout (from a commprobe bundle, one value; or alternatives for a plan);
- the model alternatives `plan` predicts from a model and hardware: `allreduce=ring|dda|...|xF`,
  `all_to_all=overlap|exposed`, `cp_variant=...`, `expert_imbalance=F`, `batch=N`, `prompt_len=N`.
`allreduce=dda` is both a trace switch and a model alternative: which one is read depends on where
the prediction starts (a trace: an op's backend; a model: the algorithm), so the parse keeps the
values and `kind_for` says which applies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InputError

LAYOUT = ("tp", "cp", "ep")
MODEL = ("allreduce", "all_to_all", "cp_variant", "expert_imbalance", "batch", "prompt_len")
OPS = ("allreduce", "all_to_all", "all_gather", "send_recv", "reduce_scatter", "broadcast")
KEYS = ("backend", *OPS, *LAYOUT, *MODEL)


class WhatIfError(InputError):
    """A --what-if spec that cannot be read: one line, exit 2."""


@dataclass(frozen=True)
class Switch:
    """One key of a spec and its alternatives, as written."""

    key: str
    values: tuple[str, ...]

    @property
    def kind(self) -> str:
        """'backend' (every call), 'op' (an op's calls), 'layout' (tp/cp/ep) or 'model' (plan's
        alternatives); `allreduce` is 'op' here, and `kind_for` reads it from a model as 'model'."""
        if self.key == "backend":
            return "backend"
        if self.key in LAYOUT:
            return "layout"
        if self.key in OPS:
            return "op"
        return "model"


def parse(spec: str) -> list[Switch]:
    """The switches a spec names, in order; WhatIfError in one line where it is not key=value."""
    out: list[Switch] = []
    for part in re.split(r",\s*(?=[a-z_]+\s*=)", (spec or "").strip()):
        if not part:
            continue
        key, sep, vals = part.partition("=")
        key = key.strip()
        if not sep or key not in KEYS:
            raise WhatIfError(f"--what-if: {part!r} is not key=value (keys: {', '.join(KEYS)})")
        alts = tuple(v.strip() for v in re.split(r"[|,]", vals) if v.strip())
        if not alts:
            raise WhatIfError(f"--what-if: {key} has no values")
        if any(s.key == key for s in out):
            raise WhatIfError(f"--what-if: {key} given twice")
        out.append(Switch(key, alts))
    if not out:
        raise WhatIfError("--what-if: empty (key=value, e.g. backend=dda or tp=4)")
    return out


def from_trace(spec: str) -> Switch:
    """The one switch a prediction from a trace or bundle takes: backend=B, OP=B or tp/cp/ep=N."""
    switches = parse(spec)
    if len(switches) != 1 or len(switches[0].values) != 1:
        raise WhatIfError(f"--what-if {spec!r}: from a trace, one switch with one value (backend=B, OP=B "
                          f"such as allreduce=dda, or tp=N)")
    s = switches[0]
    if s.kind == "model":
        raise WhatIfError(f"--what-if {spec!r}: {s.key} is a model alternative (plan without --from); from a trace: "
                          f"backend=B, OP=B or tp/cp/ep=N")
    if s.kind == "layout":
        try:
            n = int(s.values[0])
        except ValueError:
            raise WhatIfError(f"--what-if {spec}: {s.key}=N with N a whole number") from None
        if n < 1:
            raise WhatIfError(f"--what-if {spec}: {s.key} must be >= 1")
    return s


def for_model(spec: str) -> dict[str, list[str]]:
    """A plan's alternatives (model and layout keys), key -> values, in the spec's order."""
    out = {}
    for s in parse(spec):
        if s.kind == "backend" or (s.kind == "op" and s.key not in MODEL):
            raise WhatIfError(f"--what-if {s.key}=...: switches a measured trace's backend: use plan --from PATH")
        out[s.key] = list(s.values)
    return out
