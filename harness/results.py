"""The run folder: where every file of a run lives, written atomically, and the manifest.

results/<run-id>/manifest.json
results/<run-id>/deployments/<dep>/{command.txt, server.log, preflight.json}
results/<run-id>/points/<dep>/p<parallel>/{evalscope/attempt-<n>/, scrapes.jsonl, point.json}
results/<run-id>/summary.csv
results/<run-id>/report.md
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from harness.errors import HarnessError
from harness.records import PointRecord


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are for everyone on the machine to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


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

    def point_dir(self, deployment: str, parallel: int) -> Path:
        return self.root / "points" / deployment / f"p{parallel}"

    def point_json(self, deployment: str, parallel: int) -> Path:
        return self.point_dir(deployment, parallel) / "point.json"

    def scrapes_jsonl(self, deployment: str, parallel: int) -> Path:
        return self.point_dir(deployment, parallel) / "scrapes.jsonl"

    def evalscope_dir(self, deployment: str, parallel: int, attempt: int) -> Path:
        return self.point_dir(deployment, parallel) / "evalscope" / f"attempt-{attempt}"


class Manifest(BaseModel):
    """manifest.json: provenance, the resolved config, and the status of every point."""

    model_config = ConfigDict(extra="ignore")

    run_id: str
    sweep_name: str
    sweep_path: str
    simulated: bool = False
    gpus_per_server: int
    gpu_model: str | None = None
    workload: dict[str, Any] = Field(default_factory=dict)  # recipe name, lengths, conversations, hash
    provenance: dict[str, Any] = Field(default_factory=dict)
    resolved_config: dict[str, Any] = Field(default_factory=dict)
    deployments: dict[str, dict[str, Any]] = Field(default_factory=dict)  # command, restarts, versions
    points: dict[str, dict[str, str]] = Field(default_factory=dict)  # dep -> "p8" -> status
    started_at: str | None = None
    ended_at: str | None = None
    status: str = "running"


def read_manifest(run_dir: Path) -> Manifest:
    path = RunPaths(Path(run_dir)).manifest
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise HarnessError(f"{run_dir}: not a run folder (no manifest.json)") from None
    except ValueError as exc:
        raise HarnessError(f"{path}: unreadable manifest: {str(exc).splitlines()[0]}") from None


def write_manifest(run_dir: Path, manifest: Manifest) -> None:
    atomic_write_json(RunPaths(Path(run_dir)).manifest, manifest)


def read_point(path: Path) -> PointRecord | None:
    """A point.json, or None when absent or unreadable (then the point simply runs again)."""
    try:
        return PointRecord.model_validate_json(Path(path).read_bytes())
    except (FileNotFoundError, ValueError):
        return None


def write_point(run_dir: Path, record: PointRecord) -> None:
    atomic_write_json(RunPaths(Path(run_dir)).point_json(record.deployment, record.parallel), record)


def iter_points(run_dir: Path) -> list[PointRecord]:
    """Every readable point.json of a run, by deployment then concurrency."""
    records = [r for p in sorted((Path(run_dir) / "points").glob("*/p*/point.json"))
               if (r := read_point(p)) is not None]
    return sorted(records, key=lambda r: (r.deployment, r.parallel))
