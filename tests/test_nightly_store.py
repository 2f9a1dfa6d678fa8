"""The history store and the run-folder adapter: append, list, skip what is not a night, attach files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_fixtures import HISPARSE, OFFLOAD, POINTS, make_run
from synthetic_nights import synthetic_history

from harness.errors import HarnessError
from harness.nightly.night import night_from_run
from harness.nightly.night_record import NightRecord
from harness.nightly.store import NightStore


def test_add_then_load_returns_nights_oldest_first_whatever_the_order_added(tmp_path: Path) -> None:
    nights = synthetic_history(4)
    store = NightStore(tmp_path / "history")
    for night in (nights[2], nights[0], nights[3], nights[1]):
        store.add(night)
    loaded = store.load()
    assert loaded.warnings == []
    assert [n.night_id for n in loaded.nights] == [n.night_id for n in nights]
    assert loaded.nights[1] == nights[1]  # the JSON round trip keeps every field, typed
    assert sorted(p.name for p in (tmp_path / "history" / "nights").iterdir()) == \
        sorted(f"{n.night_id}.json" for n in nights)  # one file per night, no temporary file left
    assert [n.night_id for n in loaded.before(nights[2])] == [nights[0].night_id, nights[1].night_id]


def test_a_night_is_not_overwritten_unless_asked(tmp_path: Path) -> None:
    night = synthetic_history(1)[0]
    store = NightStore(tmp_path)
    store.add(night)
    with pytest.raises(HarnessError, match="already in the history"):
        store.add(night)
    changed = night.model_copy(update={"sweep_name": "renamed"})
    store.add(changed, replace=True)
    assert store.get(night.night_id).sweep_name == "renamed"


def test_corrupt_and_foreign_files_are_reported_and_skipped(tmp_path: Path) -> None:
    nights = synthetic_history(2)
    store = NightStore(tmp_path)
    for night in nights:
        store.add(night)
    folder = store.nights_dir
    good = json.loads(store.path_for(nights[0].night_id).read_text())
    (folder / "cut-short.json").write_text(store.path_for(nights[0].night_id).read_text()[:200])
    (folder / "foreign.json").write_text('{"hello": "world"}')
    (folder / "newer.json").write_text(json.dumps({**good, "night_id": "newer", "schema_version": 99}))
    (folder / "renamed.json").write_text(json.dumps(good))  # holds nights[0] under another name
    (folder / "malformed.json").write_text(json.dumps({**good, "night_id": "malformed", "rows": "x"}))
    (folder / "README.txt").write_text("the history branch")
    (folder / ".n.json.abc.tmp").write_text("{")  # an atomic write in progress: not a night, not news
    loaded = store.load()
    assert [n.night_id for n in loaded.nights] == [n.night_id for n in nights]
    problems = {Path(w.split(": ")[1]).name: w for w in loaded.warnings}
    assert set(problems) == {"cut-short.json", "foreign.json", "newer.json", "renamed.json", "malformed.json",
                             "README.txt"}
    assert all(w.startswith("warning: ") and w.endswith("; skipped") and "\n" not in w for w in loaded.warnings)
    assert "corrupt JSON" in problems["cut-short.json"]
    assert "not a night record" in problems["foreign.json"]
    assert "schema 99 is newer" in problems["newer.json"]
    assert f"holds night {nights[0].night_id!r}" in problems["renamed.json"]
    assert "malformed night record: rows" in problems["malformed.json"]


def test_an_absent_store_is_an_empty_history(tmp_path: Path) -> None:
    loaded = NightStore(tmp_path / "nothing-here").load()
    assert loaded.nights == [] and loaded.warnings == []
    with pytest.raises(HarnessError, match="no night 'x'"):
        NightStore(tmp_path).get("x")


def test_report_and_figures_are_copied_beside_the_night_with_relative_links(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    report.write_text("# tonight\n")
    figure = tmp_path / "pareto.svg"
    figure.write_text("<svg/>")
    store = NightStore(tmp_path / "history")
    stored = store.add(synthetic_history(1)[0], report=report, figures=[figure])
    assert stored.report_path == f"artifacts/{stored.night_id}/report.md"
    assert stored.figure_paths == [f"artifacts/{stored.night_id}/figures/pareto.svg"]
    assert (store.root / stored.report_path).read_text() == "# tonight\n"
    assert store.get(stored.night_id).figure_paths == stored.figure_paths
    with pytest.raises(HarnessError, match="cannot attach"):
        store.add(synthetic_history(2)[1], report=tmp_path / "missing.md")


def test_night_from_run_reads_rows_provenance_and_evidence(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "results", "nightly-1", failed_point=(OFFLOAD, 16))
    night = night_from_run(run_dir, report_path="artifacts/nightly-1/report.md")
    assert night.night_id == "nightly-1" and night.sweep_name == "glm53-tp8"
    assert night.started_at == "2026-05-28T02:13:20Z"
    assert night.sweep_sha256 == "3f1a9c0e"  # the sweep file's hash from the provenance
    assert (night.gpu.model, night.gpu.count, night.gpu.driver) == ("NVIDIA H200", 8, "580.82.07")
    assert night.provenance.harness_commit == "d9ea2f4" and night.provenance.evalscope_version == "1.14.1"
    assert set(night.deployments) == {HISPARSE, OFFLOAD}
    assert night.deployments[HISPARSE].vllm_version == "0.33.0"
    assert night.deployments[HISPARSE].vllm_commit is None  # absent in the manifest: None, not an error
    assert night.points() == sorted((d, p) for d in (HISPARSE, OFFLOAD) for p, _ in POINTS)
    assert night.row(OFFLOAD, 16).status == "failed" and night.value(OFFLOAD, 16, "total_tok_s_per_gpu") is None
    value = night.value(HISPARSE, 16, "interactivity_tok_s_user")
    assert isinstance(value, float) and value > 0
    assert isinstance(night.row(HISPARSE, 16).concurrency, int)
    # round trip through the store keeps it equal
    store = NightStore(tmp_path / "history")
    store.add(night)
    assert store.get("nightly-1") == night
    assert NightRecord.model_validate_json(store.path_for("nightly-1").read_text()) == night


def test_night_from_a_folder_that_is_not_a_run_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="not a run folder"):
        night_from_run(tmp_path)


def _command(module, argv: list[str]) -> int:
    """A subcommand as the CLI runs it: its own parser, then run(); errors are HarnessError."""
    import argparse

    parser = argparse.ArgumentParser(prog="harness")
    module.register(parser)
    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


def test_history_and_dashboard_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.commands import dashboard, history

    results = tmp_path / "results"
    first = make_run(results, "nightly-1")
    (first / "report.md").write_text("# nightly-1\n")
    store = str(tmp_path / "history")
    assert _command(history, ["add", str(first), "--store", store]) == 0
    assert "added night nightly-1" in capsys.readouterr().out
    with pytest.raises(HarnessError, match="already in the history"):
        _command(history, ["add", str(first), "--store", store])
    assert NightStore(store).get("nightly-1").report_path == "artifacts/nightly-1/report.md"
    assert _command(history, ["list", "--store", store]) == 0
    listing = capsys.readouterr().out
    assert "nightly-1" in listing and "8x NVIDIA H200" in listing and "pass" in listing
    assert _command(history, ["show", "--store", store]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("# Nightly pass: glm53-tp8 nightly-1") and "first night" in shown
    with pytest.raises(HarnessError, match="no night 'nope'"):
        _command(history, ["show", "nope", "--store", store])
    assert _command(dashboard, ["--store", store, "--out", str(tmp_path / "site")]) == 0
    assert "1 night(s), 12 chart(s)" in capsys.readouterr().out
    assert (tmp_path / "site" / "nights" / "nightly-1.html").is_file()
    assert (tmp_path / "site" / "artifacts" / "nightly-1" / "report.md").is_file()
