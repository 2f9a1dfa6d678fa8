"""Run folders and history stores written by the release before schema 3 (commit cbc25b8: `p<N>` point
folders, `parallel`/`number` fields, no failure kinds, no gate settings in nights; the fixture in
tests/fixtures/legacy-cbc25b8/) are still read, reported, judged and resumed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.nightly.gate import gate_history
from harness.nightly.store import NightStore
from harness.results import iter_points, read_manifest
from harness.summary import load_runs

ROOT = Path(__file__).resolve().parents[1]
LEGACY = ROOT / "tests" / "fixtures" / "legacy-cbc25b8"


def _harness(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture
def legacy_run(tmp_path: Path) -> Path:
    run = tmp_path / "results" / "legacy-run"
    shutil.copytree(LEGACY / "run", run)
    return run


def test_an_old_run_folder_reads_under_the_new_names(legacy_run):
    manifest = read_manifest(legacy_run)
    assert manifest.schema_version == 2 and manifest.points == {"sim-offload512": {"c1": "ok", "c2": "ok"}}
    points = iter_points(legacy_run)
    assert [(p.concurrency, p.conversations, p.status, p.point_id) for p in points] == [
        (1, 1, "ok", "c1"), (2, 2, "ok", "c2")]
    frame = load_runs([legacy_run])  # its summary.csv lacks today's columns: recomputed from the points
    assert list(frame["concurrency"]) == [1, 2] and list(frame["conversations"]) == [1, 2]
    assert frame["interactivity_tok_s_user"].notna().all()


@pytest.mark.slow  # reports, draws and compares through the CLI (8 s)
def test_an_old_run_folder_is_reported_and_compared(legacy_run, tmp_path):
    report = _harness("report", "legacy-run", "--results-dir", str(legacy_run.parent), "--out",
                      str(tmp_path / "figs"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    text = (legacy_run / "report.md").read_text()
    assert "sim-offload512" in text and any((tmp_path / "figs").glob("timeseries-*.png"))
    same = _harness("compare", "legacy-run", "--reference", str(LEGACY / "run"), "--results-dir",
                    str(legacy_run.parent), cwd=tmp_path)
    assert same.returncode == 0 and "No regressions." in same.stdout, same.stderr


def test_an_old_history_is_listed_shown_and_judged(tmp_path):
    store = tmp_path / "history"
    shutil.copytree(LEGACY / "history", store)
    nights = NightStore(store).load().nights
    assert [n.night_id for n in nights] == ["legacy-n1", "legacy-n2"]
    assert all(r.concurrency in (1, 2) and r.conversations in (1, 2) for n in nights for r in n.rows)
    assert [r.outcome for r in gate_history(nights)] == ["pass", "pass"]
    listed = _harness("history", "list", "--store", str(store), cwd=tmp_path)
    assert listed.returncode == 0 and "legacy-n2" in listed.stdout, listed.stderr
    shown = _harness("history", "show", "legacy-n2", "--store", str(store), cwd=tmp_path)
    assert shown.returncode == 0 and "legacy-n2" in shown.stdout, shown.stderr
    site = _harness("dashboard", "--store", str(store), "--out", str(tmp_path / "site"), cwd=tmp_path)
    assert site.returncode == 0 and (tmp_path / "site" / "index.html").is_file(), site.stderr


@pytest.mark.slow
def test_an_old_run_folder_is_resumed_where_it_stopped(legacy_run, tmp_path):
    """The old run lost its c2 point: a sweep with the same run id skips c1 (its p1/ folder) and runs c2
    into the folder the old release made for it."""
    (legacy_run / "points" / "sim-offload512" / "p2" / "point.json").unlink()
    manifest = json.loads((legacy_run / "manifest.json").read_text())
    manifest["points"]["sim-offload512"]["p2"] = "pending"
    manifest["status"] = "interrupted"
    (legacy_run / "manifest.json").write_text(json.dumps(manifest))
    before = (legacy_run / "points" / "sim-offload512" / "p1" / "point.json").read_bytes()
    done = _harness("sweep", str(LEGACY / "legacy.yaml"), "--run-id", "legacy-run", "--results-dir",
                    str(legacy_run.parent), "--launcher", "local", "--no-report", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "1 point(s) already ok, skipped" in done.stdout
    assert (legacy_run / "points" / "sim-offload512" / "p1" / "point.json").read_bytes() == before
    resumed = json.loads((legacy_run / "points" / "sim-offload512" / "p2" / "point.json").read_text())
    assert resumed["status"] == "ok" and resumed["concurrency"] == 2 and resumed["schema_version"] == 3
    assert not (legacy_run / "points" / "sim-offload512" / "c2").exists()
    assert read_manifest(legacy_run).points == {"sim-offload512": {"c1": "ok", "c2": "ok"}}
    assert list(load_runs([legacy_run])["status"]) == ["ok", "ok"]
