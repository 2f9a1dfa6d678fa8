"""The figures of one or several runs: Pareto, occupancy, MTP acceptance, time series.

Every figure is built as a matplotlib `Figure` (no pyplot state, Agg canvas), so
tests inspect the objects and the caller decides where it goes. One colour per
deployment, one marker and line style per run, so the same deployment in two runs
reads as the same colour with a different marker.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from harness.errors import HarnessError
from harness.metrics.derive import OCCUPANCY_MARGIN_REQ
from harness.report.capacity import plot_capacity
from harness.report.figures import save_figure
from harness.report.labels import Label, place_labels
from harness.report.timeseries import DeploymentTimeline, load_timeline
from harness.report.validation import plot_validation
from harness.results import iter_points, read_manifest
from harness.summary import load_runs

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

XAxis = Literal["total", "output"]
X_COLUMNS: dict[XAxis, tuple[str, str]] = {
    "total": ("total_tok_s_per_gpu", "Total token throughput per GPU (tok/s/GPU, re-sent history included)"),
    "output": ("output_tok_s_per_gpu", "Output token throughput per GPU (tok/s/GPU)"),
}
COLOURS = ("#1f5fa8", "#d9541e", "#2a9d4b", "#8e44ad", "#c0392b", "#16a0a0", "#b8860b", "#555555")
MARKERS = ("o", "s", "^", "D", "v", "P")
LINESTYLES = ("-", "--", ":", "-.")
SIM_BANNER = "SIMULATED ENGINE: not GPU measurements"


@dataclass(frozen=True)
class Trace:
    """One deployment of one run: its completed points in concurrency order."""

    key: str  # legend label: "<dep>" for one run, "<run>/<dep>" for several
    colour: str
    marker: str
    linestyle: str
    frame: pd.DataFrame


def _traces(df: pd.DataFrame, columns: Sequence[str]) -> list[Trace]:
    runs = list(dict.fromkeys(df["run_id"]))
    deployments = list(dict.fromkeys(df["deployment"]))
    traces: list[Trace] = []
    for run_index, run in enumerate(runs):
        for dep in deployments:
            rows = df[(df["run_id"] == run) & (df["deployment"] == dep) & (df["status"] == "ok")]
            rows = rows.dropna(subset=list(columns)).sort_values("concurrency")
            if rows.empty:
                continue
            traces.append(Trace(
                key=dep if len(runs) == 1 else f"{run}/{dep}",
                colour=COLOURS[deployments.index(dep) % len(COLOURS)],
                marker=MARKERS[run_index % len(MARKERS)],
                linestyle=LINESTYLES[run_index % len(LINESTYLES)], frame=rows))
    return traces


def _new_figure(width_in: float = 9.0, height_in: float = 6.0) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def _mark_simulated(fig: Figure, df: pd.DataFrame | None = None, simulated: bool | None = None) -> None:
    banner = SIM_BANNER
    if df is not None:
        sim_runs = sorted({str(r) for r in df.loc[df["simulated"].fillna(False).astype(bool), "run_id"]})
        simulated = bool(sim_runs)
        if sim_runs and len(sim_runs) < df["run_id"].nunique():
            banner = f"SIMULATED ENGINE ({', '.join(sim_runs)}): not GPU measurements"
    if not simulated:
        return
    fig.text(0.5, 0.5, "SIMULATED", ha="center", va="center", rotation=28, fontsize=90, fontweight="bold",
             color="#c0392b", alpha=0.07, zorder=0)
    fig.suptitle(banner, color="white", fontsize=11, fontweight="bold",
                 bbox={"boxstyle": "round,pad=0.35", "facecolor": "#c0392b", "edgecolor": "none"})


def _failed_note(ax: Axes, df: pd.DataFrame) -> None:
    failed = df[df["status"] != "ok"].sort_values(["run_id", "deployment", "concurrency"])
    if failed.empty:
        return
    several = df["run_id"].nunique() > 1
    names = [f"{r.run_id + '/' if several else ''}{r.deployment} c{r.concurrency}" for r in failed.itertuples()]
    ax.annotate("failed, not shown: " + ", ".join(names), xy=(0.0, -0.13), xycoords="axes fraction",
                fontsize=8, color="#c0392b", va="top")


def _context(df: pd.DataFrame) -> str:
    parts = []
    models = sorted({str(m) for m in df["gpu_model"].dropna()})
    gpus = sorted({int(g) for g in df["gpus_per_server"].dropna()})
    if models:
        parts.append(" / ".join(models))
    if gpus:
        parts.append(" / ".join(f"{g} GPUs per server" for g in gpus))
    runs = list(dict.fromkeys(df["run_id"]))
    if runs:
        parts.append("run " + runs[0] if len(runs) == 1 else f"{len(runs)} runs")
    return ", ".join(parts)


def pareto_frontier(xs: Sequence[float], ys: Sequence[float]) -> list[int]:
    """Indices of the points no other point beats on both axes (higher is better on both)."""
    return [i for i, (x, y) in enumerate(zip(xs, ys, strict=True))
            if not any((x2 >= x and y2 >= y) and (x2 > x or y2 > y)
                       for x2, y2 in zip(xs, ys, strict=True))]


def build_pareto_figure(df: pd.DataFrame, x: XAxis = "total") -> Figure:
    """Interactivity against per-GPU throughput; the data line of each trace has gid 'pareto:<key>'."""
    x_col, x_label = X_COLUMNS[x]
    y_col = "interactivity_tok_s_user"
    fig = _new_figure()
    ax = fig.add_subplot()
    traces = _traces(df, [x_col, y_col])
    labels: list[Label] = []
    for trace in traces:
        xs = trace.frame[x_col].astype(float).tolist()
        ys = trace.frame[y_col].astype(float).tolist()
        (line,) = ax.plot(xs, ys, color=trace.colour, marker=trace.marker, linestyle=trace.linestyle,
                          linewidth=1.8, markersize=6, label=trace.key, zorder=3)
        line.set_gid(f"pareto:{trace.key}")
        front = sorted(pareto_frontier(xs, ys), key=lambda i: xs[i])
        fx, fy = [xs[i] for i in front], [ys[i] for i in front]
        # the frontier: a bold translucent band under its points, and a ring round each
        ax.plot(fx, fy, color=trace.colour, linewidth=8, alpha=0.2, solid_capstyle="round",
                solid_joinstyle="round", zorder=2, gid=f"frontier:{trace.key}")
        ax.scatter(fx, fy, s=190, facecolors="none", edgecolors=trace.colour, linewidths=1.6, zorder=4)
        labels += [Label(xv, yv, f"c{c}", trace.colour)
                   for xv, yv, c in zip(xs, ys, trace.frame["concurrency"], strict=True)]
    if traces:
        from matplotlib.lines import Line2D

        handles, names = ax.get_legend_handles_labels()
        handles.append(Line2D([], [], color="#444444", marker="o", markersize=13, markerfacecolor="none",
                              linewidth=7, alpha=0.5))
        names.append("Pareto frontier (ringed, shaded)")
        ax.legend(handles, names, loc="best", fontsize=9, framealpha=0.9)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.08)
    else:
        ax.text(0.5, 0.5, "no completed points", transform=ax.transAxes, ha="center", color="#777777")
    ax.set_xlabel(x_label)
    ax.set_ylabel("Interactivity (tok/s/user) = 1000 / mean TPOT (ms)")
    ax.set_title(f"Interactivity vs throughput: {_context(df)}", fontsize=11)
    ax.grid(True, alpha=0.3)
    _failed_note(ax, df)
    _mark_simulated(fig, df)
    # last: the labels are placed on the final layout
    place_labels(ax, labels, fontsize=8.5, bold=True, lines=[
        (t.frame[x_col].astype(float).tolist(), t.frame[y_col].astype(float).tolist()) for t in traces])
    return fig


# Where the running gauge's mean and the decode batch from the engine counters differ by more than
# OCCUPANCY_MARGIN_REQ, the occupancy figure and the report show both (docs/metrics.md, "Occupancy two ways").
GAUGE, BATCH = "gauge", "decode batch"


@dataclass(frozen=True)
class OccupancyReading:
    """A point's occupancy by both measures: the value the figure plots and which measure it is."""

    gauge: float | None   # occupancy_mean_running: mean of the non-zero vllm:num_requests_running samples
    batch: float | None   # decode_batch_mean: requests per engine step, from counters

    @property
    def source(self) -> str | None:
        return GAUGE if self.gauge is not None else (BATCH if self.batch is not None else None)

    @property
    def value(self) -> float | None:
        return self.gauge if self.gauge is not None else self.batch

    @property
    def disagree(self) -> bool:
        """Both measured and more than OCCUPANCY_MARGIN_REQ apart."""
        return (self.gauge is not None and self.batch is not None
                and abs(self.gauge - self.batch) > OCCUPANCY_MARGIN_REQ)


