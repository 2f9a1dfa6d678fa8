"""The bundled HiSparse kernel module (kernels/hisparse): identity, builds, overlays (proofs: kernel_proofs).

The module is built with a given interpreter (an environment that has torch) into an
*overlay* folder: `pip install --target <overlay>`; a server started with
PYTHONPATH=<overlay> finds the vLLM plugin entry point there. Overlays are cached under
~/.cache/hisparse-harness/kernels/<key>, built in a temporary folder and renamed into
place, so a half-built overlay is never used. This module imports no torch: everything
that needs it runs in a subprocess of the target interpreter.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from harness.builds.cached import build_once
from harness.builds.locks import pip_install
from harness.errors import HarnessError
from harness.io import json_digest

Progress = Callable[[str], None]

KERNEL_SOURCE_DIR = Path(__file__).resolve().parents[2] / "kernels" / "hisparse"
DEFAULT_CACHE_ROOT = Path("~/.cache/hisparse-harness")
OVERLAY_RECIPE = 1  # bump when the build steps change
DEV_RECIPE = 2
DEV_PACKAGES = ("torch==2.13.0", "numpy", "pytest", "pytest-timeout", "hypothesis", "ninja", "setuptools")  # = lock
MARKER = "harness-kernel.json"
PROBE_PREFIX = "HISPARSE_PROBE "
IDENTITY_LINE = re.compile(r"hisparse_kernels (\S+) \(sha256 ([0-9a-f]{12})\) registered: (.+)")
HEARTBEAT_S = 30.0
# Build inputs: the same rule setup.py compiles into the library.
HASHED_FILES = ("pyproject.toml", "setup.py")
HASHED_DIRS = ("csrc", "hisparse_kernels")
SKIPPED_SUFFIXES = (".pyc", ".pyo", ".so", ".o")
PLUGIN_NAME = "hisparse_bundled"  # the module's vllm.general_plugins entry point
# Set in servers started with bundled kernels: every vLLM process then logs a dispatch check line.
DISPATCH_CHECK_ENV = "HISPARSE_DISPATCH_CHECK"
DISPATCH_LINE = re.compile(r"hisparse_bundled: dispatch check in pid (\d+): (\d+)/(\d+) ops")
OP_NAMES = ("hisparse_resolve_residency", "hisparse_invalidate_written_slots", "hisparse_gather_plan",
            "hisparse_gather_compact")


class KernelBuildError(HarnessError):
    """A kernel build, probe or compile check that failed; the message names the log."""


class KernelStep(NamedTuple):
    argv: list[str]
    why: str
    env: dict[str, str]


@dataclass(frozen=True)
class KernelIdentity:
    version: str
    source_sha256: str
    built_for: str  # cpu | cuda
    cuda_arch: str | None

    @staticmethod
    def from_dict(raw: dict) -> KernelIdentity:
        return KernelIdentity(raw["version"], raw["source_sha256"], raw["built_for"], raw.get("cuda_arch"))

    def describe(self) -> str:
        arch = f" sm {self.cuda_arch}" if self.cuda_arch else ""
        return f"hisparse_kernels {self.version} (sha256 {self.source_sha256[:12]}, {self.built_for}{arch})"


@dataclass(frozen=True)
class KernelOverlay:
    path: Path  # put on PYTHONPATH
    identity: KernelIdentity
    created: bool  # this call built it
    build_s: float  # time of the build that made it


def require_source_dir(source_dir: Path | None = None) -> Path:
    folder = source_dir or KERNEL_SOURCE_DIR
    if not (folder / "setup.py").is_file():
        raise KernelBuildError(f"kernel sources not found at {folder}: the harness needs its repository "
                               "checkout (kernels/hisparse), which a non-editable install does not carry")
    return folder


def source_hash(source_dir: Path | None = None) -> str:
    """sha256 over the build inputs: relative path and content hash of each, in path order."""
    root = require_source_dir(source_dir)
    files = [root / name for name in HASHED_FILES if (root / name).is_file()]
    for folder in HASHED_DIRS:
        files += [p for p in (root / folder).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(SKIPPED_SUFFIXES)]
    digest = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def planned_identity(built_for: str, cuda_arch: str | None, source_dir: Path | None = None) -> KernelIdentity:
    """What a build from the source tree as it is now would report (nothing is built)."""
    return KernelIdentity(module_version(source_dir), source_hash(source_dir), built_for, cuda_arch)


def module_version(source_dir: Path | None = None) -> str:
    text = (require_source_dir(source_dir) / "hisparse_kernels" / "_version.py").read_text(encoding="utf-8")
    found = re.search(r'__version__ = "([^"]+)"', text)
    if not found:
        raise KernelBuildError("kernels/hisparse/hisparse_kernels/_version.py has no __version__ line")
    return found.group(1)


# ---- build steps ---------------------------------------------------------------------------------

_COPY = ("import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2], dirs_exist_ok=True, ignore="
         "shutil.ignore_patterns('build', '*.egg-info', '__pycache__', '*.so', '*.o', 'tests'))")
_REMOVE = "import shutil, sys; shutil.rmtree(sys.argv[1], ignore_errors=True)"


def kernel_build_steps(python: str, overlay_dir: Path, cuda_arch: str | None,
                       source_dir: Path | None = None) -> list[KernelStep]:
    """Commands that build the module with `python` into `overlay_dir` (CUDA when cuda_arch is set)."""
    src = require_source_dir(source_dir)
    staged = overlay_dir / ".hisparse-src"
    env = {"HISPARSE_BUILD_CUDA": "1" if cuda_arch else "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if cuda_arch:
        env["TORCH_CUDA_ARCH_LIST"] = cuda_arch
    what = f"CUDA for sm {cuda_arch}" if cuda_arch else "CPU only"
    return [
        KernelStep([python, "-c", _COPY, str(src), str(staged)],
                   "copy the kernel sources, so concurrent builds never share a build folder", {}),
        KernelStep([*pip_install(python), "--no-build-isolation", "--no-deps", "--target", str(overlay_dir),
                    str(staged)],
                   f"build hisparse_kernels ({what}) against this environment's torch", env),
        KernelStep([python, "-c", _REMOVE, str(staged)], "drop the staged sources and objects", {}),
    ]


def dropin_steps(vllm_src: Path, source_dir: Path | None = None) -> list[KernelStep]:
    """Commands that put the bundled kernels in a vLLM source tree before it is compiled."""
    src = require_source_dir(source_dir) / "csrc"
    found = sorted(p for p in (vllm_src / "csrc").rglob("hisparse_kernels.cu")) if (vllm_src / "csrc").is_dir() else []
    if len(found) != 1:
        raise KernelBuildError(f"{vllm_src}: expected one csrc/**/hisparse_kernels.cu to replace, found "
                               f"{len(found)}; this vLLM has no (or an unknown) HiSparse kernel file")
    target = found[0]
    headers = sorted(str(p) for p in src.iterdir() if p.suffix in (".h", ".cuh"))
    return [
        KernelStep(["mkdir", "-p", str(target.parent / "hisparse_bundled")],
                   "make room for the bundled kernel headers beside vLLM's file", {}),
        KernelStep(["cp", "-f", *headers, str(target.parent / "hisparse_bundled")],
                   "copy the bundled kernels' headers", {}),
        KernelStep(["cp", "-f", str(src / "vllm_dropin" / "hisparse_kernels.cu"), str(target)],
                   f"replace vLLM's {target.relative_to(vllm_src)} with the bundled drop-in", {}),
    ]


# Runs in the new environment after the clone, so the file is searched for when it exists.
_DROPIN = ("import pathlib, shutil, sys; k, v = map(pathlib.Path, sys.argv[1:3]); "
           "f = sorted((v / 'csrc').rglob('hisparse_kernels.cu')); "
           "len(f) == 1 or sys.exit(f'{v}: expected one csrc/**/hisparse_kernels.cu to replace, found {len(f)}'); "
           "d = f[0].parent / 'hisparse_bundled'; d.mkdir(exist_ok=True); "
           "[shutil.copy(h, d) for h in sorted(k.iterdir()) if h.suffix in ('.h', '.cuh')]; "
           "shutil.copy(k / 'vllm_dropin' / 'hisparse_kernels.cu', f[0]); print('replaced', f[0])")


def dropin_recipe_step(python: str, vllm_src: Path, source_dir: Path | None = None) -> KernelStep:
    """dropin_steps as one command for a build recipe: the tree is searched when the step runs
    (after the clone), not when the recipe is written."""
    src = require_source_dir(source_dir) / "csrc"
    return KernelStep([python, "-c", _DROPIN, str(src), str(vllm_src)],
                      "replace vLLM's csrc/**/hisparse_kernels.cu with the bundled drop-in (and its headers)", {})


def bundled_server_env(overlay: Path, profile_env: Mapping[str, str],
                       inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a server's environment needs to load the module from `overlay`: the overlay first on
    PYTHONPATH (keeping the profile's, else the inherited, PYTHONPATH), the plugin added to a
    VLLM_PLUGINS allow-list where one is set, and the per-process dispatch check switched on."""
    inherited = os.environ if inherited is None else inherited
    rest = profile_env.get("PYTHONPATH", inherited.get("PYTHONPATH"))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(overlay), rest])), DISPATCH_CHECK_ENV: "1"}
    allow = profile_env.get("VLLM_PLUGINS", inherited.get("VLLM_PLUGINS"))
    if allow is not None and PLUGIN_NAME not in allow.split(","):
        env["VLLM_PLUGINS"] = ",".join(filter(None, [*allow.split(","), PLUGIN_NAME]))
    return env


