"""Pinned EvalScope clients: the EvalScope a sweep's `client.evalscope` names, built once into a cached
virtual environment and reused after, the way server builds are (builds/envs.py).

- a release (`1.7.0`, the code the blog's commit acd09b44 shipped as): `pip install evalscope[perf]==1.7.0`;
- a git ref (`acd09b44`, `owner/evalscope@ref`): `pip install "evalscope[perf] @ git+https://github.com/..."`.

The environment lives under ~/.cache/hisparse-harness/clients/<hash of the spec and the recipe>, is
built in a temporary folder and renamed into place (a half-built one is never used), and holds a
marker with the version it really installed. `evalscope[perf]` brings no torch (docs/facts.md §6).
The harness runs it as `<env>/bin/python -m evalscope.cli.cli`: module form, so the environment's
console scripts (which name the temporary folder) never matter.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.builds.cached import build_log_path, build_once
from harness.builds.envs import BuildStep, _run_step
from harness.builds.locks import (
    Lock,
    LockError,
    differences,
    find_lock,
    install_argv,
    installed_versions,
    keep_bytecode,
    pip_install,
)
from harness.builds.probe import BuildError
from harness.config.sweep import evalscope_spec_parts
from harness.io import json_digest

Progress = Callable[[str], None]

RECIPE_VERSION = 2  # bump when the steps change: a new recipe makes a new environment
DEFAULT_CLIENTS_DIR = Path("~/.cache/hisparse-harness/clients")
MARKER = "harness-client.json"
EVALSCOPE_MODULE = "evalscope.cli.cli"


@dataclass(frozen=True)
class ClientEnv:
    """A built EvalScope environment, as its marker records it."""

    spec: str
    env_dir: Path
    python: str
    evalscope_version: str
    created: bool
    build_s: float
    lock: dict | None = None  # the lock installed (recipe, file, sha256); None: resolved as pip did that day

    @property
    def program(self) -> tuple[str, ...]:
        return (self.python, "-m", EVALSCOPE_MODULE)


def client_lock(spec: str) -> Lock | None:
    """The lock of a release spec (evalscope-1.7.0) for this Python and platform, if one is shipped."""
    kind, version, _ = evalscope_spec_parts(spec)
    return find_lock(f"evalscope-{version}") if kind == "pypi" else None


def client_key(spec: str) -> str:
    lock = client_lock(spec)
    material = {"recipe": RECIPE_VERSION, "evalscope": spec,
                "python": f"{sys.version_info.major}.{sys.version_info.minor}",
                "lock": lock.sha256 if lock else None}
    return json_digest(material)


def client_env_dir(spec: str, clients_dir: Path | None = None) -> Path:
    return (clients_dir or DEFAULT_CLIENTS_DIR).expanduser() / client_key(spec)


def client_program(spec: str, clients_dir: Path | None = None) -> tuple[str, ...]:
    """The command prefix the pinned client has (or will have once built): a pure function of the spec,
    so the plan renders the points' commands without building anything."""
    return (str(client_env_dir(spec, clients_dir) / "bin" / "python"), "-m", EVALSCOPE_MODULE)


def requirement(spec: str) -> str:
    kind, first, ref = evalscope_spec_parts(spec)
    if kind == "pypi":
        return f"evalscope[perf]=={first}"
    return f"evalscope[perf] @ git+https://github.com/{first}.git@{ref}"


def planned_version(spec: str) -> str | None:
    """The version a release spec pins (None for a git ref: known only once built)."""
    kind, first, _ = evalscope_spec_parts(spec)
    return first if kind == "pypi" else None


def recipe_steps(spec: str, env_dir: Path, lock: Lock | None = None) -> list[BuildStep]:
    python = str(env_dir / "bin" / "python")
    venv = BuildStep([sys.executable, "-m", "venv", str(env_dir)], "create the client's virtual environment")
    if lock is not None:
        return [venv, BuildStep(install_argv(python, lock),
                                f"install the {len(lock.pins)} packages of lock {lock.path.name} (hashes checked)")]
    return [venv, BuildStep([*pip_install(python), requirement(spec)],
                            f"install {requirement(spec)} (no lock: resolved today)")]


def read_client_marker(env_dir: Path) -> ClientEnv | None:
    try:
        data = json.loads((env_dir / MARKER).read_text(encoding="utf-8"))
        return ClientEnv(spec=data["spec"], env_dir=Path(data["env_dir"]), python=data["python"],
                         evalscope_version=data["evalscope_version"], created=False,
                         build_s=float(data.get("build_s", 0.0)), lock=data.get("lock"))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _installed_version(python: str) -> str | None:
    code = "import importlib.metadata as m; print(m.version('evalscope'))"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _build_into(spec: str, tmp: Path, final: Path, progress: Progress) -> ClientEnv:
    started = time.monotonic()
    log_path = build_log_path(final)  # beside the folder: a failed build's log outlives its folder
    log_path.write_text("", encoding="utf-8")
    lock = client_lock(spec)
    steps = recipe_steps(spec, tmp, lock)
    for i, step in enumerate(steps, 1):
        _run_step(step, log_path, progress, f"client evalscope {spec} [{i}/{len(steps)}]")
    keep_bytecode(tmp)  # each point's client imports EvalScope again
    if lock is not None:
        try:
            moved = differences(lock, installed_versions(str(tmp / "bin" / "python")))
        except LockError as exc:
            raise BuildError(f"client evalscope {spec}: {exc} (log {log_path})") from None
        if moved:
            raise BuildError(f"client evalscope {spec}: the environment departs from lock {lock.path.name}: "
                             f"{'; '.join(moved[:5])} (log {log_path})")
    version = _installed_version(str(tmp / "bin" / "python"))
    if version is None:
        raise BuildError(f"client evalscope {spec}: the new environment cannot report its evalscope version "
                         f"(log {log_path})")
    kind, pinned, _ = evalscope_spec_parts(spec)
    if kind == "pypi" and version != pinned:
        raise BuildError(f"client evalscope {spec}: pip installed evalscope {version}")
    env = ClientEnv(spec=spec, env_dir=final, python=str(final / "bin" / "python"), evalscope_version=version,
                    created=True, build_s=round(time.monotonic() - started, 1),
                    lock=lock.provenance() if lock else None)
    shutil.move(str(log_path), str(tmp / "build.log"))
    record = {**asdict(env), "env_dir": str(final)}
    (tmp / MARKER).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return env


def ensure_client(spec: str, clients_dir: Path | None = None, progress: Progress = print) -> ClientEnv:
    """The pinned EvalScope's environment: reused when built, else built now (one builder at a time)."""
    root = (clients_dir or DEFAULT_CLIENTS_DIR).expanduser()
    final = client_env_dir(spec, root)

    def build(tmp: Path) -> ClientEnv:
        progress(f"building EvalScope {spec} into {final} (once; reused after)")
        return _build_into(spec, tmp, final, progress)

    env, created = build_once(final, find=lambda: read_client_marker(final), build=build)
    if not created:
        keep_bytecode(final)  # a client built before the harness kept bytecode gets it too
        return env
    progress(f"built EvalScope {env.evalscope_version} in {env.build_s:.0f}s")
    return env
