"""The CI regression gate: it consumes bundles and analyses (metrics with repeated samples),
compares them with a baseline and decides pass (0), regression (1) or unusable input (2).

`metrics` says what is measured, `stats` how a shift is judged, `decide` each metric's status (pass, regression, unusable) and the exit code."""

from .decide import (
                     PASS,
                     REGRESSION,
                     UNUSABLE,
                     BaselineUpdate,
                     GateResult,
                     MetricStatus,
                     Thresholds,
                     gate,
                     gate_one,
                     judge,
                     update_baseline,
)
from .metrics import SCHEMA, GateInputError, Metric, baseline_doc, load_metrics, pooled_metrics

__all__ = ["PASS", "REGRESSION", "SCHEMA", "UNUSABLE", "BaselineUpdate", "GateInputError", "GateResult", "Metric", "Thresholds",
           "MetricStatus", "baseline_doc", "gate", "gate_one", "judge", "load_metrics", "pooled_metrics",
           "update_baseline"]
