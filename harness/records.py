"""The typed records a run folder holds: the run's manifest, each deployment, each point's outcome
and what was measured.

These are the contract between the run recorder (harness/results.py writes them), the metrics
derivation (fills `PointMetrics`) and the analysis (reads them back). Field names are stable:
`summary.csv` columns are these names, documented in README.md and docs/metrics.md.

Every file written carries `schema_version` (SCHEMA_VERSION); readers accept the previous version
(1: the first round's files, which had no such field and kept deployments as free-form mappings).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    create_model,
    field_validator,
    model_validator,
)

from harness.catalogue import Metric
from harness.catalogue import metrics as catalogue_metrics
from harness.config.nightly import NightlySettings

SCHEMA_VERSION = 3


def point_id(concurrency: int) -> str:
    """A point's name in folders, manifests, tables and flags alike: `c8`."""
    return f"c{concurrency}"


def _concurrency_of(point_id: str) -> int | None:
    """8 for `c8`, and for `p8` (the name before schema 3); None for anything else."""
    if len(point_id) > 1 and point_id[0] in "cp" and point_id[1:].isdigit():
        return int(point_id[1:])
    return None


class Record(BaseModel):
    # records are read back from disk written by older harness versions: tolerate extra keys
    model_config = ConfigDict(extra="ignore")


class EvalScopeSummary(Record):
    """EvalScope's benchmark_summary.json, under one key set whatever its version (docs/facts.md §6)."""

    total_requests: int | None = None
    success_requests: int | None = None
    failed_requests: int | None = None
    total_throughput_tok_s: float | None = None
    output_throughput_tok_s: float | None = None
    request_throughput_req_s: float | None = None
    mean_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    mean_latency_s: float | None = None
    mean_input_tokens: float | None = None
    mean_output_tokens: float | None = None
    time_taken_s: float | None = None
    key_set: Literal["<=1.9", ">=1.10"] | None = None


class ClientRequests(Record):
    """EvalScope's per-request output (benchmark_data.db), summarised (harness/metrics/evalscope_requests.py)."""

    requests: int = 0
    succeeded: int = 0
    db_schema: str | None = None  # "1.7" (the blog's release) or "1.14" (request_id, is_stream added)
    mean_prompt_tokens: float | None = None
    mean_completion_tokens: float | None = None
    mean_decode_span_ms: float | None = None  # latency - first chunk, replies of more than one token
    tpot_ms: float | None = None  # EvalScope's definition, recomputed from the rows, unrounded
    burst_replies: int = 0  # replies whose decode span was under 5 ms: they arrived in one read
    max_chunk_gap_ms: float | None = None


class GpuTelemetry(Record):
    """A point's GPU telemetry through NVML (harness/telemetry.py), the server's GPUs together."""

    status: Literal["ok", "unavailable"] = "unavailable"
    reason: str | None = None  # why it is unavailable (no binding, no driver, no GPU) or why sampling stopped
    gpus: list[str] = Field(default_factory=list)
    samples: int = 0
    mean_power_w: float | None = None  # summed over the server's GPUs
    mean_pcie_h2d_gb_s: float | None = None  # PCIe received by the GPUs, summed
    mean_pcie_d2h_gb_s: float | None = None
    mean_util_pct: float | None = None
    max_memory_used_gib: float | None = None


def _metric_field(metric: Metric) -> tuple[Any, Any]:
    kind = _KINDS[metric.kind]
    if metric.default is None:
        return kind | None, Field(default=None, description=metric.meaning)
    return kind, Field(default=metric.default, description=metric.meaning)


_KINDS: dict[str, type] = {"float": float, "int": int, "bool": bool, "str": str}

# Per-point metrics (docs/metrics.md), one field per catalogue entry that point.json's `metrics` holds
# (harness/catalogue.py declares them; nothing else does). None means the server did not expose it.
PointMetrics = create_model(  # type: ignore[call-overload]
    "PointMetrics", __base__=Record, __doc__="Per-point metrics: the catalogue's `metrics` entries.",
    **{m.name: _metric_field(m) for m in catalogue_metrics("metrics")})


