"""HiSparse evidence end to end: a sweep whose simulated engine silently leaves HiSparse off fails that
deployment before any point runs; the arm that runs it shows its start line beside the calculator in the
report. `python -m harness sweep` and `report` as a user runs them, the local launcher, real EvalScope."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sweep_support import ROOT, points_of, run_sweep, write_sweep

pytestmark = pytest.mark.slow


def test_an_arm_that_ignores_hisparse_is_refused_and_one_that_runs_it_shows_its_evidence(tmp_path):
    sweep = write_sweep(tmp_path, {"hisparse-on": "", "hisparse-off": "sim: {faults: {ignore_hisparse: true}}\n"}, [(1, 1)])
    done = run_sweep(sweep, "ev")
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]  # one arm failed
    run = tmp_path / "results" / "ev"
    points = points_of(run)
    assert points[("hisparse-on", 1)].status == "ok"
    off = points[("hisparse-off", 1)]
    assert off.status == "failed" and off.reason.startswith("HiSparse requested but not active")
    assert not (run / "points/hisparse-off/c1/evalscope").exists()  # the point never ran
    manifest = json.loads((run / "manifest.json").read_text())
    on, refused = manifest["deployments"]["hisparse-on"]["evidence"], manifest["deployments"]["hisparse-off"]["evidence"]
    assert on["hisparse_active"] is True and on["logged_concurrency_tokens"] == 8192
    assert on["logged_max_concurrency"] == on["predicted_concurrency"] == 8
    assert "vllm:hisparse_cache_hits" in on["metric_families"]
    assert refused["hisparse_active"] is False and refused["metric_families"] == []

    report = subprocess.run([sys.executable, "-m", "harness", "report", str(run)], capture_output=True,
                            text=True, timeout=300, cwd=ROOT)
    assert report.returncode == 0, report.stderr[-2000:]
    text = (run / "report.md").read_text()
    assert "| hisparse-on | yes | 384 GiB, 125,907 blocks | 8 at 8,192 tokens | 8 |" in text
    assert "| hisparse-off | **no** |" in text and "**HiSparse not active**: `hisparse-off`" in text
    assert "sampled every 2,000 worker steps" in text
    assert "Client: EvalScope 1.14.1 (the harness's own environment)." in text
