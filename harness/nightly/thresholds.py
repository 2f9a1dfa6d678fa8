"""Which way is better for each metric the nightly knows, and the gate's thresholds.

The thresholds are the `nightly:` section of a sweep file; their schema is in harness/config/nightly.py
(so a sweep file is checked when it loads) and is re-exported here for the gate and its callers.
"""

from __future__ import annotations

from harness.catalogue import Better, gated_by_default
from harness.config.nightly import GATEABLE_METRICS, GateThresholds, MetricRule, NightlySettings

__all__ = ["GATEABLE_METRICS", "METRIC_BETTER", "Better", "GateThresholds", "MetricRule", "NightlySettings"]

# Which way is better for the metrics the gate, the change points and the dashboard know by default
# (the catalogue's gated metrics).
METRIC_BETTER: dict[str, Better] = {m.name: m.better for m in gated_by_default() if m.better is not None}
