"""report.md: provenance, the points table, figures linked relative to it, and every warning."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from run_fixtures import HISPARSE, OFFLOAD, make_run

from harness.report import evidence_section as evidence
from harness.report.markdown import collect_warnings, reused_points, write_report
from harness.report.plots import plot_runs
from harness.results import iter_points, read_manifest

ROOT = Path(__file__).resolve().parents[1]


def test_report_holds_provenance_points_figures_and_warnings(tmp_path):
    run = make_run(tmp_path / "results", "run-w", failed_point=(OFFLOAD, 32), tpot_disagree_at=(HISPARSE, 8),
                   restart_at=(HISPARSE, 16), conversations_built=100)
    plots = tmp_path / "plots" / "run-w"
    plot_runs([run], plots)
    path = write_report(run, plots)
    assert path == run / "report.md"
    text = path.read_text()

    warnings = text.split("## Warnings", 1)[1].split("## Points", 1)[0]
    assert f"**failed point**: `{OFFLOAD}` c32 failed: server exited" in warnings
    # offsets 52, 56, 72, 104 over 100 conversations: c16 wraps onto fresh 0..3; c32's offset is past the
    # end, so it reads 0..63 and re-sends 0..3 (c16) and 52..63 (c1, c8)
    assert "**conversation reuse**: the dataset has 100 conversations but the sweep needs 168: c32 re-sends 16 " \
        "conversations an earlier point already sent" in warnings
    assert f"**TPOT disagreement**: `{HISPARSE}` c8" in warnings and "+25%" in warnings
    assert "late and in bursts, so its interactivity is overstated" in warnings
    assert f"**server restarted**: `{HISPARSE}` c16" in warnings

    rows = [line for line in text.splitlines() if line.startswith(f"| {HISPARSE} |")]
    assert len(rows) == 4
    assert "| **failed** |" in next(line for line in text.splitlines() if line.startswith(f"| {OFFLOAD} | 32 |"))
    assert "| sweep | glm53-tp8 (sweeps/tp8.yaml) |" in text and "| gpu.driver | 580.82.07 |" in text

    links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", text)
    assert len(links) == 5  # pareto, occupancy, acceptance, one time series per deployment
    for link in links:
        assert not os.path.isabs(link)
        assert (run / link).resolve().is_file(), link
    assert "SIMULATED" not in text


def test_a_clean_run_has_no_warnings_and_a_simulated_one_says_so(tmp_path):
    run = make_run(tmp_path, simulated=True)
    assert collect_warnings(read_manifest(run), iter_points(run)) == []
    text = write_report(run, tmp_path / "no-plots").read_text()
    assert "## Warnings\n\nNone." in text
    assert "**SIMULATED**" in text
    assert "No figures" in text


def test_reuse_names_the_points_that_run_past_the_dataset(tmp_path):
    # the blog's sweep with 128 conversations: offsets 52, 56, 72, 104, 152 (docs/facts.md §6). c24 wraps
    # from 104..127 onto 0..23, which nobody sent yet; 152 is past the end, so c32 reads 0..63 and re-sends
    # 0..23 (c24) and 52..63 (c1, c8)
    run = make_run(tmp_path, points=((1, 4), (8, 16), (16, 32), (24, 48), (32, 64)), conversations_built=128)
    assert reused_points(read_manifest(run), iter_points(run)) == [32]
    assert evidence.reused_points(read_manifest(run), iter_points(run)) == {32: 36}


def test_manifest_restarts_and_failed_scrapes_are_reported(tmp_path):
    run = make_run(tmp_path, scrape_error_at=(OFFLOAD, 8))
    manifest = read_manifest(run)
    manifest.deployments[OFFLOAD] = manifest.deployments[OFFLOAD].model_copy(update={"restarts": 2})
    kinds = {(w.kind, w.text.split(":")[0]) for w in collect_warnings(manifest, iter_points(run))}
    assert ("server restarted", f"`{OFFLOAD}`") in kinds
    assert ("failed scrapes", f"`{OFFLOAD}` c8") in kinds


def test_report_command_draws_missing_figures(tmp_path):
    make_run(tmp_path / "results", "run-r", failed_point=(OFFLOAD, 16))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-m", "harness", "report", "run-r"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "plots" / "run-r" / "pareto.png").is_file()
    report = (tmp_path / "results" / "run-r" / "report.md").read_text()
    assert "](../../plots/run-r/pareto.png)" in report
    assert "warning: failed point" in done.stdout


def test_contradicting_occupancy_measures_are_warned_and_both_shown(tmp_path):
    from harness.results import RunPaths, read_point

    run = make_run(tmp_path / "results", "run-o", simulated=True)
    paths = RunPaths(run)
    for (dep, parallel), (gauge, batch) in {(HISPARSE, 8): (1.0, 1.53), (HISPARSE, 16): (15.0, 14.8),
                                            (OFFLOAD, 8): (None, 3.1)}.items():
        record = read_point(paths.point_json(dep, parallel))
        metrics = record.metrics.model_copy(update={"occupancy_mean_running": gauge, "decode_batch_mean": batch})
        paths.point_json(dep, parallel).write_text(record.model_copy(update={"metrics": metrics}).model_dump_json())
    warnings = collect_warnings(read_manifest(run), iter_points(run))
    kinds = {(w.kind, w.text.split(":")[0]) for w in warnings}
    assert kinds == {("occupancy measures differ", f"`{HISPARSE}` c8"), ("occupancy from counters", f"`{OFFLOAD}` c8")}
    differ = next(w.text for w in warnings if w.kind == "occupancy measures differ")
    assert "gauge mean 1.00" in differ and "decode batch 1.53" in differ and "0.53 requests apart" in differ

    text = write_report(run, tmp_path / "no-plots").read_text()
    assert "occupancy gauge / decode batch (req)" in text
    row = lambda dep, c: next(line for line in text.splitlines() if line.startswith(f"| {dep} | {c} |"))  # noqa: E731
    assert "| **1.0 / 1.53** (differ) |" in row(HISPARSE, 8)
    assert "| 15.0 / 14.80 |" in row(HISPARSE, 16)
    assert "| - / 3.10 (batch) |" in row(OFFLOAD, 8)
    assert re.search(r"\| \d+\.\d / - \|", row(OFFLOAD, 1))  # the gauge alone: the fixture has no decode batch
