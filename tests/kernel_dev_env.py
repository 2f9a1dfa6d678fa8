"""The kernel module's CPU development environment: a cached venv with CPU torch, numpy, pytest and
hypothesis (from the kernel-dev lock) and the module built for CPU on its path. Only the tests use it;
servers get their kernels through harness/builds/kernels.py's overlay."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from harness.builds.cached import build_log_path, build_once
from harness.builds.kernels import (
    DEFAULT_CACHE_ROOT,
    DEV_PACKAGES,
    DEV_RECIPE,
    MARKER,
    KernelBuildError,
    KernelStep,
    Progress,
    ensure_kernel_overlay,
    run_step,
    torch_version_of,
)
from harness.builds.locks import find_lock, install_argv, keep_bytecode, pip_install, set_pth
from harness.io import json_digest


def ensure_kernel_dev_env(cache_root: Path | None = None, progress: Progress | None = None,
                          source_dir: Path | None = None) -> Path:
    """Python of a cached venv with CPU torch, numpy, pytest, hypothesis and the module (CPU), installed
    from the kernel-dev lock where this Python and platform have one."""
    root = (cache_root or DEFAULT_CACHE_ROOT).expanduser() / "kernel-dev"
    lock = find_lock("kernel-dev")
    material = {"recipe": DEV_RECIPE, "packages": DEV_PACKAGES, "python": "{}.{}".format(*sys.version_info[:2]),
                "lock": lock.sha256 if lock else None}
    final = root / json_digest(material)

    def find() -> Path | None:
        return final if (final / MARKER).is_file() else None  # the marker is written last

    def build(tmp: Path) -> Path:
        log_path = build_log_path(final)
        log_path.write_text("", encoding="utf-8")
        python = str(tmp / "bin" / "python")
        install = (KernelStep(install_argv(python, lock), f"install lock {lock.path.name} (hashes checked)", {})
                   if lock else KernelStep([*pip_install(python), *DEV_PACKAGES],
                                           "install CPU torch and the test tools (no lock: resolved today)", {}))
        for step in [KernelStep([sys.executable, "-m", "venv", str(tmp)], "create the venv", {}), install]:
            run_step(step, log_path, progress, "kernel dev env")
        keep_bytecode(tmp)  # the kernel tests import torch in a dozen processes
        torch_version = torch_version_of(python)
        if "+cpu" not in torch_version:
            raise KernelBuildError(f"the kernel dev env got torch {torch_version}, not a CPU build (log "
                                   f"{log_path}); a CPU wheel of torch 2.13.0 must be installable here")
        shutil.move(str(log_path), tmp / "build.log")
        (tmp / MARKER).write_text(json.dumps({"torch": torch_version, "lock": lock.provenance() if lock else None}),
                                  encoding="utf-8")
        return final

    env_dir, _ = build_once(final, find=find, build=build)
    python = env_dir / "bin" / "python"
    torch_version = json.loads((env_dir / MARKER).read_text(encoding="utf-8"))["torch"]
    overlay = ensure_kernel_overlay(str(python), torch_version, None, cache_root, progress, source_dir)
    set_pth(env_dir, "hisparse_kernels_overlay.pth", f"{overlay.path}\n")  # the overlay on the venv's path
    return python