# degraded: the point ran to its end but more requests failed than the sweep allows (max_failed_requests);
# does_not_fit: the server refused the deployment because one request at its max_model_len cannot fit its
# KV cache. That is a result (what the blog's 1M probe asks), not a failure: never retried, never a failed run.
PointStatus = Literal["ok", "degraded", "failed", "does_not_fit"]

# Why a point is not ok, as a kind set where the reason is made (never read back from the reason's words):
#   infrastructure    the point never reached a running server: preflight, a build, a server start
#   server            the server died during the point, or answered no request
#   client            the load generator failed: it exited, ran past its timeout, wrote no summary
#   not_as_requested  the server runs, but not what the profile asked for (HiSparse off)
#   does_not_fit      the server refused the deployment: one request at this length cannot fit its KV
#   requests          the point ran, but requests failed (degraded beyond max_failed_requests, or
#                     requests the simulated engine could never place)
#   interrupted       the sweep was stopping
FailureKind = Literal["infrastructure", "server", "client", "not_as_requested", "does_not_fit", "requests",
                      "interrupted"]
# What reaching the machine's limits, not the code under test, explains: a nightly does not call it a regression.
INFRASTRUCTURE_KINDS: frozenset[str] = frozenset({"infrastructure", "interrupted"})


def point_status(failed_requests: int, max_failed_requests: int) -> PointStatus:
    """The one rule for a point that ran to its end: ok, or degraded when more requests failed than allowed."""
    return "degraded" if failed_requests > max_failed_requests else "ok"


class PointRecord(Record):
    """point.json: everything about one (deployment, concurrency) point."""

    schema_version: int = 1  # files without the field are version 1
    deployment: str
    # written before schema 3 as EvalScope's names, `parallel` and `number`
    concurrency: int = Field(validation_alias=AliasChoices("concurrency", "parallel"))
    conversations: int = Field(validation_alias=AliasChoices("conversations", "number"))
    dataset_offset: int
    status: PointStatus
    reason: str | None = None
    failure: FailureKind | None = None  # set with the reason, whenever the point is not ok
    attempt: int = 1
    started_at: str | None = None  # ISO 8601 UTC
    ended_at: str | None = None
    started_unix_s: float | None = None
    ended_unix_s: float | None = None
    wall_s: float | None = None
    evalscope_wall_s: float | None = None
    evalscope_command: list[str] = Field(default_factory=list)
    evalscope_output_dir: str | None = None
    server_log_tail: list[str] = Field(default_factory=list)
    server_restarted: bool = False  # the attempt recorded here ran on a server started after the first start
    retry: Literal["restart", "shift"] | None = None  # how the retry recorded here avoided a warm prefix cache
    simulated: bool = False
    gpus_per_server: int
    warnings: list[str] = Field(default_factory=list)  # what makes the numbers doubtful though the point ran
    summary: EvalScopeSummary | None = None
    requests: ClientRequests | None = None  # EvalScope's per-request rows, summarised
    gpu: GpuTelemetry | None = None  # NVML telemetry of the server's GPUs (gpu.jsonl beside)
    metrics: PointMetrics | None = None

    @property
    def point_id(self) -> str:
        return point_id(self.concurrency)

    @model_validator(mode="after")
    def _legacy_failure(self) -> PointRecord:
        """Point files written before failures had kinds (schema 2 and older) get one from their status."""
        if self.failure is None and self.status != "ok":
            self.failure = "requests" if self.status == "degraded" else _legacy_kind(self.reason or "")
        return self


def _legacy_kind(reason: str) -> FailureKind:
    """The kind the harness's reasons of the release before kinds meant; used only to read those files."""
    for prefix, kind in (("server failed to start", "infrastructure"), ("preflight:", "infrastructure"),
                         ("HiSparse requested but not active", "not_as_requested"), ("interrupted", "interrupted"),
                         ("server died", "server"), ("no request succeeded", "server"),
                         ("requests never fit", "requests")):
        if reason.startswith(prefix) or prefix in reason:
            return kind  # type: ignore[return-value]
    return "client"


# ---- the manifest ---------------------------------------------------------------------------------

RunStatus = Literal["running", "ok", "degraded", "failed", "stopped", "interrupted"]


class GpuRecord(Record):
    model: str | None = None
    count: int = 0
    driver: str | None = None


