"""The CI regression gate: it consumes bundles and analyses (metrics with repeated samples),
compares them with a baseline and decides pass (0), regression (1) or unusable input (2).

`metrics` says what is measured, `stats` how a shift is judged, `decide` the verdicts."""

from .decide import PASS, REGRESSION, UNUSABLE, GateResult, Thresholds, Verdict, gate, judge
from .metrics import SCHEMA, GateInputError, Metric, baseline_doc, load_metrics, pooled_metrics

__all__ = ["PASS", "REGRESSION", "SCHEMA", "UNUSABLE", "GateInputError", "GateResult", "Metric", "Thresholds",
           "Verdict", "baseline_doc", "gate", "judge", "load_metrics", "pooled_metrics"]
