"""The capacity run's figures and report section (`harness capacity`, capacity.json):

(a) `capacity`: running requests against context length per arm. The calculator's curve for each arm (the
    HiSparse arm's HiSparse total, the baseline arm's plain GPU-resident figure) and the calculator's
    crossover (the length past which HiSparse holds more than plain residency); the measured capacity as
    points over the curves; the engine's own logged bound as a tick at each context; `does not fit` marked
    where the server refused the context's max_model_len.
(b) `capacity-slo`: the best total tok/s per GPU that met the sweep's SLO, against context length per arm
    (drawn only when the sweep has an SLO).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harness.calc import CalcError, find_crossover, inputs_for_launch, sizing_for_launch
from harness.capacity import CapacityRecord, CapacityReport, read_capacity
from harness.config import LaunchProfile
from harness.records import RunManifest
from harness.report.figures import save_figure
from harness.results import read_manifest

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLOURS = ("#1f5fa8", "#d9541e", "#2e8b57", "#8e44ad")
SIM_NOTE = "SIMULATED ENGINE: not GPU measurements"


def _arms(report: CapacityReport) -> dict[str, list[CapacityRecord]]:
    arms: dict[str, list[CapacityRecord]] = {}
    for r in sorted(report.results, key=lambda r: (r.arm, r.context_tokens or 0)):
        arms.setdefault(r.arm, []).append(r)
    return arms


def _profile(manifest: RunManifest, arm: str) -> LaunchProfile | None:
    """The arm's launch profile as the run resolved it (the manifest keeps one per sweep deployment)."""
    raw = manifest.resolved.launches.get(arm)
    if not raw:
        return None
    try:
        return LaunchProfile.model_validate(raw)
    except ValueError:
        return None


def _curve(profile: LaunchProfile, lengths: list[int]) -> tuple[list[int], list[int]] | None:
    """The calculator's concurrency at each length: HiSparse's total where the arm has HiSparse, else the
    plain GPU-resident figure."""
    xs, ys = [], []
    for n in lengths:
        try:
            result = sizing_for_launch(profile, n)
        except CalcError:
            return None
        xs.append(n)
        ys.append(result.predicted_total if profile.kv.hisparse is not None else result.baseline_total)
    return xs, ys


def crossover(manifest: RunManifest, report: CapacityReport) -> int | None:
    """Where the calculator puts the crossover for the run's HiSparse arm, within its contexts."""
    contexts = [r.context_tokens or r.max_model_len for r in report.results if (r.context_tokens or r.max_model_len)]
    if not contexts:
        return None
    for r in report.results:
        profile = _profile(manifest, r.arm)
        if profile is not None and profile.kv.hisparse is not None and "glm-5" in profile.serve.model.lower():
            try:
                return find_crossover(inputs_for_launch(profile, min(contexts)), min(contexts), max(contexts))
            except CalcError:
                return None
    return None


def _build_capacity_figure(manifest: RunManifest, report: CapacityReport) -> Figure:
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(9.5, 6.0))
    ax = fig.add_subplot(1, 1, 1)
    arms = _arms(report)
    lengths = sorted({r.max_model_len or r.context_tokens or 0 for r in report.results} - {0})
    for i, (arm, records) in enumerate(arms.items()):
        colour = COLOURS[i % len(COLOURS)]
        profile = _profile(manifest, arm)
        if profile is not None and "glm-5" in profile.serve.model.lower() and lengths:
            grid = sorted({int(lengths[0] * (lengths[-1] / lengths[0]) ** (k / 40)) for k in range(41)})
            curve = _curve(profile, grid)
            if curve is not None:
                ax.plot(*curve, color=colour, lw=1.2, alpha=0.6, label=f"{arm}: calculator")
        xs = [r.max_model_len or r.context_tokens for r in records if r.status != "does_not_fit"]
        ys = [r.capacity for r in records if r.status != "does_not_fit"]
        measured = [(x, y) for x, y in zip(xs, ys, strict=True) if x and y is not None]
        if measured:
            ax.plot(*zip(*measured, strict=True), "o", color=colour, ms=8, label=f"{arm}: measured capacity")
        ticks = [(r.max_model_len or r.context_tokens, r.logged_bound) for r in records if r.logged_bound is not None]
        if ticks:
            ax.plot(*zip(*ticks, strict=True), "_", color=colour, ms=22, mew=2.5, label=f"{arm}: engine's logged bound")
        refused = [r.max_model_len or r.context_tokens for r in records if r.status == "does_not_fit"]
        if refused:
            ax.plot(refused, [0.7] * len(refused), "x", color=colour, ms=12, mew=3, label=f"{arm}: does not fit")
            for x in refused:
                ax.annotate("does not fit", (x, 0.7), textcoords="offset points", xytext=(0, 10), ha="center",
                            color=colour, fontsize=9)
    cross = crossover(manifest, report)
    if cross is not None:
        ax.axvline(cross, color="#555555", ls="--", lw=1)
        ax.annotate(f"calculator crossover\n{cross:,} tokens", (cross, 1), xycoords=("data", "axes fraction"),
                    textcoords="offset points", xytext=(4, -28), fontsize=9, color="#555555")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(bottom=0.5)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    _context_axis(ax)
    ax.set_xlabel("Context: max_model_len per request (tokens, log scale)")
    ax.set_ylabel("Requests running at once (log scale)")
    ax.set_title("Capacity against context length: measured, logged, calculated")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if report.simulated:
        fig.text(0.5, 0.01, SIM_NOTE, ha="center", color="#c0392b", fontweight="bold")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def _context_axis(ax) -> None:
    """Context lengths as 8k, 128k, 1M on a log axis (both figures alike)."""
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:,.0f}k" if v < 1e6 else f"{v / 1e6:g}M"))


