"""Which way is better for each metric the nightly knows, and the gate's thresholds.

The thresholds are the `nightly:` section of a sweep file; their schema is in harness/config/nightly.py
(so a sweep file is checked when it loads) and is re-exported here for the gate and its callers.
"""

from __future__ import annotations

from typing import Literal

from harness.config.nightly import GATEABLE_METRICS, GateThresholds, MetricRule, NightlySettings

__all__ = ["GATEABLE_METRICS", "METRIC_BETTER", "Better", "GateThresholds", "MetricRule", "NightlySettings",
           "metric_better"]

Better = Literal["higher", "lower"]

# Which way is better for the metrics the gate, the change points and the dashboard know by default.
METRIC_BETTER: dict[str, Better] = {
    "interactivity_tok_s_user": "higher",
    "total_tok_s_per_gpu": "higher",
    "output_tok_s_per_gpu": "higher",
    "mean_ttft_ms": "lower",
    "occupancy_mean_running": "higher",
    "mtp_acceptance_length": "higher",
}


def metric_better(metric: str) -> Better | None:
    return METRIC_BETTER.get(metric)
