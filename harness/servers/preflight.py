"""Checks before a server starts: what would make it fail minutes later, said now.

A vLLM with HiSparse or offload pins its host pools at start and refuses pools above
95% of the RAM it can see (docs/facts.md §2); a server needing more GPUs than the host has
waits out its whole ready timeout. Both are known before anything starts.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.calc import pinned_host_gib
from harness.config import LaunchProfile
from harness.io import atomic_write_json, utc_now_iso
from harness.provenance import gpu_info, host_ram_gib

PINNED_RAM_LIMIT = 0.95  # vLLM refuses a pinned pool above this share of available RAM
MIN_FREE_DISK_GIB = 1.0  # logs, EvalScope databases and scrapes of a long sweep


@dataclass
class PreflightReport:
    deployment: str
    checked_at: str = field(default_factory=utc_now_iso)
    host_ram_gib: float | None = None
    pinned_pools_gib: float = 0.0
    gpus_needed: int = 0
    gpus_visible: int | None = None  # None: no nvidia-smi here
    gpu_model: str | None = None
    results_free_gib: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def run_preflight(deployment: str, profile: LaunchProfile, gpus_needed: int, results_dir: Path,
                  out_path: Path, server_on_this_host: bool = True) -> PreflightReport:
    """Check this host for the profile; write preflight.json whatever the outcome.

    RAM and GPUs are checked only when the server will run on this host (a local launcher,
    or a one-node Ray cluster); on a multi-node cluster Ray places it elsewhere.
    """
    report = PreflightReport(deployment=deployment, host_ram_gib=host_ram_gib(), gpus_needed=gpus_needed)
    if profile.engine == "vllm" and server_on_this_host:
        report.pinned_pools_gib = round(pinned_host_gib(profile), 1)
        ram = report.host_ram_gib
        if ram and report.pinned_pools_gib > PINNED_RAM_LIMIT * ram:
            report.problems.append(
                f"the pinned host pools ({report.pinned_pools_gib:g} GiB) exceed {PINNED_RAM_LIMIT:.0%} of this "
                f"host's {ram:g} GiB RAM: vLLM refuses to start; shrink kv.hisparse.host_pool_gib or "
                "kv.offload.cpu_bytes")
        gpus = gpu_info()
        report.gpu_model = gpus.model
        report.gpus_visible = gpus.count if gpus.model else None
        if report.gpus_visible is not None and report.gpus_visible < gpus_needed:
            report.problems.append(f"the server needs {gpus_needed} GPU(s) but this host shows "
                                   f"{report.gpus_visible}")
    try:
        report.results_free_gib = round(shutil.disk_usage(results_dir).free / 2**30, 1)
    except OSError:
        report.results_free_gib = None
    if report.results_free_gib is not None and report.results_free_gib < MIN_FREE_DISK_GIB:
        report.problems.append(f"only {report.results_free_gib:g} GiB free under {results_dir}")
    atomic_write_json(out_path, asdict(report))
    return report