def overlay_preview_steps(python: str, cuda_arch: str | None, cache_root: Path | None = None,
                          source_dir: Path | None = None) -> list[KernelStep]:
    """The overlay build and its dispatch proof for an environment that does not exist yet (the
    overlay's folder name depends on the torch that environment will hold)."""
    overlay = (cache_root or DEFAULT_CACHE_ROOT) / "kernels" / "<key: sources, torch, python, arch>"
    return [*kernel_build_steps(python, overlay, cuda_arch, source_dir),
            KernelStep([python, "-m", "hisparse_kernels.probe"],
                       "prove that torch.ops._C_cache_ops.hisparse_* reach the bundled kernels",
                       {"PYTHONPATH": str(overlay), DISPATCH_CHECK_ENV: "1"})]


# ---- running steps --------------------------------------------------------------------------------

def run_step(step: KernelStep, log_path: Path, progress: Progress | None, label: str) -> None:
    if progress:
        progress(f"{label}: {step.why}")
    started = time.monotonic()
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"\n$ {' '.join(step.argv)}\n")
        log.flush()
        try:
            proc = subprocess.Popen(step.argv, env={**os.environ, **step.env}, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT)
        except OSError as exc:
            raise KernelBuildError(f"{label}: cannot run {step.argv[0]}: {exc}") from None
        next_beat = started + HEARTBEAT_S
        while proc.poll() is None:
            time.sleep(0.2)
            if progress and time.monotonic() >= next_beat:
                next_beat += HEARTBEAT_S
                progress(f"{label}: still building ({time.monotonic() - started:.0f}s)")
    if proc.returncode != 0:
        tail = " | ".join(log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:])
        raise KernelBuildError(f"{label}: {step.why} failed (exit {proc.returncode}; log {log_path}): {tail[-300:]}")


