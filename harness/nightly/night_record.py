"""The night record: what one nightly run measured and what it ran on, as stored in the history.

One JSON file per night. The rows are the summary.csv columns (harness/summary.py COLUMNS, a
stable contract), typed; everything else is the provenance that explains a change between nights.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, create_model, field_validator

from harness.config.nightly import GATEABLE_METRICS, NightlySettings
from harness.judge import Experiment, Measurement, PointResult
from harness.records import OLD_REUSE_NAMES, AnswerScores
from harness.summary import COLUMNS

NIGHT_FORMAT = "harness-night"
NIGHT_SCHEMA_VERSION = 1
_NIGHT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$")

_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}

# One optional field per summary.csv column, so the record follows the contract without a copy of it;
# extra="ignore": a newer harness may add columns, an older reader keeps what it knows.
# columns renamed in schema 3 (EvalScope's names before): a night stored earlier is read under the new ones
_OLD_COLUMN_NAMES = {"concurrency": "parallel", "conversations": "number"}


def _row_field(name: str, kind: str) -> tuple[Any, Any]:
    old = _OLD_COLUMN_NAMES.get(name)
    if old is None:
        return _TYPES[kind] | None, None
    return _TYPES[kind] | None, Field(default=None, validation_alias=AliasChoices(name, old))


NightRow = create_model(  # type: ignore[call-overload]
    "NightRow",
    __config__=ConfigDict(extra="ignore", frozen=True),
    **{c.name: _row_field(c.name, c.kind) for c in COLUMNS},
)


class GpuFacts(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str | None = None
    count: int | None = None  # GPUs nvidia-smi saw on the node; None where there is none (simulated)
    driver: str | None = None


class NightProvenance(BaseModel):
    """Night-wide versions: when one changes between nights it is a likely cause of a change."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    harness_commit: str | None = None
    evalscope_version: str | None = None
    client_lock_sha256: str | None = None  # the lock the pinned EvalScope was installed from


