"""The one judge: `compare` with one reference and the nightly gate with one baseline night find the same
regressions and exit the same way; a sweep's own thresholds give the same verdict from `nightly`, from
`history list/show` and from the dashboard, because the night keeps the settings it was judged with."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml
from run_fixtures import HISPARSE, OFFLOAD, make_run
from test_nightly_e2e import PROFILES, Nights

from harness.cli import main as cli_main
from harness.io import atomic_write_json
from harness.judge import Experiment
from harness.nightly.gate import gate_night
from harness.nightly.night import night_from_run
from harness.nightly.store import NightStore
from harness.nightly.thresholds import NightlySettings
from harness.report.compare import compare_runs
from harness.results import read_point

ROOT = Path(__file__).resolve().parents[1]


def _cases(root: Path) -> dict[str, Path]:
    make_run(root, "ref")
    runs = {"same": make_run(root, "same"),
            "slower": make_run(root, "slower", interactivity_drop=(OFFLOAD, 16, 0.2)),
            "broken": make_run(root, "broken", failed_point=(HISPARSE, 32)),
            "short": make_run(root, "short", points=((1, 4), (8, 16))),
            "ttft": make_run(root, "ttft")}
    point = read_point(runs["ttft"] / "points" / HISPARSE / "c8" / "point.json")
    point.metrics.mean_ttft_ms *= 1.3
    atomic_write_json(runs["ttft"] / "points" / HISPARSE / "c8" / "point.json", point)
    return runs


def _found(findings) -> set[tuple[str, str, str | None]]:
    return {(f.where, f.reason, f.metric) for f in findings}


def test_compare_and_the_gate_find_the_same_regressions_and_exit_alike(tmp_path):
    root = tmp_path / "results"
    runs = _cases(root)
    reference = night_from_run(root / "ref")
    seen = {}
    for name, run in runs.items():
        comparison = compare_runs(run, root / "ref")
        gate = gate_night(night_from_run(run).model_copy(update={"started_at": "2099-01-01T00:00:00Z"}),
                          [reference])
        assert _found(comparison.findings) == _found(gate.findings), name
        assert comparison.exit_code == gate.exit_code, name
        seen[name] = (gate.exit_code, sorted(_found(gate.findings)))
    assert seen["same"] == (0, [])
    assert seen["slower"] == (1, [(f"{OFFLOAD} c16", "threshold", m) for m in
                                  ("interactivity_tok_s_user", "output_tok_s_per_gpu", "total_tok_s_per_gpu")])
    assert seen["broken"] == (1, [(f"{HISPARSE} c32", "point_failed", None)])
    assert seen["ttft"] == (1, [(f"{HISPARSE} c8", "threshold", "mean_ttft_ms")])
    assert {w for w, _, _ in seen["short"][1]} == {f"{d} c{c}" for d in (HISPARSE, OFFLOAD) for c in (16, 32)}


def test_one_definition_of_comparable():
    h200 = Experiment(gpu_model="H200", gpus_per_server=8, workload={"recipe": "a"})
    assert h200.differences(h200) == []
    assert h200.differences(Experiment(gpu_model="H100", gpus_per_server=8)) == ["gpu_model 'H200' vs 'H100'"]
    assert h200.differences(Experiment(gpus_per_server=8, simulated=True)) == ["simulated False vs True"]
    assert h200.differences(Experiment(gpu_model="H200", gpus_per_server=8, workload={"recipe": "b"})) == [
        "workload differs: recipe 'a' vs 'b'"]
    # what one side does not record is not compared
    assert h200.differences(Experiment(gpus_per_server=8)) == []


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        code = cli_main(list(argv))
    return code, out.getvalue()


@pytest.mark.slow
def test_a_sweeps_own_thresholds_give_one_verdict_from_nightly_history_and_the_dashboard(tmp_path):
    """A 4% slower decode passes the default 0.90x rule and fails this sweep's own 0.98x one: the night
    that `nightly` called a regression is one in `history list`, `history show` and on the dashboard."""
    nights = Nights(tmp_path / "n")
    sweep = yaml.safe_load(nights.sweep.read_text())
    sweep["nightly"] = {"baseline_nights": 2, "thresholds": {"interactivity_tok_s_user": {"min_ratio": 0.98}}}
    nights.sweep.write_text(yaml.safe_dump(sweep, sort_keys=False))

    def night(run_id: str, scale: float) -> int:
        for dep, parent in PROFILES.items():  # no run jitter: the 4% is the only change
            path = nights.root / "launch" / f"{dep}.yaml"
            path.parent.mkdir(exist_ok=True)
            path.write_text(yaml.safe_dump({"extends": str(ROOT / "launch" / parent), "gpu": "H200",
                                            "sim": {"step_time_scale": scale}}))
        return _cli(*nights.argv(run_id, "--simulate", "--no-report", "--no-dashboard"))[0]

    codes = [night("own-n1", 1.0), night("own-n2", 1.0), night("own-n3", 1.04)]
    assert codes == [0, 0, 1]
    store = NightStore(nights.store)
    n3 = store.get("own-n3")
    assert n3.settings is not None and dict(n3.settings.thresholds.rules())["interactivity_tok_s_user"].min_ratio == 0.98
    # with the defaults the same night would pass: the verdict below comes from the stored settings
    assert gate_night(n3, store.load().before(n3), NightlySettings()).exit_code == 0

    code, listing = _cli("history", "list", "--store", str(nights.store))
    line = next(ln for ln in listing.splitlines() if ln.startswith("own-n3"))
    assert code == 0 and "regression" in line
    code, shown = _cli("history", "show", "own-n3", "--store", str(nights.store))
    assert code == 0 and shown.startswith("# Nightly regression: sim-nightly own-n3: interactivity_tok_s_user")
    site = tmp_path / "site"
    code, _ = _cli("dashboard", "--store", str(nights.store), "--out", str(site))
    index = (site / "index.html").read_text()
    row = index[index.index(">own-n3<"):][:600]
    assert code == 0 and "regression" in row
