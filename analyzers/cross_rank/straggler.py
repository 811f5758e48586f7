"""One rule for naming a straggler, shared by the collectives table (matching.py) and the
verdict's culprit (cause.py), so the table, the verdict and the JSON never name different ranks.

A rank is named only where it stands out, by two tests taken together:
- *a lead worth chasing*: it caused at least LEAD_NEEDED times the waiting of every other rank.
  Ranks that take turns arriving last (a third process time-sharing two cores: 216 calls last
  each) cause about equal shares, and naming the one at 50.5 % against 49.5 % would send an
  engineer after a rank that is no slower than its peer;
- *beyond the noise*: that lead is at least Z_NEEDED standard errors, the calls taken as
  independent draws of who caused how much waiting. A fixed share alone (75 % once) read a real
  starved worker at 68-71 % (its peer in the collectives 19 ms against its own 9 ms) as "no one",
  and a share can be reached by chance in a handful of long waits.
The standard error leaves out the covariance of the two ranks within one call (a call where
both caused waiting: one arrived last, the other held on after it), which can only widen it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LEAD_NEEDED = 1.5
Z_NEEDED = 2.0
RULE = (f"a rank is named when it caused at least {LEAD_NEEDED:g}x the waiting of every other rank and that lead "
        f"is beyond the noise: at least {Z_NEEDED:g} standard errors over the calls")


@dataclass
class Standing:
    """Who stands out: `name` the rank named (None: no one); `top` the rank that caused most;
    `share` its share of the waiting; `lead` its waiting over the runner-up's (None: no
    runner-up caused any); `z` the lead's difference in standard errors (None: no spread)."""

    name: object | None
    top: object | None
    share: float
    lead: float | None
    z: float | None

    def rule(self) -> dict:
        """The rule and its figures, as the JSON carries them (`straggler_rule`)."""
        return {"rule": RULE, "lead_needed": LEAD_NEEDED, "z_needed": Z_NEEDED, "most_waiting_caused_by": self.top,
                "share": round(self.share, 4), "lead": None if self.lead is None else round(self.lead, 3),
                "z": None if self.z is None else round(self.z, 2)}


def stands_out(caused: dict, squares: dict, calls: int) -> Standing:
    """The standing from each rank's caused waiting (`caused`, µs), the sum over calls of its
    square per call (`squares`, µs²) and the number of calls the waiting was counted over
    (zeros included). No waiting: no rank."""
    total = sum(caused.values())
    if not total or total <= 0:
        return Standing(None, None, 0.0, None, None)
    ranked = sorted(caused, key=lambda k: -caused[k])
    top = ranked[0]
    second = caused[ranked[1]] if len(ranked) > 1 else 0.0
    lead = caused[top] / second if second > 0 else None
    diff = caused[top] - second
    q = squares.get(top, 0.0) + (squares.get(ranked[1], 0.0) if len(ranked) > 1 else 0.0)
    var = q - diff * diff / calls if calls else 0.0
    z = diff / math.sqrt(var) if var > 0 else None
    enough_lead = lead is None or lead >= LEAD_NEEDED
    beyond_noise = z is None and calls > 1 or z is not None and z >= Z_NEEDED
    return Standing(top if enough_lead and beyond_noise else None, top, caused[top] / total, lead, z)