class HubInputRecord(Record):
    """A model or data set read from ModelScope or Hugging Face: what was asked for and what was read."""

    hub: str
    id: str
    repo_type: str = "model"
    revision: str | None = None  # as pinned (None: the default branch)
    revision_sha: str | None = None  # what was read: a commit on Hugging Face; ModelScope: its recorded revision
    revision_is_commit: bool | None = None


class WeightsRecord(HubInputRecord):
    """A deployment's hub model, fetched onto its server nodes before the server started."""

    nodes: dict[str, str] = Field(default_factory=dict)  # node id -> the snapshot folder the server loads there
    bytes_transferred: int = 0  # over every node, this run (0: all were there already)
    fetch_s: float | None = None


class ProvenanceRecord(Record):
    """What a run ran on and with, recorded once per run."""

    harness_version: str | None = None
    harness_commit: str | None = None
    python: str | None = None
    hostname: str | None = None
    os: str | None = None
    evalscope_version: str | None = None
    client_source: str | None = None  # "harness" or the pinned EvalScope spec the points ran
    client_lock_sha256: str | None = None  # the lock the pinned client was installed from
    ray_version: str | None = None
    config_files: dict[str, str] = Field(default_factory=dict)  # path -> sha256
    dataset_path: str | None = None
    dataset_sha256: str | None = None
    hub_inputs: dict[str, HubInputRecord] = Field(default_factory=dict)  # the dataset's: source, pad, tokenizer
    gpu: GpuRecord = Field(default_factory=GpuRecord)
    host_ram_gib: float | None = None
    simulated: str | None = None  # how the numbers were made when no real server ran


# a recipe's `reuse` as runs before its rename recorded it: the same workload under its new name
OLD_REUSE_NAMES = {"blog": "shared"}


class WorkloadRecord(Record):
    """What a request looks like: the recipe's shape and the dataset the points read."""

    recipe: str | None = None
    first_turn_length: int | None = None
    subsequent_turn_length: int | None = None
    num_turns: int | None = None
    max_tokens: int | None = None
    conversations_needed: int | None = None
    conversations_built: int | None = None
    conversation_reuse: str | None = None  # "shared": the recipe's conversations re-sent by later points
    dataset_sha256: str | None = None
    source: str | None = None

    @field_validator("conversation_reuse")
    @classmethod
    def _old_reuse_name(cls, value: str | None) -> str | None:
        return OLD_REUSE_NAMES.get(value, value) if value is not None else None

    def identity(self) -> dict[str, object]:
        """What makes two workloads the same experiment: not how many conversations a sweep needs
        (a shortened nightly sweep needs fewer of the same dataset), nor unset fields."""
        return {k: v for k, v in sorted(self.model_dump().items())
                if v is not None and k not in ("conversations_needed",)}


class KernelRecord(Record):
    """The HiSparse kernel module a build carries (kernels: bundled)."""

    version: str | None = None
    source_sha256: str | None = None
    built_for: str | None = None  # cpu | cuda
    cuda_arch: str | None = None
    overlay_dir: str | None = None  # the cached overlay the server had on PYTHONPATH


class LockRecord(Record):
    """The lock an environment was installed from (harness/data/locks/)."""

    recipe: str
    file: str
    sha256: str
    packages: int = 0


class BuildRecord(Record):
    """A server's build: the environment, what vLLM and torch it holds, and its kernels."""

    kind: str | None = None  # system | pypi | git
    spec: str | None = None
    env_dir: str | None = None
    python: str | None = None
    vllm_version: str | None = None
    vllm_commit: str | None = None
    torch_version: str | None = None
    created: bool = False
    build_s: float = 0.0
    distribution: str | None = None
    torch_cuda: str | None = None
    cuda_arch: str | None = None
    build_command: str | None = None
    size_bytes: int | None = None
    lock: LockRecord | None = None  # None: no lock for this build; `resolved` then says what pip installed
    resolved: list[str] = Field(default_factory=list)  # name==version of an unlocked build (its pip freeze)
    kernels: str = "vllm"
    kernel: KernelRecord | None = None


