"""Proofs about the bundled HiSparse kernel module: that a vLLM environment's
`torch.ops._C_cache_ops.hisparse_*` reach it (run in that environment's interpreter), and that
its CUDA sources compile with nvcc for a GPU architecture (objects only: no GPU needed), the vLLM
drop-in against vLLM's declared signatures.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.builds.kernels import (
    IDENTITY_LINE,
    OP_NAMES,
    PROBE_PREFIX,
    KernelBuildError,
    KernelIdentity,
    python_facts,
    require_source_dir,
)


@dataclass(frozen=True)
class DispatchProof:
    vllm_version: str | None
    identity: KernelIdentity | None  # what the process loaded
    reached: dict[str, bool]  # op -> its _C_cache_ops call ran bundled code
    log_line: str | None  # the module's identity line, as logged
    error: str | None = None
    op_errors: dict[str, str] = field(default_factory=dict)
    reached_cuda: dict[str, bool] = field(default_factory=dict)  # CUDA builds on a GPU only

    @property
    def ok(self) -> bool:
        return (self.error is None and self.identity is not None and self.log_line is not None
                and set(self.reached) == set(OP_NAMES) and all(self.reached.values()))

    def why_not(self) -> str:
        if self.ok:
            return "all four ops reached the bundled kernels"
        if self.error:
            return self.error
        missed = [f"{op} ({self.op_errors.get(op) or 'not counted'})" for op, hit in self.reached.items() if not hit]
        if missed:
            return "calls through _C_cache_ops did not reach the bundled kernels: " + "; ".join(missed)
        return "no identity line was logged" if self.log_line is None else "no identity reported"


@dataclass(frozen=True)
class NvccCheck:
    ok: bool
    nvcc: str
    seconds: float
    commands: list[str]
    log: str
    job_seconds: dict[str, float] = field(default_factory=dict)  # job -> wall seconds


def probe_dispatch(python: str, overlay: Path, env: dict[str, str] | None = None,
                   timeout_s: float = 300.0) -> DispatchProof:
    """In `python` with the overlay: import vLLM, load its plugins, call the four ops via _C_cache_ops."""
    path = os.pathsep.join(filter(None, [str(overlay), (env or {}).get("PYTHONPATH")]))
    run_env = {**os.environ, **(env or {}), "PYTHONPATH": path}
    try:
        out = subprocess.run([python, "-m", "hisparse_kernels.probe"], capture_output=True, text=True,
                             env=run_env, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return DispatchProof(None, None, {}, None, error=f"probe did not run: {exc}")
    text = out.stdout + "\n" + out.stderr
    log_line = next((m.group(0) for m in map(IDENTITY_LINE.search, text.splitlines()) if m), None)
    payload = next((line[len(PROBE_PREFIX):] for line in out.stdout.splitlines() if line.startswith(PROBE_PREFIX)),
                   None)
    if payload is None:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return DispatchProof(None, None, {}, log_line, error=f"probe exited {out.returncode}: {last}")
    raw = json.loads(payload)
    ops = raw.get("ops", {})
    return DispatchProof(raw.get("vllm_version"),
                         KernelIdentity.from_dict(raw["identity"]) if raw.get("identity") else None,
                         {name: bool(info["reached"]) for name, info in ops.items()}, log_line, raw.get("error"),
                         {name: info["error"] for name, info in ops.items() if info.get("error")},
                         {name: bool(info["reached"]) for name, info in raw.get("ops_cuda", {}).items()})


def find_nvcc() -> str:
    for candidate in ("/usr/local/cuda/bin/nvcc", shutil.which("nvcc")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise KernelBuildError("no nvcc found (looked in /usr/local/cuda/bin and PATH): install the CUDA toolkit, "
                           "or the PyPI wheels nvidia-cuda-nvcc (CUDA 13) / nvidia-cuda-nvcc-cu12, which ship one")


def torch_include_dirs(python: str) -> list[str]:
    code = "import json; from torch.utils.cpp_extension import include_paths; print(json.dumps(include_paths()))"
    return json.loads(python_facts(python, code).splitlines()[-1])


def build_flags(source_dir: Path | None = None):
    """The module's own compiler flags (hisparse_kernels/build.py, loaded by path: no torch import)."""
    path = require_source_dir(source_dir) / "hisparse_kernels" / "build.py"
    spec = importlib.util.spec_from_file_location("hisparse_kernels_build_flags", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NVCC_JOBS = ("module", "dropin", "registration")
# vLLM 0.32/0.33's declarations of the four functions, shipped with the drop-in; the check puts it
# beside the drop-in as the `ops.h` a vLLM tree has there.
VLLM_DECLARATIONS = "vllm_dropin/vllm_hisparse_ops.h"


def nvcc_compile_check(cuda_arch: str = "90", torch_include_dirs: list[str] | None = None,
                       source_dir: Path | None = None, only: tuple[str, ...] = NVCC_JOBS) -> NvccCheck:
    """Compile the CUDA build's sources to objects only (no link, no GPU), with the module's own
    flags: `module` (kernels and the four entry points), `registration` (the CUDA build's
    registration, host code), `dropin` (vLLM's hisparse_kernels.cu replacement, compiled against
    vLLM's declared signatures: a signature that differs fails here)."""
    if torch_include_dirs is None:
        raise KernelBuildError("nvcc_compile_check needs torch's include folders (see torch_include_dirs)")
    src = require_source_dir(source_dir) / "csrc"
    flags = build_flags(source_dir)
    nvcc = find_nvcc()
    includes = [f"-I{d}" for d in torch_include_dirs]
    arch = cuda_arch.replace(".", "")
    base = [nvcc, "-c", *flags.NVCC_FLAGS, f"-gencode=arch=compute_{arch},code=sm_{arch}", *includes]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hisparse-nvcc-") as tmp:
        dropin = Path(tmp) / "dropin"
        (dropin / "hisparse_bundled").mkdir(parents=True)
        for header in src.iterdir():
            if header.suffix in (".h", ".cuh"):
                shutil.copy(header, dropin / "hisparse_bundled" / header.name)
        shutil.copy(src / "vllm_dropin" / "hisparse_kernels.cu", dropin / "hisparse_kernels.cu")
        shutil.copy(src / VLLM_DECLARATIONS, dropin / "ops.h")
        jobs = {
            "module": [*base, *flags.CUDA_DEFINES, f"-I{src}", str(src / "hisparse_cuda.cu"), "-o", f"{tmp}/module.o"],
            "dropin": [*base, str(dropin / "hisparse_kernels.cu"), "-o", f"{tmp}/dropin.o"],
            # The CUDA build's registration (host code, handed to the host compiler).
            "registration": [*base, *flags.CUDA_DEFINES, f"-I{src}", str(src / "registration.cpp"),
                             "-o", f"{tmp}/registration.o"],
        }
        chosen = {name: argv for name, argv in jobs.items() if name in only}
        procs = {name: (subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
                        time.monotonic()) for name, argv in chosen.items()}
        logs, seconds = [], {}
        for name, (proc, began) in procs.items():
            logs.append(f"== {name}\n{proc.communicate()[0]}")
            seconds[name] = round(time.monotonic() - began, 1)
        ok = all(proc.returncode == 0 for proc, _ in procs.values())
    return NvccCheck(ok, nvcc, round(time.monotonic() - started, 1), [" ".join(argv) for argv in chosen.values()],
                     "\n".join(logs), seconds)