def python_facts(python: str, code: str) -> str:
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelBuildError(f"cannot run {python}: {exc}") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise KernelBuildError(f"{python} failed: {last}")
    return out.stdout.strip()


def torch_version_of(python: str) -> str:
    """The torch version installed for `python`, read without importing torch."""
    return python_facts(python, "import importlib.metadata as m; print(m.version('torch'))")


def _read_identity(python: str, overlay: Path) -> KernelIdentity:
    code = "import json, hisparse_kernels as hk; print(json.dumps(hk.identity().__dict__))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(overlay)})
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise KernelBuildError(f"the kernel overlay {overlay} does not load in {python}: {last}")
    return KernelIdentity.from_dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _overlay_key(source_sha256: str, torch_version: str, python_version: str, cuda_arch: str | None) -> str:
    material = {"recipe": OVERLAY_RECIPE, "source": source_sha256, "torch": torch_version,
                "python": python_version, "cuda_arch": cuda_arch}
    return json_digest(material)


def ensure_kernel_overlay(python: str, torch_version: str, cuda_arch: str | None,
                          cache_root: Path | None = None, progress: Progress | None = None,
                          source_dir: Path | None = None) -> KernelOverlay:
    """The overlay for this interpreter, torch and arch, built once and reused."""
    src = require_source_dir(source_dir)
    sha = source_hash(src)
    py_version = python_facts(python, "import sys; print('%d.%d' % sys.version_info[:2])")
    key = _overlay_key(sha, torch_version, py_version, cuda_arch)
    root = (cache_root or DEFAULT_CACHE_ROOT).expanduser() / "kernels"
    final = root / key

    def find() -> KernelOverlay | None:
        if not (final / MARKER).is_file():
            return None
        marker = json.loads((final / MARKER).read_text(encoding="utf-8"))
        return KernelOverlay(final, KernelIdentity.from_dict(marker["identity"]), False, marker["build_s"])

    def build(tmp: Path) -> KernelOverlay:
        log_path = root / f"{key}.build.log"
        log_path.write_text(f"# kernels for {python} (torch {torch_version}, arch {cuda_arch})\n", encoding="utf-8")
        started = time.monotonic()
        for step in kernel_build_steps(python, tmp, cuda_arch, src):
            run_step(step, log_path, progress, f"kernels {key}")
        identity = _read_identity(python, tmp)
        if identity.source_sha256 != sha or identity.built_for != ("cuda" if cuda_arch else "cpu"):
            raise KernelBuildError(f"the built kernels report {identity}, expected sha256 {sha[:12]} "
                                   f"for {'cuda' if cuda_arch else 'cpu'} (log {log_path})")
        build_s = round(time.monotonic() - started, 1)
        (tmp / MARKER).write_text(json.dumps({"identity": identity.__dict__, "build_s": build_s, "python": python,
                                              "torch": torch_version}, indent=2), encoding="utf-8")
        shutil.move(str(log_path), tmp / "build.log")
        return KernelOverlay(final, identity, True, build_s)

    overlay, _ = build_once(final, find=find, build=build)
    return overlay
