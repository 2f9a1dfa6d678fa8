"""A run folder -> a night record: summary.csv for the rows, manifest.json for the rest.

All manifest reading is in `_manifest_facts`, on the typed manifest (harness/records.py), so a change of
the manifest's shape is a few lines here. Every field may be absent (an old run, a simulated one, a run
that stopped early): absent reads as None, never as an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config.nightly import NightlySettings
from harness.errors import HarnessError
from harness.io import json_digest
from harness.nightly.night_record import (
    DeploymentFacts,
    GpuFacts,
    NightProvenance,
    NightRecord,
    NightRow,
    validation_message,
)
from harness.records import RunManifest, answer_scores
from harness.results import read_manifest
from harness.summary import load_runs


@dataclass(frozen=True)
class _ManifestFacts:
    night_id: str
    started_at: str | None
    sweep_name: str
    sweep_sha256: str | None
    simulated: bool
    virtual_time: bool
    gpu: GpuFacts
    gpus_per_server: int | None
    workload: dict[str, Any]
    settings: NightlySettings | None
    provenance: NightProvenance
    deployments: dict[str, DeploymentFacts]


def _manifest_facts(m: RunManifest) -> _ManifestFacts:
    """What a night keeps of the run's manifest (typed; every field may be absent in an old run)."""
    prov, resolved = m.provenance, m.resolved
    deployments = {}
    answers = answer_scores(m.deployments)
    for name, dep in m.deployments.items():
        build, evidence = dep.build, dep.evidence
        requested = evidence.hisparse_requested if evidence is not None else resolved.hisparse_requested(name)
        launch = resolved.launches.get(name)
        deployments[name] = DeploymentFacts(
            vllm_version=(build.vllm_version if build else None) or dep.server_version.get("version"),
            vllm_commit=build.vllm_commit if build else None,
            kernel_hash=build.kernel.source_sha256 if build and build.kernel else None,
            lock_sha256=build.lock.sha256 if build and build.lock else None,
            launch_sha256=json_digest(launch) if launch else None,
            hisparse_requested=requested,
            hisparse_active=evidence.hisparse_active if evidence is not None else None,
            answers=answers.get(name))
    simulated = bool(m.simulated)
    if simulated:  # the simulated hardware is the one the profiles declare; the host's GPUs ran nothing
        gpu_facts = GpuFacts(model=m.gpu_model)
    else:  # what nvidia-smi saw first: a runner with other GPUs than the profiles declare is another machine
        gpu_facts = GpuFacts(model=prov.gpu.model or m.gpu_model, count=prov.gpu.count or None,
                             driver=prov.gpu.driver)
    return _ManifestFacts(
        night_id=m.run_id, started_at=m.started_at, sweep_name=m.sweep_name,
        sweep_sha256=prov.config_files.get(m.sweep_path),
        simulated=simulated, virtual_time=simulated and bool(prov.simulated), gpu=gpu_facts,
        gpus_per_server=m.gpus_per_server, workload=m.workload.identity(), settings=resolved.nightly(),
        provenance=NightProvenance(harness_commit=prov.harness_commit, evalscope_version=prov.evalscope_version,
                                   client_lock_sha256=prov.client_lock_sha256),
        deployments=deployments)


def _clean(value: Any) -> Any:
    """pandas' missing values (NaN, NA) as None; numpy scalars as Python ones."""
    if value is None:
        return None
    try:
        import pandas as pd

        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    if hasattr(value, "item"):
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value


# metric families that only a server with HiSparse on exposes
_HISPARSE_EVIDENCE = ("hisparse_hit_rate", "hisparse_h2d_bytes_per_s")


def _with_metric_evidence(facts: DeploymentFacts, rows: list[Any]) -> DeploymentFacts:
    """HiSparse seen in the scraped metrics counts as active when the manifest holds no evidence.

    Not seeing the metrics proves nothing (their names drift between vLLM commits), so that stays None.
    """
    if facts.hisparse_active is not None:
        return facts
    seen = any(getattr(r, name) is not None for r in rows for name in _HISPARSE_EVIDENCE)
    return facts.model_copy(update={"hisparse_active": True}) if seen else facts


def night_from_run(run_dir: Path, report_path: str | None = None, figure_paths: tuple[str, ...] = (),
                   infrastructure_failure: str | None = None) -> NightRecord:
    """The night record of one run folder (a finished or stopped nightly sweep); `infrastructure_failure`
    says why it could not measure what it should, when that is known."""

    run_dir = Path(run_dir)
    facts = _manifest_facts(read_manifest(run_dir))
    frame = load_runs([run_dir])
    try:
        rows = [NightRow(**{k: _clean(v) for k, v in rec.items()}) for rec in frame.to_dict("records")]
    except ValueError as exc:
        raise HarnessError(f"{run_dir}/summary.csv: a row does not fit the columns: "
                           f"{validation_message(exc)}") from None
    deployments = dict(facts.deployments)
    for name in {str(r.deployment) for r in rows} - set(deployments):
        deployments[name] = DeploymentFacts()
    deployments = {name: _with_metric_evidence(f, [r for r in rows if r.deployment == name])
                   for name, f in sorted(deployments.items())}
    try:
        return NightRecord(
            night_id=facts.night_id, started_at=facts.started_at, sweep_name=facts.sweep_name,
            sweep_sha256=facts.sweep_sha256, simulated=facts.simulated, virtual_time=facts.virtual_time,
            gpu=facts.gpu, gpus_per_server=facts.gpus_per_server, workload=facts.workload,
            settings=facts.settings, provenance=facts.provenance,
            deployments=deployments, rows=rows, report_path=report_path, figure_paths=list(figure_paths),
            infrastructure_failure=infrastructure_failure)
    except ValueError as exc:
        raise HarnessError(f"{run_dir}: cannot make a night record: {validation_message(exc)}") from None
