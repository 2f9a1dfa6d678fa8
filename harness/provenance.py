"""What a run ran on and with: recorded once per run, so a number can be traced to its setup."""

from __future__ import annotations

import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import requests

from harness import __version__
from harness.config import LoadedSweep
from harness.io import display_path, package_version, sha256_file
from harness.records import GpuRecord, HubInputRecord, ProvenanceRecord

# The checkout the package runs from, when it runs from one (an installed wheel has no commit).
SOURCE_ROOT = Path(__file__).resolve().parents[1]


def _run(argv: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def harness_commit() -> str | None:
    if not (SOURCE_ROOT / "pyproject.toml").is_file() or not (SOURCE_ROOT / ".git").exists():
        return None
    commit = _run(["git", "rev-parse", "HEAD"], cwd=SOURCE_ROOT)
    if commit and _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=SOURCE_ROOT):
        commit += "-dirty"
    return commit


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


def collect(loaded: LoadedSweep, dataset_path: Path | None, dataset_sha256: str | None, *,
            evalscope_version: str | None = None, client_source: str | None = None,
            client_lock_sha256: str | None = None,
            simulated: str | None = None, hub_inputs: dict[str, HubInputRecord] | None = None) -> ProvenanceRecord:
    gpu = gpu_info()
    return ProvenanceRecord(
        harness_version=__version__, harness_commit=harness_commit(), python=sys.version.split()[0],
        hostname=platform.node(), os=platform.platform(),
        evalscope_version=evalscope_version, client_source=client_source, client_lock_sha256=client_lock_sha256,
        ray_version=package_version("ray"),
        config_files={display_path(p): sha256_file(p) for p in loaded.files},
        dataset_path=display_path(dataset_path) if dataset_path else None, dataset_sha256=dataset_sha256,
        hub_inputs=dict(hub_inputs or {}),
        gpu=GpuRecord(model=gpu.model, count=gpu.count, driver=gpu.driver), host_ram_gib=host_ram_gib(),
        simulated=simulated)


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
