"""End to end: the embedded default sweep on the simulated engine, then plot, report and compare."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.report.plots import build_pareto_figure
from harness.summary import load_runs

ROOT = Path(__file__).resolve().parents[1]


def _harness(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.slow
def test_sim_sweep_plots_reports_and_compares(tmp_path):
    results = tmp_path / "results"
    sweep = _harness("sweep", str(ROOT / "sweeps" / "sim.yaml"), "--launcher", "local", "--results-dir",
                     str(results), "--run-id", "sim-e2e", cwd=ROOT)
    assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-2000:]
    run = results / "sim-e2e"
    assert (run / "summary.csv").is_file()

    done = _harness("plot", str(run), "--out", str(tmp_path / "plots"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    df = load_runs([run])
    deployments = sorted(set(df.deployment))
    for stem in ["pareto", "occupancy", "acceptance"] + [f"timeseries-{d}" for d in deployments]:
        assert (tmp_path / "plots" / f"{stem}.png").is_file(), stem
        assert (tmp_path / "plots" / f"{stem}.svg").is_file(), stem

    fig = build_pareto_figure(df)
    lines = {ln.get_gid()[len("pareto:"):]: ln for ln in fig.axes[0].get_lines()
             if (ln.get_gid() or "").startswith("pareto:")}
    assert sorted(lines) == deployments
    for dep, line in lines.items():
        ok = df[(df.deployment == dep) & (df.status == "ok")]
        assert len(line.get_xdata()) == len(ok)
    assert any("SIMULATED" in t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text")))

    report = _harness("report", str(run), "--out", str(tmp_path / "plots"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "**SIMULATED**" in (run / "report.md").read_text()

    same = _harness("compare", str(run), "--reference", str(run), cwd=tmp_path)
    assert same.returncode == 0, same.stdout + same.stderr
