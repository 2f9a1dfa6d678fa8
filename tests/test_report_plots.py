"""Figures: every kind is written, and the Pareto figure holds what it should (matplotlib objects)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_fixtures import HISPARSE, OFFLOAD, POINTS, make_run

from harness.report.plots import (
    build_acceptance_figure,
    build_occupancy_figure,
    build_pareto_figure,
    default_plots_dir,
    pareto_frontier,
    plot_runs,
)
from harness.report.timeseries import load_timeline
from harness.summary import load_runs

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _harness(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def _data_lines(fig, prefix: str = "pareto:"):
    ax = fig.axes[0]
    return {line.get_gid()[len(prefix):]: line for line in ax.get_lines()
            if (line.get_gid() or "").startswith(prefix)}


def _texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text"))]


def test_plot_runs_writes_the_four_kinds(tmp_path):
    run = make_run(tmp_path / "results")
    out = tmp_path / "plots"
    written = plot_runs([run], out)
    stems = {"pareto", "occupancy", "acceptance", f"timeseries-{HISPARSE}", f"timeseries-{OFFLOAD}"}
    assert {p.name for p in written} == {f"{s}.{ext}" for s in stems for ext in ("png", "svg")}
    for stem in stems:
        assert (out / f"{stem}.png").read_bytes().startswith(PNG_MAGIC)
        assert "<svg" in (out / f"{stem}.svg").read_text()[:500]


def test_pareto_has_one_line_per_deployment_in_concurrency_order(tmp_path):
    run = make_run(tmp_path, failed_point=(OFFLOAD, 32))
    df = load_runs([run])
    fig = build_pareto_figure(df)
    lines = _data_lines(fig)
    assert set(lines) == {HISPARSE, OFFLOAD}
    assert len(lines[HISPARSE].get_xdata()) == len(POINTS)
    assert len(lines[OFFLOAD].get_xdata()) == len(POINTS) - 1  # the failed point is not drawn
    expected = df[(df.deployment == HISPARSE)].sort_values("concurrency")
    assert list(lines[HISPARSE].get_xdata()) == pytest.approx(expected.total_tok_s_per_gpu.tolist())
    assert list(lines[HISPARSE].get_ydata()) == pytest.approx(expected.interactivity_tok_s_user.tolist())
    assert lines[HISPARSE].get_color() != lines[OFFLOAD].get_color()
    texts = _texts(fig)
    assert {"c1", "c8", "c16", "c32"} <= set(texts)
    assert any("failed, not shown" in t and f"{OFFLOAD} c32" in t for t in texts)
    assert "tok/s/GPU" in fig.axes[0].get_xlabel() and "tok/s/user" in fig.axes[0].get_ylabel()
    assert not any("SIMULATED" in t for t in texts)

    output = _data_lines(build_pareto_figure(df, x="output"))
    assert list(output[HISPARSE].get_xdata()) == pytest.approx(expected.output_tok_s_per_gpu.tolist())


def test_pareto_frontier_marks_only_undominated_points():
    # (throughput, interactivity): the third point is beaten on both axes by the second
    assert pareto_frontier([1.0, 5.0, 4.0, 9.0], [90.0, 60.0, 50.0, 30.0]) == [0, 1, 3]
    assert pareto_frontier([1.0, 1.0], [5.0, 5.0]) == [0, 1]


def test_several_runs_overlay_with_their_own_markers(tmp_path):
    a = make_run(tmp_path, "run-a")
    b = make_run(tmp_path, "run-b", interactivity_drop=(OFFLOAD, 16, 0.2))
    fig = build_pareto_figure(load_runs([a, b]))
    lines = _data_lines(fig)
    assert set(lines) == {f"{r}/{d}" for r in ("run-a", "run-b") for d in (HISPARSE, OFFLOAD)}
    assert lines[f"run-a/{HISPARSE}"].get_marker() != lines[f"run-b/{HISPARSE}"].get_marker()
    assert lines[f"run-a/{HISPARSE}"].get_color() == lines[f"run-b/{HISPARSE}"].get_color()
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert f"run-b/{OFFLOAD}" in legend
    assert default_plots_dir([tmp_path / "results" / "run-a", b]) == tmp_path / "plots" / "run-a+1"


def test_simulated_runs_carry_a_visible_mark(tmp_path):
    run = make_run(tmp_path, simulated=True)
    df = load_runs([run])
    for fig in (build_pareto_figure(df), build_occupancy_figure(df), build_acceptance_figure(df)):
        assert any("SIMULATED" in t for t in _texts(fig))


def test_occupancy_has_the_offered_reference_and_a_line_per_deployment(tmp_path):
    df = load_runs([make_run(tmp_path)])
    fig = build_occupancy_figure(df)
    lines = _data_lines(fig, "occupancy:")
    assert set(lines) == {HISPARSE, OFFLOAD}
    assert list(lines[OFFLOAD].get_xdata()) == [c for c, _ in POINTS]
    reference = [line for line in fig.axes[0].get_lines() if "y = x" in str(line.get_label())]
    assert len(reference) == 1
    xs, ys = reference[0].get_data()
    assert list(xs) == list(ys)


def test_acceptance_figure_only_where_speculation_ran(tmp_path):
    df = load_runs([make_run(tmp_path)])
    assert set(_data_lines(build_acceptance_figure(df), "acceptance:")) == {HISPARSE, OFFLOAD}
    df["mtp_acceptance_length"] = float("nan")
    assert build_acceptance_figure(df) is None


def test_timeline_joins_points_and_survives_a_restart_and_a_failed_scrape(tmp_path):
    run = make_run(tmp_path, restart_at=(HISPARSE, 16), scrape_error_at=(HISPARSE, 8))
    timeline = load_timeline(run, HISPARSE)
    assert [w.concurrency for w in timeline.windows] == [c for c, _ in POINTS]
    assert timeline.windows[0].start_s == 0.0
    assert len(timeline.counter_resets_t_s) == 1
    reset = timeline.counter_resets_t_s[0]
    assert timeline.windows[2].start_s < reset < timeline.windows[2].end_s
    assert len(timeline.scrapes_failed_t_s) == 1
    labels = {s.label for s in timeline.transfer_gb_s}
    assert labels == {"offload load (host→GPU)", "offload store (GPU→host)", "HiSparse host→GPU"}
    for series in timeline.transfer_gb_s:
        assert min(series.values) >= 0.0  # a reset is counted from zero, never as a negative rate
    assert [s.label for s in timeline.requests] == ["running", "waiting"]

    offload = load_timeline(run, OFFLOAD)
    assert "HiSparse host→GPU" not in {s.label for s in offload.transfer_gb_s}
    assert not offload.counter_resets_t_s


@pytest.mark.slow  # draws every figure through the CLI (8 s)
def test_plot_command_defaults_to_plots_run_id(tmp_path):
    make_run(tmp_path / "results", "run-x", simulated=True)
    done = _harness("plot", "run-x", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "plots" / "run-x" / "pareto.svg").is_file()
    assert (tmp_path / "plots" / "run-x" / f"timeseries-{OFFLOAD}.png").is_file()

    bad = _harness("plot", "missing-run", cwd=tmp_path)
    assert bad.returncode == 2
    assert "missing-run" in bad.stderr and "Traceback" not in bad.stderr


def test_a_run_without_points_still_draws(tmp_path):
    import shutil

    run = make_run(tmp_path / "results")
    shutil.rmtree(run / "points")
    written = {p.name for p in plot_runs([run], tmp_path / "plots")}
    assert written == {"pareto.png", "pareto.svg", "occupancy.png", "occupancy.svg"}


def _set_occupancy(run: Path, values: dict[tuple[str, int], tuple[float | None, float | None]]) -> None:
    """Give points both occupancy measures: (gauge mean, decode batch) per (deployment, parallel)."""
    from harness.results import RunPaths, read_point

    paths = RunPaths(run)
    for (dep, parallel), (gauge, batch) in values.items():
        path = paths.point_json(dep, parallel)
        record = read_point(path)
        assert record is not None and record.metrics is not None
        metrics = record.metrics.model_copy(update={"occupancy_mean_running": gauge, "decode_batch_mean": batch})
        path.write_text(record.model_copy(update={"metrics": metrics}).model_dump_json(indent=2))
        os.utime(path, (path.stat().st_mtime + 5,) * 2)  # newer than summary.csv: the rows are recomputed


def test_occupancy_names_each_points_measure_and_shows_both_where_they_contradict(tmp_path):
    run = make_run(tmp_path)
    # the shape: the gauge missed the second request the counters saw running (c8 here), and a
    # point where no scrape saw a request at all (its gauge empty)
    _set_occupancy(run, {(HISPARSE, 1): (1.0, 0.93), (HISPARSE, 8): (1.0, 1.53), (HISPARSE, 16): (15.0, 14.8),
                         (OFFLOAD, 1): (1.0, 0.95), (OFFLOAD, 8): (None, 3.1)})
    fig = build_occupancy_figure(load_runs([run]))
    fig.canvas.draw()
    ax = fig.axes[0]
    by_gid = {line.get_gid(): line for line in ax.get_lines() if line.get_gid()}

    # the line runs through every point: the gauge where there is one, else the decode batch
    hisparse, offload = by_gid[f"occupancy:{HISPARSE}"], by_gid[f"occupancy:{OFFLOAD}"]
    assert list(hisparse.get_xdata())[:3] == [1, 8, 16] and list(hisparse.get_ydata())[:3] == [1.0, 1.0, 15.0]
    assert list(offload.get_xdata())[:2] == [1, 8] and list(offload.get_ydata())[:2] == [1.0, 3.1]
    # hollow markers where the value is the decode batch: the contradiction at HiSparse c8, the empty gauge
    # at offload c8; none where the two agree within the margin
    assert list(zip(*by_gid[f"occupancy-batch:{HISPARSE}"].get_data(), strict=True)) == [(8, 1.53)]
    assert list(zip(*by_gid[f"occupancy-batch:{OFFLOAD}"].get_data(), strict=True)) == [(8, 3.1)]
    assert by_gid[f"occupancy-batch:{OFFLOAD}"].get_markerfacecolor() == "white"
    assert list(by_gid[f"occupancy-differ:{HISPARSE}:c8"].get_ydata()) == [1.0, 1.53]
    assert not any(g.startswith(f"occupancy-differ:{OFFLOAD}") for g in by_gid)
    assert (1, 1.0) in list(zip(*by_gid[f"occupancy-gauge:{HISPARSE}"].get_data(), strict=True))

    labels = [t.get_text() for t in ax.texts if str(t.get_gid() or "").startswith("label:")]
    assert {"1.0 gauge", "1.5 batch", "3.1 batch"} <= {part for text in labels for part in text.split("/")}
    note = next(t.get_text() for t in ax.texts if t.get_gid() == "occupancy-marked")
    assert f"{HISPARSE} c8 (gauge 1.0, batch 1.5)" in note.split("\n")[0]
    assert "no scrape saw a request running" in note and f"{OFFLOAD} c8 (batch 3.1)" in note.split("\n")[1]
    assert f"{HISPARSE} c16" not in note and "0.3 requests" in note
    assert any("decode batch" in t for t in _texts(fig)) and any("gauge" in t for t in _texts(fig))


def test_occupancy_without_decode_batch_draws_as_before(tmp_path):
    df = load_runs([make_run(tmp_path)]).drop(columns=["decode_batch_mean"])
    fig = build_occupancy_figure(df)
    gids = [line.get_gid() or "" for line in fig.axes[0].get_lines()]
    assert not any(g.startswith(("occupancy-batch:", "occupancy-differ:")) for g in gids)
    assert not [t for t in fig.axes[0].texts if t.get_gid() == "occupancy-marked"]
