"""What a run ran on and with: recorded once per run, so a number can be traced to its setup."""

from __future__ import annotations

import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import requests

from harness import __version__
from harness.config import LoadedSweep, display_path, sha256_file

REPO_ROOT = Path(__file__).resolve().parents[1]


def utc_now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _run(argv: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def harness_commit() -> str | None:
    commit = _run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT)
    if commit and _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT):
        commit += "-dirty"
    return commit


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class GpuInfo:
    model: str | None = None
    count: int = 0
    driver: str | None = None


def gpu_info() -> GpuInfo:
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if not out:
        return GpuInfo()
    rows = [r.split(",") for r in out.splitlines() if r.strip()]
    return GpuInfo(model=rows[0][0].strip(), count=len(rows), driver=rows[0][1].strip() if len(rows[0]) > 1
                   else None)


def host_ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


@dataclass
class Provenance:
    harness_version: str = __version__
    harness_commit: str | None = None
    python: str = field(default_factory=lambda: sys.version.split()[0])
    hostname: str = field(default_factory=platform.node)
    os: str = field(default_factory=platform.platform)
    evalscope_version: str | None = None
    ray_version: str | None = None
    config_files: dict[str, str] = field(default_factory=dict)  # path -> sha256
    dataset_path: str | None = None
    dataset_sha256: str | None = None
    gpu: dict = field(default_factory=dict)
    host_ram_gib: float | None = None


def collect(loaded: LoadedSweep, dataset_path: Path, dataset_sha256: str) -> Provenance:
    return Provenance(
        harness_commit=harness_commit(),
        evalscope_version=package_version("evalscope"),
        ray_version=package_version("ray"),
        config_files={display_path(p): sha256_file(p) for p in loaded.files},
        dataset_path=display_path(dataset_path),
        dataset_sha256=dataset_sha256,
        gpu=asdict(gpu_info()),
        host_ram_gib=host_ram_gib(),
    )


def server_version(base_url: str, timeout_s: float = 5.0) -> dict[str, str]:
    """What the running server says it is: vLLM's /version, the simulator's too."""
    try:
        resp = requests.get(base_url.rstrip("/") + "/version", timeout=timeout_s)
        if resp.ok:
            data = resp.json()
            return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (requests.RequestException, ValueError):
        pass
    return {}
