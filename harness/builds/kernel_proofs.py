"""Proofs about the bundled HiSparse kernel module: that a vLLM environment's
`torch.ops._C_cache_ops.hisparse_*` reach it (run in that environment's interpreter), and that
its CUDA sources compile with nvcc for a GPU architecture (objects only: no GPU needed).
"""

from __future__ import annotations

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


def nvcc_compile_check(cuda_arch: str = "90", torch_include_dirs: list[str] | None = None,
                       source_dir: Path | None = None) -> NvccCheck:
    """Compile the CUDA build's sources (kernels, registration, vLLM drop-in) to objects only:
    no link, no GPU."""
    if torch_include_dirs is None:
        raise KernelBuildError("nvcc_compile_check needs torch's include folders (see torch_include_dirs)")
    src = require_source_dir(source_dir) / "csrc"
    nvcc = find_nvcc()
    includes = [f"-I{d}" for d in torch_include_dirs]
    base = [nvcc, "-c", "-std=c++20", "-O3", f"-gencode=arch=compute_{cuda_arch},code=sm_{cuda_arch}",
            "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC", *includes]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hisparse-nvcc-") as tmp:
        dropin = Path(tmp) / "dropin"
        (dropin / "hisparse_bundled").mkdir(parents=True)
        for header in src.iterdir():
            if header.suffix in (".h", ".cuh"):
                shutil.copy(header, dropin / "hisparse_bundled" / header.name)
        shutil.copy(src / "vllm_dropin" / "hisparse_kernels.cu", dropin / "hisparse_kernels.cu")
        jobs = [
            [*base, "-DHISPARSE_WITH_CUDA", "-DUSE_CUDA", f"-I{src}", str(src / "hisparse_cuda.cu"),
             "-o", f"{tmp}/module.o"],
            [*base, str(dropin / "hisparse_kernels.cu"), "-o", f"{tmp}/dropin.o"],
            # The CUDA build's registration (host code, handed to the host compiler).
            [*base, "-DHISPARSE_WITH_CUDA", "-DUSE_CUDA", f"-I{src}", str(src / "registration.cpp"),
             "-o", f"{tmp}/registration.o"],
        ]
        procs = [subprocess.Popen(job, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for job in jobs]
        logs = [proc.communicate()[0] for proc in procs]
        ok = all(proc.returncode == 0 for proc in procs)
    return NvccCheck(ok, nvcc, round(time.monotonic() - started, 1), [" ".join(job) for job in jobs],
                     "\n".join(logs))