class HiSparseEvidence(Record):
    """What the running server showed of HiSparse (harness/evidence.py): its start-up lines, the
    `vllm:hisparse_` families of its first scrape, and the calculator beside the logged concurrency."""

    hisparse_requested: bool = False
    hisparse_active: bool | None = None  # None: not checked
    problem: str | None = None  # set when HiSparse was requested and neither witness shows it
    start_lines: list[str] = Field(default_factory=list)
    host_pool_gib: float | None = None  # the blog branch's start line names its pool
    top_k: int | None = None
    device_buffer_size: int | None = None
    lru_rows: int | None = None
    max_num_seqs: int | None = None
    host_source_gib: float | None = None
    host_source_blocks: int | None = None
    gpu_pool_gib: float | None = None
    gpu_pool_blocks: int | None = None
    logged_max_concurrency: float | None = None
    logged_concurrency_tokens: int | None = None
    predicted_concurrency: int | None = Field(default=None, description="the calculator at the logged length")
    metric_families: list[str] = Field(default_factory=list)


class Answer(Record):
    """One greedy answer of the correctness probe."""

    id: str
    text: str  # the reply's content
    generated_ids: list[int] | None = None  # the reply's token ids, where the server returns them
    correct: bool | None = None  # None: the prompt has no known answer
    error: str | None = None  # the request failed


class CorrectnessRecord(Record):
    """A deployment's correctness probe: the same prompts, greedy, alone and under the sweep's highest point."""

    prompts: str  # the prompt set's file
    unpressured: list[Answer] = Field(default_factory=list)
    pressured: list[Answer] = Field(default_factory=list)
    pressured_concurrency: int | None = None  # the point the pressured answers were asked under
    pressured_running: float | None = None  # requests the server was running when they were asked
    pressured_s: float | None = None  # how long asking them took: one request beside the point's, that long
    note: str | None = None  # why a half is missing

    @staticmethod
    def agreement(a: list[Answer], b: list[Answer]) -> float | None:
        """The share of prompts answered the same in both (token ids where both have them, else text)."""
        theirs = {x.id: x for x in b if x.error is None}
        pairs = [(x, theirs[x.id]) for x in a if x.error is None and x.id in theirs]
        if not pairs:
            return None
        same = sum(1 for x, y in pairs if (x.generated_ids == y.generated_ids if x.generated_ids is not None
                                           and y.generated_ids is not None else x.text == y.text))
        return same / len(pairs)

    @staticmethod
    def score(answers: list[Answer]) -> float | None:
        judged = [a.correct for a in answers if a.correct is not None and a.error is None]
        return sum(judged) / len(judged) if judged else None

    @property
    def agreement_under_pressure(self) -> float | None:
        return self.agreement(self.pressured, self.unpressured)


class AnswerScores(Record):
    """What a deployment's correctness probe comes to: the shares the correctness gate judges."""

    agreement_under_pressure: float | None = None  # pressured answers equal to the same server's unpressured ones
    agreement_with_baseline: float | None = None  # unpressured answers equal to the baseline arm's
    baseline: str | None = None  # the baseline arm's deployment (None: this is it, or there is none)
    score: float | None = None  # answers that are right, over both halves, where the prompts have answers
    asked_under_pressure: bool = False


def answer_scores(deployments: dict[str, DeploymentRecord]) -> dict[str, AnswerScores]:
    """Each probed deployment's scores. The baseline arm is the first deployment without HiSparse (no
    evidence was needed of it) at the same context: what the others' answers should equal."""
    probed = {name: d for name, d in deployments.items() if d.correctness is not None}
    out = {}
    for name, dep in probed.items():
        c = dep.correctness
        baseline = next((other for other, d in probed.items() if d.evidence is None
                         and d.context_tokens == dep.context_tokens), None)
        with_baseline = (None if baseline in (None, name)
                         else CorrectnessRecord.agreement(c.unpressured, probed[baseline].correctness.unpressured))
        out[name] = AnswerScores(agreement_under_pressure=c.agreement_under_pressure,
                                 agreement_with_baseline=with_baseline,
                                 baseline=baseline if baseline != name else None,
                                 score=CorrectnessRecord.score(c.unpressured + c.pressured),
                                 asked_under_pressure=bool(c.pressured))
    return out


class StopRecord(Record):
    """One stop of a deployment's server: how long it took, the grace it had, and whether anything had
    to be signalled beyond the server itself or killed."""

    at: str  # ISO 8601 UTC, when the stop began
    grace_s: float
    duration_s: float
    exited_in_grace: bool  # the tree exited on the server's own SIGTERM within the grace
    killed: list[int] = Field(default_factory=list)  # pids that needed SIGKILL
    survivors: list[int] = Field(default_factory=list)  # pids still alive after SIGKILL (a leak)