def _finite(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def occupancy_reading(gauge: object, batch: object) -> OccupancyReading:
    return OccupancyReading(_finite(gauge), _finite(batch))


def build_occupancy_figure(df: pd.DataFrame) -> Figure:
    """Measured mean running requests against offered concurrency, with y = x (offered) for reference.

    Each point is the running gauge's mean (filled marker) or, where no scrape saw a request running,
    the decode batch from the engine counters (hollow marker, labelled so). Where both exist and differ
    by more than OCCUPANCY_MARGIN_REQ, the decode batch is drawn too (hollow, joined to the gauge's
    point by a dotted line), both labels name their measure and a note under the axes lists the point."""
    from matplotlib.lines import Line2D

    fig = _new_figure()
    ax = fig.add_subplot()
    y_col, batch_col = "occupancy_mean_running", "decode_batch_mean"
    if batch_col not in df.columns:
        df = df.assign(**{batch_col: float("nan")})
    traces = [t for t in _traces(df, []) if not t.frame[[y_col, batch_col]].isna().all(axis=None)]
    labels: list[Label] = []
    lines: list[tuple[list[float], list[float]]] = []
    differ: list[str] = []
    empty: list[str] = []
    offered = sorted({int(c) for c in df["concurrency"].dropna()})
    several = df["run_id"].nunique() > 1
    if offered:
        top = max(offered)
        ax.plot([0, top * 1.05], [0, top * 1.05], color="#888888", linestyle="--", linewidth=1.2,
                label="offered concurrency (y = x)", zorder=1)
    hollow_shown = False
    for trace in traces:
        points = [(int(c), occupancy_reading(g, b)) for c, g, b in
                  zip(trace.frame["concurrency"], trace.frame[y_col], trace.frame[batch_col], strict=True)]
        points = [(c, r) for c, r in points if r.value is not None]
        cs = [c for c, _ in points]
        ys = [r.value for _, r in points]
        (line,) = ax.plot(cs, ys, color=trace.colour, marker=None, linestyle=trace.linestyle,
                          linewidth=1.8, label=trace.key, zorder=3)
        line.set_gid(f"occupancy:{trace.key}")
        lines.append(([float(c) for c in cs], [float(y) for y in ys]))
        gauge_pts = [(c, r.gauge) for c, r in points if r.source == GAUGE]
        batch_pts = [(c, r.batch) for c, r in points if r.source == BATCH or r.disagree]
        if gauge_pts:
            ax.plot(*zip(*gauge_pts, strict=True), linestyle="none", marker=trace.marker, markersize=6,
                    color=trace.colour, zorder=4, gid=f"occupancy-gauge:{trace.key}")
        if batch_pts:
            hollow_shown = True
            ax.plot(*zip(*batch_pts, strict=True), linestyle="none", marker=trace.marker, markersize=7,
                    markerfacecolor="white", markeredgewidth=1.6, color=trace.colour, zorder=4,
                    gid=f"occupancy-batch:{trace.key}")
        name = f"{trace.key} c" if several or len(traces) > 1 else "c"
        for c, r in points:
            if r.disagree:
                assert r.gauge is not None and r.batch is not None
                ax.plot([c, c], [r.gauge, r.batch], color=trace.colour, linestyle=":", linewidth=1.4, zorder=2,
                        gid=f"occupancy-differ:{trace.key}:c{c}")
                labels += [Label(c, r.gauge, f"{r.gauge:.1f} gauge", trace.colour),
                           Label(c, r.batch, f"{r.batch:.1f} batch", trace.colour)]
                differ.append(f"{name}{c} (gauge {r.gauge:.1f}, batch {r.batch:.1f})")
            elif r.source == BATCH:
                assert r.batch is not None
                labels.append(Label(c, r.batch, f"{r.batch:.1f} batch", trace.colour))
                empty.append(f"{name}{c} (batch {r.batch:.1f})")
            else:
                assert r.gauge is not None
                labels.append(Label(c, r.gauge, f"{r.gauge:.1f}", trace.colour))
    if offered:
        ax.set_xticks(offered, [f"c{c}" for c in offered])
        ax.set_xlim(0, max(offered) * 1.05)
        ax.set_ylim(0, max(offered) * 1.05)
    ax.set_xlabel("Offered concurrency (EvalScope --parallel, requests)")
    ax.set_ylabel("Measured mean running requests\n(filled: gauge, mean of non-zero vllm:num_requests_running;\n"
                  "hollow: decode batch, requests per engine step)")
    ax.set_title(f"Occupancy: requests the server actually ran: {_context(df)}", fontsize=11)
    if offered:
        handles, names = ax.get_legend_handles_labels()
        styles = {t.key: t for t in traces}
        handles = [Line2D([], [], color=styles[n].colour, linestyle=styles[n].linestyle, marker=styles[n].marker,
                          markersize=6) if n in styles else h for h, n in zip(handles, names, strict=True)]
        handles.append(Line2D([], [], color="#444444", marker="o", linestyle="none", markersize=6))
        names.append("gauge: mean of non-zero running samples")
        if hollow_shown:
            handles.append(Line2D([], [], color="#444444", marker="o", linestyle=":", markersize=7,
                                  markerfacecolor="white", markeredgewidth=1.6))
            names.append(f"decode batch (engine counters): where the gauge\nis empty or more than {OCCUPANCY_MARGIN_REQ:g} requests away")
        ax.legend(handles, names, loc="upper left", fontsize=9, framealpha=0.9)
    else:
        ax.text(0.5, 0.5, "no completed points", transform=ax.transAxes, ha="center", color="#777777")
    ax.grid(True, alpha=0.3)
    _failed_note(ax, df)
    notes = ([f"gauge and decode batch differ by more than {OCCUPANCY_MARGIN_REQ:g} requests: " + "; ".join(differ)]
             if differ else []) + (["no scrape saw a request running, decode batch shown: " + "; ".join(empty)]
                                   if empty else [])
    if notes:
        ax.annotate("\n".join(notes), xy=(0.0, -0.20 if not df[df["status"] != "ok"].empty else -0.13),
                    xycoords="axes fraction", fontsize=8, color="#7a4b00", va="top", wrap=True,
                    gid="occupancy-marked")
    _mark_simulated(fig, df)
    if offered:
        place_labels(ax, labels, fontsize=8, lines=[([0, max(offered)], [0, max(offered)])] + lines)
    return fig


def build_acceptance_figure(df: pd.DataFrame) -> Figure | None:
    """MTP acceptance length per point; None when no point has one (no speculation)."""
    y_col = "mtp_acceptance_length"
    traces = _traces(df, [y_col])
    if not traces:
        return None
    fig = _new_figure(8.0, 4.8)
    ax = fig.add_subplot()
    top = 1.0
    labels: list[Label] = []
    for trace in traces:
        cs = trace.frame["concurrency"].astype(int).tolist()
        ys = trace.frame[y_col].astype(float).tolist()
        top = max(top, *ys)
        (line,) = ax.plot(cs, ys, color=trace.colour, marker=trace.marker, linestyle=trace.linestyle,
                          linewidth=1.8, markersize=6, label=trace.key)
        line.set_gid(f"acceptance:{trace.key}")
        labels += [Label(c, y, f"{y:.2f}", trace.colour) for c, y in zip(cs, ys, strict=True)]
    offered = sorted({int(c) for t in traces for c in t.frame["concurrency"]})
    ax.set_xticks(offered, [f"c{c}" for c in offered])
    ax.set_ylim(1.0, top + 0.35 * (top - 1.0) + 0.1)
    ax.set_xlabel("Offered concurrency (requests)")
    ax.set_ylabel("MTP acceptance length (tokens per step)\n1 + d(accepted) / d(drafts)")
    ax.set_title(f"Speculative decoding acceptance: {_context(df)}", fontsize=11)
    ax.legend(loc="lower left", fontsize=9, framealpha=0.9)
    ax.grid(True, alpha=0.3)
    _mark_simulated(fig, df)
    place_labels(ax, labels, fontsize=8, lines=[
        (t.frame["concurrency"].astype(float).tolist(), t.frame[y_col].astype(float).tolist()) for t in traces])
    return fig


def _shade_windows(axes: Sequence[Axes], timeline: DeploymentTimeline, minutes: float) -> None:
    for i, w in enumerate(timeline.windows):
        colour = "#f2c4c0" if w.status != "ok" else ("#e3e9f2" if i % 2 == 0 else "#eef1e4")
        for ax in axes:
            ax.axvspan(w.start_s / minutes, w.end_s / minutes, color=colour, alpha=0.8, zorder=0, lw=0)
        label = f"c{w.concurrency}" + ("" if w.status == "ok" else " failed")
        axes[0].annotate(label, ((w.start_s + w.end_s) / 2 / minutes, 1.0), xycoords=("data", "axes fraction"),
                         xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8.5,
                         color="#c0392b" if w.status != "ok" else "#333333", fontweight="bold")


def build_timeseries_figure(timeline: DeploymentTimeline, simulated: bool = False, title: str = "") -> Figure:
    """Running/waiting requests, KV usage and transfer rates of one deployment, point windows shaded."""
    gpu_panel = bool(timeline.gpu_power_w)  # NVML telemetry (harness/telemetry.py), where there were GPUs
    fig = _new_figure(11.0, 10.5 if gpu_panel else 8.5)
    axes = fig.subplots(4 if gpu_panel else 3, 1, sharex=True)
    spans = [w.end_s for w in timeline.windows] + [t for s in timeline.requests for t in s.t_s[-1:]]
    minutes = 60.0 if max(spans, default=0.0) > 600 else 1.0
    unit = "min" if minutes == 60.0 else "s"
    _shade_windows(axes, timeline, minutes)
    styles = ("-", "--", ":", "-.")
    panels = ((axes[0], timeline.requests, "Requests", 1.0),
              (axes[1], timeline.kv_usage, "Cache usage (%)", 100.0),
              (axes[2], timeline.transfer_gb_s, "KV transfer rate (GB/s)", 1.0)) + (
        ((axes[3], timeline.gpu_power_w, "GPU power (W)", 1.0),) if gpu_panel else ())
    for ax, series_list, ylabel, scale in panels:
        for i, series in enumerate(series_list):
            ax.plot([t / minutes for t in series.t_s], [v * scale for v in series.values],
                    label=series.label, linestyle=styles[i % len(styles)], linewidth=1.5,
                    color=COLOURS[i % len(COLOURS)], drawstyle="steps-mid" if ax is axes[2] else "default")
        if series_list:
            ax.legend(loc="upper left", fontsize=8.5, framealpha=0.9)
            ax.set_ylim(bottom=0)
        else:
            ax.text(0.5, 0.5, "not exposed by this server", transform=ax.transAxes, ha="center",
                    va="center", color="#777777")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    if timeline.kv_usage:
        axes[1].set_ylim(0, 105)
    if timeline.scrapes_failed_t_s:
        for ax in axes:
            ax.plot([t / minutes for t in timeline.scrapes_failed_t_s], [0] * len(timeline.scrapes_failed_t_s),
                    "x", color="#c0392b", markersize=7, clip_on=False, zorder=5)
        axes[0].plot([], [], "x", color="#c0392b", label="failed /metrics scrape")
    for i, t in enumerate(timeline.counter_resets_t_s):
        for ax in axes:
            ax.axvline(t / minutes, color="#c0392b", linewidth=1.4, linestyle="-.", zorder=4,
                       label="counters reset (server restart)" if ax is axes[0] and i == 0 else None)
    if timeline.counter_resets_t_s or timeline.scrapes_failed_t_s:
        axes[0].legend(loc="upper left", fontsize=8.5, framealpha=0.9)
    axes[-1].set_xlabel(f"Time since the deployment's first point ({unit}); shaded: point windows")
    axes[0].set_title(title or f"{timeline.deployment}: server state over the run", fontsize=11, pad=16)
    _mark_simulated(fig, simulated=simulated)
    return fig


def _safe_stem(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def plot_runs(run_dirs: Iterable[Path | str], out_dir: Path, x: XAxis = "total") -> list[Path]:
    """Draw every figure of the runs into out_dir; returns the files written (PNG and SVG)."""

    run_dirs = [Path(r) for r in run_dirs]
    if x not in X_COLUMNS:

        raise HarnessError(f"--x {x}: choose one of {', '.join(X_COLUMNS)}")
    df = load_runs(run_dirs)
    out_dir = Path(out_dir)
    written: list[Path] = []
    written += save_figure(build_pareto_figure(df, x), out_dir, "pareto")
    if len(run_dirs) == 1:  # a validation run's predicted-vs-measured figure, beside its Pareto
        written += plot_validation(run_dirs[0], out_dir)
        written += plot_capacity(run_dirs[0], out_dir)  # a capacity run's figures (harness capacity)
    written += save_figure(build_occupancy_figure(df), out_dir, "occupancy")
    acceptance = build_acceptance_figure(df)
    if acceptance is not None:
        written += save_figure(acceptance, out_dir, "acceptance")
    for run_dir in run_dirs:
        manifest = read_manifest(run_dir)
        points = iter_points(run_dir)
        for dep in dict.fromkeys(p.deployment for p in points):
            dep_points = [p for p in points if p.deployment == dep]
            timeline = load_timeline(run_dir, dep, dep_points)
            simulated = manifest.simulated or any(p.simulated for p in dep_points)
            stem = f"timeseries-{dep}" if len(run_dirs) == 1 else f"timeseries-{manifest.run_id}-{dep}"
            title = f"{dep}: server state over the run" + (f" ({manifest.run_id})" if len(run_dirs) > 1 else "")
            written += save_figure(build_timeseries_figure(timeline, simulated, title), out_dir, _safe_stem(stem))
    return written


def default_plots_dir(run_dirs: Sequence[Path]) -> Path:
    """plots/<run-id>/ beside the results root (several runs: plots/<first-run-id>+<N more>/)."""
    first = Path(run_dirs[0])
    name = first.name if len(run_dirs) == 1 else f"{first.name}+{len(run_dirs) - 1}"
    return first.parent.parent / "plots" / name


def figures_present(plots_dir: Path) -> bool:
    return (Path(plots_dir) / "pareto.png").is_file() and (Path(plots_dir) / "occupancy.png").is_file()
