"""Preflight of the GPU check: what this machine has, read without installing or fetching anything.

    python benchmarks/gpu_check_env.py --out OUT/env.json

Run with the interpreter the check builds against. Writes one JSON object (also printed): the
GPU and driver, torch and its CUDA, nvcc, compute-sanitizer, whether setuptools and vLLM are
importable (vLLM is detected, never installed), host memory, and `fatal`: the reasons the check
cannot go on (no GPU visible to torch, a CPU-only torch, no nvcc). Exit 0 unless `fatal`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"
    return (done.stdout + done.stderr).strip()


def cuda_tool(name: str) -> str | None:
    """A CUDA toolkit binary: $CUDA_HOME/bin, then /usr/local/cuda/bin, then PATH."""
    for folder in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if folder and os.access(Path(folder) / "bin" / name, os.X_OK):
            return str(Path(folder) / "bin" / name)
    return shutil.which(name)


def meminfo() -> dict[str, float]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, value = line.split(":", 1)
            if key in ("MemTotal", "MemAvailable"):
                out[key] = round(int(value.split()[0]) / 2**20, 1)  # GiB
    except OSError:
        pass
    return out


def dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def facts() -> dict:
    out: dict = {"python": sys.executable, "python_version": sys.version.split()[0], "fatal": []}
    smi = shutil.which("nvidia-smi")
    out["nvidia_smi"] = _run([smi, "-L"]) if smi else None
    try:
        import torch

        out["torch"] = torch.__version__
        out["torch_cuda"] = torch.version.cuda
        out["cuda_available"] = torch.cuda.is_available()
        if out["cuda_available"]:
            major, minor = torch.cuda.get_device_capability()
            props = torch.cuda.get_device_properties(0)
            out.update(gpu=torch.cuda.get_device_name(), capability=f"{major}.{minor}",
                       gpu_memory_gib=round(props.total_memory / 2**30, 1), gpus=torch.cuda.device_count())
    except Exception as exc:  # no torch, or a broken one
        out["torch"] = None
        out["fatal"].append(f"torch does not import: {type(exc).__name__}: {exc}")
    if out.get("torch") and not out.get("torch_cuda"):
        out["fatal"].append(f"torch {out['torch']} is a CPU-only build")
    elif out.get("torch") and not out.get("cuda_available"):
        out["fatal"].append("torch sees no CUDA GPU")
    nvcc = cuda_tool("nvcc")
    out["nvcc"] = nvcc
    out["nvcc_version"] = _run([nvcc, "--version"]).splitlines()[-1] if nvcc else None
    if not nvcc:
        out["fatal"].append("no nvcc ($CUDA_HOME/bin, /usr/local/cuda/bin, PATH)")
    out["compute_sanitizer"] = cuda_tool("compute-sanitizer")
    out["cxx"] = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not out["cxx"]:
        out["fatal"].append("no C++ compiler (g++, c++ or $CXX)")
    out["setuptools"] = dist_version("setuptools")  # not needed: the build uses none
    out["vllm"] = dist_version("vllm") if importlib.util.find_spec("vllm") is not None else None
    out["cpu_count"] = os.cpu_count()
    out.update({f"host_{k.lower()}_gib": v for k, v in meminfo().items()})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    found = facts()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=2), encoding="utf-8")
    print(json.dumps(found, indent=2))
    for reason in found["fatal"]:
        print(f"preflight: FATAL: {reason}", file=sys.stderr)
    return 1 if found["fatal"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
