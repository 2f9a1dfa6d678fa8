"""The typed records a run folder holds: one point's outcome and what was measured.

These are the contract between the runner (writes them), the metrics derivation
(fills `PointMetrics`) and the analysis (reads them back). Field names are stable:
`summary.csv` columns are these names, documented in README.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Record(BaseModel):
    # records are read back from disk written by older harness versions: tolerate extra keys
    model_config = ConfigDict(extra="ignore")


class EvalScopeSummary(Record):
    """EvalScope's benchmark_summary.json, under one key set whatever its version (FACTS.md §6)."""

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


class PointMetrics(Record):
    """Per-point metrics (DESIGN.md "Metrics"). None means the server did not expose it."""

    interactivity_tok_s_user: float | None = None
    total_tok_s_per_gpu: float | None = None
    output_tok_s_per_gpu: float | None = None
    mean_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    occupancy_mean_running: float | None = None
    mean_waiting: float | None = None
    max_running: float | None = None
    mtp_acceptance_length: float | None = None
    preemptions: float | None = None
    kv_usage_mean: float | None = None
    kv_usage_max: float | None = None
    offload_load_bytes: float | None = None
    offload_store_bytes: float | None = None
    offload_load_bytes_per_s: float | None = None
    offload_store_bytes_per_s: float | None = None
    hisparse_hit_rate: float | None = None
    hisparse_h2d_bytes_per_s: float | None = None
    prefix_cache_hit_rate: float | None = None
    server_tpot_ms: float | None = None
    tpot_rel_diff: float | None = Field(default=None, description="(server - client) / client TPOT")
    tpot_disagrees: bool | None = Field(default=None, description="|tpot_rel_diff| > 0.10")
    counter_resets: int = 0
    scrapes_ok: int = 0
    scrapes_failed: int = 0
    window_s: float | None = None


PointStatus = Literal["ok", "failed"]


class PointRecord(Record):
    """point.json: everything about one (deployment, concurrency) point."""

    deployment: str
    parallel: int
    number: int
    dataset_offset: int
    status: PointStatus
    reason: str | None = None
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
    server_restarted: bool = False
    simulated: bool = False
    gpus_per_server: int
    summary: EvalScopeSummary | None = None
    metrics: PointMetrics | None = None

    @property
    def point_id(self) -> str:
        return f"p{self.parallel}"
