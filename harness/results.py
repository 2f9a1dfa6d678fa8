"""The run folder: where every file of a run lives, and the one recorder that writes it.

results/<run-id>/manifest.json
results/<run-id>/deployments/<dep>/{command.txt, server.log, preflight.json}
results/<run-id>/points/<dep>/c<concurrency>/{evalscope/attempt-<n>/, scrapes.jsonl, point.json}
(p<concurrency>/ in run folders written before schema 3: still read and resumed)
results/<run-id>/summary.csv
results/<run-id>/report.md
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.io import atomic_write_json, atomic_write_text, display_path, utc_now_iso
from harness.records import (
    SCHEMA_VERSION,
    CorrectnessRecord,
    DeploymentRecord,
    PointRecord,
    ProvenanceRecord,
    RunManifest,
    RunStatus,
    StopRecord,
    WorkloadRecord,
    point_id,
    run_status,
)
from harness.redact import redact_argv, redact_config, redact_text

# Point statuses a resumed run skips: the point ran to its end (degraded: some requests failed).
OK_STATUSES = ("ok", "degraded", "does_not_fit")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def new_run_id(sweep_name: str, *, simulated: bool = False) -> str:
    """The one way a run id is made when none is given: the sweep's name, `-sim` for virtual time, and the
    UTC start time (so ids sort by time)."""
    return f"{sweep_name}{'-sim' if simulated else ''}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"


def run_dir_for(results_root: Path, run_id: str) -> Path:
    """results_root/run_id, for a run id that names one folder inside it: letters, digits, '.', '_'
    and '-', not starting with a dot; no path separators, no '..' (nothing is written outside the
    results root)."""
    if not _RUN_ID.match(run_id) or ".." in run_id:
        raise HarnessError(f"--run-id {run_id!r}: a run id is one folder name under the results folder "
                           "(letters, digits, '.', '_', '-'; no '/', no '..', not starting with '.')")
    return Path(results_root) / run_id


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def summary_csv(self) -> Path:
        return self.root / "summary.csv"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    def deployment_dir(self, deployment: str) -> Path:
        return self.root / "deployments" / deployment

    def server_log(self, deployment: str) -> Path:
        return self.deployment_dir(deployment) / "server.log"

    def command_txt(self, deployment: str) -> Path:
        return self.deployment_dir(deployment) / "command.txt"

    def preflight_json(self, deployment: str) -> Path:
        return self.deployment_dir(deployment) / "preflight.json"

    def point_dir(self, deployment: str, concurrency: int) -> Path:
        """points/<dep>/c<N>/; a run folder an older release wrote keeps its points/<dep>/p<N>/, and a
        resumed run goes on writing there."""
        current = self.root / "points" / deployment / point_id(concurrency)
        if not current.exists():
            old = self.root / "points" / deployment / f"p{concurrency}"
            if old.is_dir():
                return old
        return current

    def point_json(self, deployment: str, concurrency: int) -> Path:
        return self.point_dir(deployment, concurrency) / "point.json"

    def scrapes_jsonl(self, deployment: str, concurrency: int) -> Path:
        return self.point_dir(deployment, concurrency) / "scrapes.jsonl"

    def evalscope_dir(self, deployment: str, concurrency: int, attempt: int) -> Path:
        return self.point_dir(deployment, concurrency) / "evalscope" / f"attempt-{attempt}"


def read_manifest(run_dir: Path) -> RunManifest:
    path = RunPaths(Path(run_dir)).manifest
    try:
        return RunManifest.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise HarnessError(f"{run_dir}: not a run folder (no manifest.json)") from None
    except ValueError as exc:
        raise HarnessError(f"{path}: unreadable manifest: {str(exc).splitlines()[0]}") from None


def read_point(path: Path) -> PointRecord | None:
    """A point.json, or None when absent or unreadable (then the point simply runs again)."""
    try:
        return PointRecord.model_validate_json(Path(path).read_bytes())
    except (FileNotFoundError, ValueError):
        return None


def iter_points(run_dir: Path) -> list[PointRecord]:
    """Every readable point.json of a run, by deployment then concurrency."""
    records = [r for p in sorted((Path(run_dir) / "points").glob("*/[cp][0-9]*/point.json"))
               if (r := read_point(p)) is not None]
    return sorted(records, key=lambda r: (r.deployment, r.concurrency))


# ---- the run recorder ------------------------------------------------------------------------------

class RunRecorder:
    """The one owner of a run folder: opens or resumes it, records provenance once, each deployment
    and point as typed records, and the final status by one rule. Every record passes through
    redaction here, so no caller can forget it. Safe to use from several deployment threads."""

    def __init__(self, paths: RunPaths, manifest: RunManifest):
        self.paths = paths
        self._manifest = manifest
        self._lock = threading.RLock()

    # ---- opening

    @classmethod
    def open(cls, root: Path, *, sweep_name: str, sweep_path: str, simulated: bool, gpus_per_server: int,
             gpu_model: str | None, workload: WorkloadRecord, resolved_config: dict[str, Any],
             deployments: dict[str, DeploymentRecord], points: dict[str, list[str]],
             started_at: str | None = None) -> RunRecorder:
        """Resume the run folder at `root` if it holds this sweep, else create it. A folder that holds
        another sweep, or a measured run where this one is simulated (or the reverse), is refused."""
        paths = RunPaths(Path(root))
        if paths.manifest.exists():
            manifest = read_manifest(paths.root)
            if manifest.sweep_name != sweep_name or manifest.simulated != simulated:
                kind = "simulated" if manifest.simulated else "measured"
                raise HarnessError(f"{display_path(paths.root)} holds another run ({manifest.sweep_name}, {kind}); "
                                   "choose another --run-id")
            for name, record in deployments.items():  # a deployment added to the sweep since
                manifest.deployments.setdefault(name, record)
            for name, ids in points.items():
                by_point = manifest.points.setdefault(name, {})
                for pid in ids:
                    by_point.setdefault(pid, "pending")
            manifest.status, manifest.ended_at = "running", None
            manifest.schema_version = SCHEMA_VERSION
        else:
            manifest = RunManifest(
                schema_version=SCHEMA_VERSION, run_id=paths.run_id, sweep_name=sweep_name, sweep_path=sweep_path,
                simulated=simulated, gpus_per_server=gpus_per_server, gpu_model=gpu_model, workload=workload,
                resolved_config=redact_config(resolved_config), deployments=dict(deployments),
                points={name: {pid: "pending" for pid in ids} for name, ids in points.items()},
                started_at=started_at or utc_now_iso())
        recorder = cls(paths, manifest)
        recorder._write()
        return recorder

    # ---- reading

    def point_ok(self, deployment: str, concurrency: int) -> bool:
        record = read_point(self.paths.point_json(deployment, concurrency))
        return record is not None and record.status in OK_STATUSES

    # ---- recording

    def _write(self) -> None:
        atomic_write_json(self.paths.manifest, self._manifest)

    def record_provenance(self, provenance: ProvenanceRecord) -> None:
        with self._lock:
            self._manifest.provenance = ProvenanceRecord.model_validate(
                redact_config(provenance.model_dump(mode="json")))
            self._write()

    def update_workload(self, **fields: Any) -> None:
        with self._lock:
            self._manifest.workload = self._manifest.workload.model_copy(update=fields)
            self._write()

    def update_deployment(self, name: str, **fields: Any) -> None:
        """Set fields of a deployment's record (validated against DeploymentRecord)."""
        with self._lock:
            current = self._manifest.deployments[name].model_dump()
            current.update(redact_config(_plain(fields)))
            self._manifest.deployments[name] = DeploymentRecord.model_validate(current)
            self._write()

    def record_stop(self, name: str, stop: StopRecord) -> None:
        with self._lock:
            record = self._manifest.deployments[name]
            self._manifest.deployments[name] = record.model_copy(update={"stops": [*record.stops, stop]})
            self._write()

    def record_correctness(self, name: str, correctness: CorrectnessRecord) -> None:
        """A deployment's probe answers, as they were (never passed through the secret masking of configs)."""
        with self._lock:
            record = self._manifest.deployments[name]
            self._manifest.deployments[name] = record.model_copy(update={"correctness": correctness})
            self._write()

    def count_restart(self, name: str) -> None:
        with self._lock:
            record = self._manifest.deployments[name]
            self._manifest.deployments[name] = record.model_copy(update={"restarts": record.restarts + 1})
            self._write()

    def write_command(self, deployment: str, shell_line: str) -> None:
        """command.txt: the server command as a person can re-run it (secrets masked)."""
        atomic_write_text(self.paths.command_txt(deployment), redact_text(shell_line) + "\n")

    def write_scrapes(self, deployment: str, concurrency: int, lines: list[str]) -> None:
        atomic_write_text(self.paths.scrapes_jsonl(deployment, concurrency), "".join(lines))

    def record_point(self, record: PointRecord) -> PointRecord:
        """point.json (redacted) and the point's status in the manifest; returns what was written."""
        clean = record.model_copy(update={
            "schema_version": SCHEMA_VERSION, "evalscope_command": redact_argv(record.evalscope_command),
            "server_log_tail": [redact_text(line) for line in record.server_log_tail],
            "reason": redact_text(record.reason) if record.reason else record.reason})
        with self._lock:
            atomic_write_json(self.paths.point_json(record.deployment, record.concurrency), clean)
            self._manifest.points.setdefault(record.deployment, {})[record.point_id] = clean.status
            self._write()
        return clean

    def finish(self, *, interrupted: bool = False, stopped_by_policy: bool = False,
               ended_at: str | None = None) -> RunStatus:
        with self._lock:
            status = run_status(self._manifest.points, interrupted=interrupted, stopped_by_policy=stopped_by_policy)
            self._manifest.status = status
            self._manifest.ended_at = ended_at or utc_now_iso()
            self._write()
        return status


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.model_dump(mode="json") if hasattr(v, "model_dump") else v) for k, v in fields.items()}
