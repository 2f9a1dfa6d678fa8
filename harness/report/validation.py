"""The predicted-vs-measured figure of a validation run (`harness calibrate --validate`): for every point of
the measured sweep, what the calibrated simulator predicted against what the real engine measured, mean
TPOT and total throughput, with the +-20% band the held-out points are tested against. It sits next to the
Pareto in the validation run's report."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.calibrate.validate import TOLERANCE, ValidationReport, read_validation
from harness.report.figures import save_figure
from harness.report.labels import Label, place_labels
from harness.sim.profiles import ValidationRow

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

STEM = "validation"
TITLE = "Predicted vs measured (calibrated simulator against the real engine)"
HELD_OUT, FITTED = "#d9541e", "#1f5fa8"


def _panel(ax: Axes, rows: Sequence[ValidationRow], measured: str, predicted: str, label: str) -> None:
    from matplotlib.ticker import FuncFormatter

    pairs = [(getattr(r, measured), getattr(r, predicted), r) for r in rows]
    pairs = [(m, p, r) for m, p, r in pairs if m and p]
    if not pairs:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        return
    lo = min(min(m, p) for m, p, _ in pairs) * 0.8
    hi = max(max(m, p) for m, p, _ in pairs) * 1.2
    ax.plot([lo, hi], [lo, hi], color="#555555", lw=1, label="predicted = measured")
    ax.fill_between([lo, hi], [lo * (1 - TOLERANCE), hi * (1 - TOLERANCE)],
                    [lo * (1 + TOLERANCE), hi * (1 + TOLERANCE)], color="#999999", alpha=0.15,
                    label=f"within {TOLERANCE:.0%}")
    for held_out, colour, name in ((False, FITTED, "fitted on"), (True, HELD_OUT, "held out")):
        chosen = [(m, p, r) for m, p, r in pairs if r.held_out == held_out]
        if chosen:
            ax.scatter([m for m, _, _ in chosen], [p for _, p, _ in chosen], color=colour, s=46, zorder=3,
                       marker="o" if held_out else "s", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    plain = FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 100 else f"{v:.3g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)
    ax.tick_params(which="minor", labelsize=7)
    ax.set_xlabel(f"measured {label}")
    ax.set_ylabel(f"predicted {label}")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper left")
    place_labels(ax, [Label(m, p, r.point.replace("cpu-", ""), HELD_OUT if r.held_out else FITTED)
                      for m, p, r in pairs], fontsize=7.5, lines=[([lo, hi], [lo, hi])])


def _build_validation_figure(report: ValidationReport) -> Figure:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11.0, 5.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    _panel(left, report.rows, "tpot_ms_measured", "tpot_ms_predicted", "mean TPOT (ms, server)")
    _panel(right, report.rows, "total_tok_s_measured", "total_tok_s_predicted", "total throughput (tok/s)")
    fig.suptitle(f"Calibrated simulator vs {Path(report.measured_run).name}: fitted on "
                 f"{', '.join(report.calibration_points)}", fontsize=10)
    return fig


def plot_validation(run_dir: Path, out_dir: Path) -> list[Path]:
    """The figure's PNG and SVG when the run folder holds a validation; [] otherwise."""
    report = read_validation(run_dir)
    if report is None:
        return []
    return save_figure(_build_validation_figure(report), out_dir, STEM)
