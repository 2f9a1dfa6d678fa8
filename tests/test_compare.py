"""`harness compare`: exit 0 when nothing regressed, 1 naming the point that did, 2 when refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_fixtures import HISPARSE, OFFLOAD, make_run

from harness.errors import HarnessError
from harness.io import atomic_write_json
from harness.report.compare import ComparisonRefused, compare_runs, load_reference, write_reference
from harness.results import read_point

ROOT = Path(__file__).resolve().parents[1]


def _compare(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "harness", "compare", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    make_run(root, "ref")
    make_run(root, "same")
    make_run(root, "slower", interactivity_drop=(OFFLOAD, 16, 0.2))
    return root


def test_identical_runs_exit_0(results):
    done = _compare("same", "--reference", "ref", cwd=results.parent)
    assert done.returncode == 0, done.stderr
    assert "No regressions." in done.stdout
    assert done.stdout.count(f"| {HISPARSE} |") == 4 and "+0.0%" in done.stdout


def test_a_20_percent_interactivity_drop_exits_1_and_names_the_point(results, tmp_path):
    summary = tmp_path / "summary.md"
    done = _compare(str(results / "slower"), "--reference", str(results / "ref"), "--summary-file", str(summary),
                    cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert f"- {OFFLOAD} c16: interactivity_tok_s_user" in done.stdout and "(-20.0%" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith(f"| {OFFLOAD} | 16 |"))
    assert "**REGRESSION**" in row
    others = [line for line in done.stdout.splitlines() if "REGRESSION" in line and line.startswith("|")]
    assert others == [row]
    assert summary.read_text() == done.stdout + "\n"
    # the same drop inside a looser tolerance is no regression
    assert _compare("slower", "--reference", "ref", "--tolerance", "0.25", cwd=results.parent).returncode == 0


def test_mismatched_hardware_is_refused_with_exit_2(results):
    make_run(results, "b200", gpu_model="NVIDIA B200")
    make_run(results, "tp4", gpus_per_server=4)
    for run, needle in (("b200", "gpu_model 'NVIDIA B200' vs 'NVIDIA H200'"), ("tp4", "gpus_per_server 4 vs 8")):
        done = _compare(run, "--reference", "ref", cwd=results.parent)
        assert done.returncode == 2
        assert needle in done.stderr and "not comparable" in done.stderr
        assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_different_workload_or_engine_is_refused(results):
    make_run(results, "other-data", workload_hash="sha256:0ther")
    make_run(results, "sim", simulated=True)
    with pytest.raises(ComparisonRefused, match="workload differs: dataset_sha256"):
        compare_runs(results / "other-data", results / "ref")
    with pytest.raises(ComparisonRefused, match="simulated True vs False"):
        compare_runs(results / "sim", results / "ref")


@pytest.mark.slow  # three compares through the CLI (7 s)
def test_reference_json_round_trip(results, tmp_path):
    ref_json = tmp_path / "ref.json"
    done = _compare("ref", "--write-reference", str(ref_json), cwd=results.parent)
    assert done.returncode == 0, done.stderr
    data = json.loads(ref_json.read_text())
    assert data["hardware"] == {"gpu_model": "NVIDIA H200", "gpus_per_server": 8, "simulated": False}
    assert set(data["deployments"]) == {HISPARSE, OFFLOAD}
    assert set(data["deployments"][OFFLOAD]) == {"1", "8", "16", "32"}
    assert "conversations_needed" not in data["workload"] and data["workload"]["dataset_sha256"] == "sha256:5be1c0ffee"
    assert load_reference(ref_json).points == load_reference(results / "ref").points
    library = write_reference(results / "ref", tmp_path / "lib.json")
    assert json.loads(library.read_text())["deployments"] == data["deployments"]

    assert _compare("same", "--reference", str(ref_json), cwd=results.parent).returncode == 0
    slower = _compare("slower", "--reference", str(ref_json), cwd=results.parent)
    assert slower.returncode == 1 and f"{OFFLOAD} c16" in slower.stdout


def test_higher_ttft_and_a_newly_failed_point_are_regressions(results):
    run = results / "same"
    point = read_point(run / "points" / HISPARSE / "c8" / "point.json")
    point.metrics.mean_ttft_ms *= 1.3
    atomic_write_json(run / "points" / point.deployment / point.point_id / "point.json", point)
    make_run(results, "broken", failed_point=(HISPARSE, 32))
    comparison = compare_runs(run, results / "ref")
    assert [(p.name, p.regressions) for p in comparison.points if p.regressions] == [
        (f"{HISPARSE} c8", ["mean_ttft_ms"])]
    broken = compare_runs(results / "broken", results / "ref")
    assert [(f.where, f.reason) for f in broken.findings] == [(f"{HISPARSE} c32", "point_failed")]
    assert broken.regressions[0].startswith(f"{HISPARSE} c32 failed: server exited")


def test_a_point_only_in_the_run_is_a_note_and_one_missing_from_it_a_regression(results):
    """As the nightly gate has it (compare is the gate with one reference): a point the reference measured
    and the run lacks is a regression; a point only the run has is a note."""
    make_run(results, "short", points=((1, 4), (8, 16)))
    comparison = compare_runs(results / "short", results / "ref")
    assert {(f.where, f.reason) for f in comparison.findings} == {
        (f"{dep} c{c}", "point_missing") for dep in (HISPARSE, OFFLOAD) for c in (16, 32)}
    longer = compare_runs(results / "ref", results / "short")
    assert longer.findings == [] and f"{OFFLOAD} c32: not in the reference" in longer.notes


def test_bad_inputs_are_one_line_errors(results, tmp_path):
    with pytest.raises(HarnessError, match="tolerance"):
        compare_runs(results / "same", results / "ref", tolerance=1.5)
    junk = tmp_path / "junk.json"
    junk.write_text('{"format": "something-else"}')
    with pytest.raises(HarnessError, match="not a reference JSON"):
        compare_runs(results / "same", junk)
    done = _compare("same", cwd=results.parent)
    assert done.returncode == 2 and "--reference" in done.stderr