class DeploymentFacts(BaseModel):
    """Per deployment: the server build, and the evidence that HiSparse was on when it was asked for."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    vllm_version: str | None = None
    vllm_commit: str | None = None
    kernel_hash: str | None = None  # the HiSparse kernel module the build installed, when one did
    lock_sha256: str | None = None  # the lock the server's environment was installed from: a new lock is a cause
    # the resolved launch profile the server ran with (serve flags, KV, env, simulator settings): a changed
    # flag explains a change as well as a new vLLM commit does
    launch_sha256: str | None = None
    hisparse_requested: bool | None = None
    hisparse_active: bool | None = None  # None: no evidence either way
    answers: AnswerScores | None = None  # the correctness probe's scores; None: not probed


# the provenance fields compared between nights, in the order a report names them
NIGHT_FIELDS = ("harness_commit", "evalscope_version", "client_lock_sha256")
DEPLOYMENT_FIELDS = ("vllm_commit", "vllm_version", "kernel_hash", "lock_sha256", "launch_sha256")


class NightRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    format: Literal["harness-night"] = NIGHT_FORMAT
    schema_version: int = NIGHT_SCHEMA_VERSION
    night_id: str
    started_at: str | None = None  # ISO 8601 UTC, from the run's manifest
    sweep_name: str
    sweep_sha256: str | None = None
    simulated: bool = False
    virtual_time: bool = False  # simulated without a client (`harness simulate`)
    gpu: GpuFacts = Field(default_factory=GpuFacts)
    gpus_per_server: int | None = None
    workload: dict[str, Any] = Field(default_factory=dict)  # the run's workload identity (empty in old nights)
    # the gate settings the night was judged with (its sweep's `nightly:` section), so `history` and the
    # dashboard judge it the same way; None in nights recorded before they were kept: the defaults
    settings: NightlySettings | None = None
    provenance: NightProvenance = Field(default_factory=NightProvenance)
    deployments: dict[str, DeploymentFacts] = Field(default_factory=dict)
    rows: list[NightRow] = Field(default_factory=list)  # type: ignore[valid-type]
    # links relative to the store root (the dashboard copies what they name next to its pages)
    report_path: str | None = None
    figure_paths: list[str] = Field(default_factory=list)
    # why the night could not measure what it should (no GPU, a build or a server start that failed);
    # such a night is never part of a baseline
    infrastructure_failure: str | None = None

    @field_validator("workload")
    @classmethod
    def _old_reuse_name(cls, workload: dict[str, Any]) -> dict[str, Any]:
        """A night recorded before `reuse: blog` became `shared` is the same workload."""
        reuse = workload.get("conversation_reuse")
        return {**workload, "conversation_reuse": OLD_REUSE_NAMES[reuse]} if reuse in OLD_REUSE_NAMES else workload

    @field_validator("night_id")
    @classmethod
    def _safe_id(cls, value: str) -> str:
        if not _NIGHT_ID.match(value):
            raise ValueError(f"night id {value!r}: use letters, digits and . _ + - (it names a file)")
        return value

    @property
    def experiment(self) -> Experiment:
        return Experiment(gpu_model=self.gpu.model, gpu_count=self.gpu.count, gpus_per_server=self.gpus_per_server,
                          simulated=self.simulated, virtual_time=self.virtual_time, workload=self.workload)

    def comparable_with(self, other: NightRecord) -> bool:
        """The same sweep file (a changed one starts a new baseline) and the same experiment (the judge's
        one definition, harness/judge.py)."""
        return self.sweep_sha256 == other.sweep_sha256 and not self.experiment.differences(other.experiment)

    @property
    def key(self) -> tuple[object, ...]:
        """A hashable name for the series of nights comparable with this one (change points group by it)."""
        e = self.experiment
        return (self.sweep_sha256, e.gpu_model, e.gpu_count, e.gpus_per_server, e.simulated, e.virtual_time,
                tuple(sorted((k, str(v)) for k, v in e.workload.items())))

    def measurement(self) -> Measurement:
        """The night as the judge reads it."""
        points = {}
        for r in self.rows:
            if r.deployment is None or r.concurrency is None:
                continue
            points[(str(r.deployment), int(r.concurrency))] = PointResult(
                status=str(r.status), reason=r.reason, failed_requests=r.failed_requests,
                total_requests=r.total_requests, conversations=r.conversations,
                values={m: getattr(r, m, None) for m in GATEABLE_METRICS})
        hisparse = {dep: (f.hisparse_requested, f.hisparse_active) for dep, f in self.deployments.items()}
        answers = {dep: f.answers for dep, f in self.deployments.items() if f.answers is not None}
        return Measurement(self.night_id, self.experiment, points, hisparse, answers)

    @property
    def measured(self) -> bool:
        """A night that can be part of a baseline: no infrastructure failure, and a point that completed."""
        return self.infrastructure_failure is None and any(r.status == "ok" for r in self.rows)

    @property
    def order(self) -> tuple[str, str]:
        """Sort key: start time, then id (ids are run ids, which start with a UTC time stamp)."""
        return (self.started_at or "", self.night_id)

    def row(self, deployment: str, concurrency: int) -> Any | None:
        for r in self.rows:
            if r.deployment == deployment and r.concurrency == concurrency:
                return r
        return None

    def points(self) -> list[tuple[str, int]]:
        return sorted({(str(r.deployment), int(r.concurrency)) for r in self.rows
                       if r.deployment is not None and r.concurrency is not None})

    def build_of(self, deployment: str) -> tuple[Any, ...]:
        """What one deployment ran with this night, as far as the record tells: the provenance fields
        compared between nights, and the GPU driver. Two nights with equal builds ran the same software."""
        facts = self.deployments.get(deployment, DeploymentFacts())
        return (tuple(getattr(facts, name) for name in DEPLOYMENT_FIELDS),
                tuple(getattr(self.provenance, name) for name in NIGHT_FIELDS), self.gpu.driver)

    def value(self, deployment: str, concurrency: int, metric: str) -> float | None:
        """A metric of an ok point, or None (absent, failed, or not measured)."""
        row = self.row(deployment, concurrency)
        if row is None or row.status != "ok":
            return None
        value = getattr(row, metric, None)
        return None if value is None else float(value)


def validation_message(exc: Exception) -> str:
    """The first problem of a pydantic ValidationError as 'field.path: message' (one line)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "record"
            return f"{where}: {first.get('msg', '')}"
        except (IndexError, TypeError, KeyError):
            pass
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