class DeploymentRecord(Record):
    """One deployment of a run: what it is, where its server ran, and how often it restarted."""

    launch: str
    engine: str
    arm: str | None = None  # the sweep's deployment it is (a sweep with contexts runs each arm once per context)
    context_tokens: int | None = None  # its first-turn length, in a sweep with contexts
    max_model_len: int | None = None  # the admission limit its server started with
    dialect: str | None = None
    restarts: int = 0
    base_url: str | None = None
    node: str | None = None
    server_pid: int | None = None
    pidfile: str | None = None  # on the server's node (its reaper reads it there)
    server_version: dict[str, str] = Field(default_factory=dict)
    build: BuildRecord | None = None
    weights: WeightsRecord | None = None  # a hub model fetched onto the server nodes
    policy: str | None = None  # simulated engine: its KV residency policy
    evidence: HiSparseEvidence | None = None  # what the server showed of HiSparse (HiSparse arms)
    stops: list[StopRecord] = Field(default_factory=list)  # every stop of its server, in order
    correctness: CorrectnessRecord | None = None  # the greedy probe's answers (served runs)


class ResolvedConfig(Record):
    """manifest.json's `resolved_config`: the sweep file and every launch profile as the run resolved
    them, kept as JSON (a reader may lack the files they name); the parts readers need are typed here."""

    sweep: dict[str, Any] = Field(default_factory=dict)
    launches: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def nightly(self) -> NightlySettings | None:
        """The sweep's gate settings (its `nightly:` section), or None where the run did not record them."""
        raw = self.sweep.get("nightly")
        if not isinstance(raw, dict):
            return None
        try:
            return NightlySettings.model_validate(raw)
        except ValueError:
            return None

    def hisparse_requested(self, deployment: str) -> bool | None:
        launch = self.launches.get(deployment)
        if not launch:
            return None
        return (launch.get("kv") or {}).get("hisparse") is not None

    def serve(self, deployment: str) -> dict[str, Any]:
        return dict((self.launches.get(deployment) or {}).get("serve") or {})

    def engine(self, deployment: str) -> str:
        return str((self.launches.get(deployment) or {}).get("engine", "vllm"))


class RunManifest(Record):
    """manifest.json: provenance, the resolved config, every deployment and the status of every point."""

    schema_version: int = 1  # files without the field are version 1
    run_id: str
    sweep_name: str
    sweep_path: str
    simulated: bool = False
    gpus_per_server: int
    gpu_model: str | None = None
    workload: WorkloadRecord = Field(default_factory=WorkloadRecord)
    provenance: ProvenanceRecord = Field(default_factory=ProvenanceRecord)
    resolved_config: dict[str, Any] = Field(default_factory=dict)
    deployments: dict[str, DeploymentRecord] = Field(default_factory=dict)
    points: dict[str, dict[str, str]] = Field(default_factory=dict)  # dep -> "c8" -> point status or "pending"
    started_at: str | None = None
    ended_at: str | None = None
    status: RunStatus = "running"

    @field_validator("points")
    @classmethod
    def _c_names(cls, points: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        """Point ids as `c8` whatever release wrote the manifest (`p8` before schema 3)."""
        return {dep: {point_id(c) if (c := _concurrency_of(pid)) is not None else pid: status
                      for pid, status in by_point.items()} for dep, by_point in points.items()}

    @property
    def resolved(self) -> ResolvedConfig:
        try:
            return ResolvedConfig.model_validate(self.resolved_config)
        except ValueError:
            return ResolvedConfig()


def run_status(points: dict[str, dict[str, str]], *, interrupted: bool, stopped_by_policy: bool) -> RunStatus:
    """The one rule for a run's final status, whoever ran it."""
    statuses = [s for by_point in points.values() for s in by_point.values()]
    if stopped_by_policy:
        return "stopped"
    if interrupted or any(s == "pending" for s in statuses):
        return "interrupted"
    if any(s == "failed" for s in statuses):
        return "failed"  # a point that does not fit is a result, not a failure
    return "degraded" if any(s == "degraded" for s in statuses) else "ok"
