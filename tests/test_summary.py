"""summary.csv: stable columns, atomic write, and the round trip through load_runs."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from run_fixtures import HISPARSE, OFFLOAD, make_run

from harness.errors import HarnessError
from harness.io import atomic_write_json
from harness.records import EvalScopeSummary, PointMetrics
from harness.results import read_point
from harness.summary import (
    load_runs,
    resolve_run_dir,
    summary_columns,
    summary_columns_markdown,
    summary_frame,
    summary_table,
    write_summary_csv,
)


def test_columns_are_the_record_field_names():
    names = [name for name, _, _ in summary_columns()]
    assert len(names) == len(set(names))
    assert names[:9] == ["run_id", "deployment", "concurrency", "conversations", "dataset_offset", "status", "reason",
                         "failure", "simulated"]
    # every measured field has a column of the same name, so README and code cannot drift
    for field in list(PointMetrics.model_fields) + list(EvalScopeSummary.model_fields):
        assert field in names, field
    assert all(meaning for _, _, meaning in summary_columns())
    table = summary_columns_markdown()
    assert table.count("\n") == len(names) + 2 and "`interactivity_tok_s_user` | tok/s/user" in table


def test_summary_csv_round_trips_through_load_runs(tmp_path):
    run = make_run(tmp_path, failed_point=(OFFLOAD, 32), tpot_disagree_at=(HISPARSE, 8))
    path = write_summary_csv(run)
    assert path == run / "summary.csv"
    assert not [p for p in os.listdir(run) if p.endswith(".tmp")]
    header = path.read_text().splitlines()[0].split(",")
    assert header == [name for name, _, _ in summary_columns()]

    loaded = load_runs([run])
    pd.testing.assert_frame_equal(loaded, summary_frame(run))
    assert len(loaded) == 8
    failed = loaded[(loaded.deployment == OFFLOAD) & (loaded.concurrency == 32)].iloc[0]
    assert failed.status == "failed" and "exited" in failed.reason
    assert pd.isna(failed.interactivity_tok_s_user) and failed.failed_requests == 64 * 13
    ok = loaded[(loaded.deployment == HISPARSE) & (loaded.concurrency == 8)].iloc[0]
    point = read_point(run / "points" / HISPARSE / "c8" / "point.json")
    assert ok.interactivity_tok_s_user == point.metrics.interactivity_tok_s_user  # exact, not rounded
    assert bool(ok.tpot_disagrees) and not bool(ok.simulated) and ok.gpus_per_server == 8
    assert ok.gpu_model == "NVIDIA H200" and ok.key_set == ">=1.10"


def test_load_runs_joins_several_runs(tmp_path):
    a = make_run(tmp_path, "run-a")
    b = make_run(tmp_path, "run-b", simulated=True)
    write_summary_csv(a)  # one from its CSV, one computed from its points
    df = load_runs([a, b])
    assert df.groupby("run_id").size().to_dict() == {"run-a": 8, "run-b": 8}
    assert df.loc[df.run_id == "run-b", "simulated"].all()
    assert not df.loc[df.run_id == "run-a", "simulated"].any()


def test_a_stale_csv_is_not_trusted(tmp_path):
    run = make_run(tmp_path)
    write_summary_csv(run)
    point_path = run / "points" / OFFLOAD / "c8" / "point.json"
    point = read_point(point_path)
    point.metrics.interactivity_tok_s_user = 12.5
    atomic_write_json(run / "points" / point.deployment / point.point_id / "point.json", point)
    later = (run / "summary.csv").stat().st_mtime + 5
    os.utime(point_path, (later, later))
    df = load_runs([run])
    assert df[(df.deployment == OFFLOAD) & (df.concurrency == 8)].interactivity_tok_s_user.item() == 12.5


def test_not_a_run_folder_is_one_clear_error(tmp_path):
    with pytest.raises(HarnessError, match="no manifest.json"):
        load_runs([tmp_path])
    with pytest.raises(HarnessError, match="no such run folder"):
        resolve_run_dir("nope", results_root=tmp_path)


def test_resolve_run_dir_takes_a_path_or_an_id(tmp_path):
    run = make_run(tmp_path / "results", "r1")
    assert resolve_run_dir(str(run)) == run
    assert resolve_run_dir("r1", results_root=tmp_path / "results") == tmp_path / "results" / "r1"


def test_summary_table_is_compact_and_complete(tmp_path):
    run = make_run(tmp_path, failed_point=(OFFLOAD, 32))
    text = summary_table(run)
    lines = text.splitlines()
    assert lines[0].split() == ["deployment", "c", "status", "tok/s/user", "tok/s/GPU", "occupancy", "batch",
                                "accept", "preempt"]
    assert len(lines) == 2 + 8
    assert len({len(line) for line in lines}) == 1  # fixed width
    failed = next(line for line in lines if line.startswith(OFFLOAD) and " 32 " in line)
    assert "failed" in failed and failed.split()[-1] == "-"


def test_readme_documents_every_summary_column():
    from pathlib import Path

    from harness.summary import undocumented_columns

    missing = undocumented_columns((Path(__file__).resolve().parents[1] / "README.md").read_text())
    assert not missing, f"README.md lacks summary.csv columns: {missing}"