def _build_slo_figure(report: CapacityReport) -> Figure | None:
    from matplotlib.figure import Figure

    arms = _arms(report)
    if not any(r.best_slo_tok_s_per_gpu is not None for r in report.results):
        return None
    fig = Figure(figsize=(9.5, 5.5))
    ax = fig.add_subplot(1, 1, 1)
    for i, (arm, records) in enumerate(arms.items()):
        colour = COLOURS[i % len(COLOURS)]
        best = [r for r in records if r.best_slo_tok_s_per_gpu is not None]
        if best:
            xs = [r.max_model_len or r.context_tokens for r in best]
            ys = [r.best_slo_tok_s_per_gpu for r in best]
            ax.plot(xs, ys, "o-", color=colour, label=f"{arm} (label: the concurrency)")
            for x, y, r in zip(xs, ys, best, strict=True):
                ax.annotate(f"c{r.best_slo_concurrency}", (x, y), textcoords="offset points",
                            xytext=(0, 6 if i % 2 == 0 else -13),  # arms alternate above and below
                            ha="center", fontsize=7, color=colour)
        refused = [r.max_model_len or r.context_tokens for r in records if r.status == "does_not_fit"]
        if refused:
            ax.plot(refused, [0] * len(refused), "x", color=colour, markersize=10, mew=2.5, clip_on=False,
                    label=f"{arm}: does not fit")
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    _context_axis(ax)
    ax.set_xlabel("Context: max_model_len per request (tokens, log scale)")
    ax.set_ylabel("Best total tok/s per GPU meeting the SLO")
    ax.set_title("Throughput under the SLO against context length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    if report.simulated:
        fig.text(0.5, 0.01, SIM_NOTE, ha="center", color="#c0392b", fontweight="bold")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def plot_capacity(run_dir: Path, out_dir: Path) -> list[Path]:
    """The capacity figures of a run that has capacity.json (none otherwise)."""
    report = read_capacity(run_dir)
    if report is None or not report.results:
        return []
    manifest = read_manifest(run_dir)
    written = save_figure(_build_capacity_figure(manifest, report), out_dir, "capacity")
    slo = _build_slo_figure(report)
    if slo is not None:
        written += save_figure(slo, out_dir, "capacity-slo")
    return written


def capacity_section(run_dir: Path) -> list[str]:
    """The report's capacity table (markdown lines), or [] for a run without capacity.json."""
    report = read_capacity(run_dir)
    if report is None or not report.results:
        return []
    manifest = read_manifest(run_dir)
    cross = crossover(manifest, report)
    lines = ["## Capacity against context length", "",
             "Per arm and context: the largest concurrency at which every request stayed running (no preemption, "
             "the running gauge at the concurrency), the engine's own logged bound, and the calculator's estimate "
             "for the same deployment."
             + (" SIMULATED ENGINE: not GPU measurements." if report.simulated else ""), "",
             "| arm | context (tokens) | max_model_len | measured capacity | logged bound | calculator | best under "
             "SLO | probes |", "|---|--:|--:|--:|--:|--:|---|--:|"]
    for r in sorted(report.results, key=lambda r: (r.arm, r.context_tokens or 0)):
        if r.status == "does_not_fit":
            measured = "**does not fit**"
        elif r.status == "not_bracketed":
            measured = f">= {r.capacity} (not bracketed)"
        elif r.status == "failed":
            measured = f"failed: {r.reason}"
        else:
            measured = str(r.capacity)
        logged = "-" if r.logged_bound is None else f"{r.logged_bound:.2f}"
        calc = "-" if r.calculator_estimate is None else str(r.calculator_estimate)
        slo = "-" if r.best_slo_concurrency is None else f"c{r.best_slo_concurrency}: {r.best_slo_tok_s_per_gpu:,.0f} tok/s/GPU"
        lines.append(f"| {r.arm} | {r.context_tokens or '-':,} | {r.max_model_len or '-':,} | {measured} | {logged} | "
                     f"{calc} | {slo} | {len(r.probes)} |" if r.context_tokens and r.max_model_len else
                     f"| {r.arm} | - | - | {measured} | {logged} | {calc} | {slo} | {len(r.probes)} |")
    refused = [r for r in report.results if r.status == "does_not_fit"]
    if refused:
        lines += ["", "Refused at start-up (vLLM's reason):"]
        lines += [f"- {r.deployment}: {r.does_not_fit_reason}" for r in refused]
    if cross is not None:
        lines += ["", f"The calculator puts the crossover (HiSparse holds more than plain GPU-resident KV) at "
                      f"{cross:,} tokens."]
    return lines + [""]
