"""The engine's data: its configuration, requests and their state, and the KV pools that the
scheduler (engine.py) and the residency policies (residency.py) share."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from harness.sim.counters import EngineCounters, EngineGauges
from harness.sim.kvpool import Block, PagePool
from harness.sim.profiles import HardwareProfile, KVSizing, ModelProfile

Policy = Literal["none", "offload", "hisparse"]


@dataclass(frozen=True)
class EngineConfig:
    model: ModelProfile
    hardware: HardwareProfile
    sizing: KVSizing
    policy: Policy
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    tensor_parallel_size: int = 1
    enable_prefix_caching: bool = True
    index_topk: int = 2048
    num_speculative_tokens: int = 0
    draft_acceptance: float = 0.8      # per draft position, given the previous one was accepted
    offload_cpu_bytes: int | None = None   # the OffloadingConnector's pool (offload, and hisparse's 128 GiB)
    offload_prompt_only: bool = True
    host_pool_bytes: int | None = None     # HiSparse pinned host pool
    hot_rows: int = 4096                   # HiSparse device_buffer_size
    hisparse_miss_rate: float = 0.05
    seed: int = 0
    step_time_factor: float = 1.0  # this run's speed: step_time_scale x its seeded jitter draw
    reply_history_ratio: float = 1.0  # tokens a re-sent reply takes in the next prompt, per generated token

    @property
    def block_size(self) -> int:
        return self.sizing.block_size_tokens

    @property
    def pool_pages(self) -> int:
        return self.sizing.pool_hisparse_pages if self.policy == "hisparse" else self.sizing.pool_full_blocks

    @property
    def pages_per_kv_block(self) -> int:
        return self.sizing.pages_per_full_block if self.policy == "hisparse" else 1

    @property
    def hot_pages_per_request(self) -> int:
        m = self.model
        return (m.hot_groups or 0) * (math.ceil(self.hot_rows / self.block_size) + (m.retained_pages or 0))


@dataclass(frozen=True)
class StepTransfers:
    h2d_bytes: float  # HiSparse hot-buffer misses the step waits for
    pages: int        # host pages those copies come from: the step's pending page transfers


@dataclass(frozen=True)
class SimRequest:
    request_id: str
    prompt_tokens: int
    block_hashes: tuple[int, ...]   # one per full block (the prompt's, then the reply's where known), each
                                    # covering its whole prefix
    max_tokens: int
    output_tokens: int              # what it will generate (max_tokens with ignore_eos)


@dataclass(frozen=True)
class FinishedRequest:
    request_id: str
    prompt_tokens: int
    output_tokens: int
    arrival_s: float
    first_scheduled_s: float
    first_token_s: float
    finished_s: float
    preemptions: int
    cached_tokens: int
    finish_reason: str  # "length" or "stop"


@dataclass(frozen=True)
class StepRecord:
    """One engine step as the engine ran it, and the scheduler's stats for it: what vLLM's scheduler
    reports with the step's outputs (`make_stats()` after `update_from_output`: finished requests gone,
    requests admitted in the step, prefill included, counted). A server shows `stats` from `end_s` on,
    when the step's outputs reach the frontend, never during the step."""

    index: int                      # every call of Engine.step, idle ones included
    start_s: float
    end_s: float
    scheduled: int                  # requests in the batch; 0 for an idle step
    stats: EngineGauges

    @property
    def num_running(self) -> int:
        return self.stats.num_requests_running


@dataclass(frozen=True)
class StepResult:
    start_s: float
    duration_s: float
    tokens: dict[str, int]          # request id -> tokens emitted at the end of the step
    finished: list[FinishedRequest]
    preempted: list[str]
    scheduled_tokens: int
    aborted: list[str] = field(default_factory=list)  # requests that can never fit the pool
    record: StepRecord | None = None  # the engine's record of this step (Engine.step_record)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(eq=False)
class RequestState:
    req: SimRequest
    arrival_s: float
    order: int = 0                  # admission order: preemption takes the latest admitted
    num_computed: int = 0
    num_output: int = 0
    mode: Literal["full", "mixed"] = "full"
    kv_blocks: list[Block] = field(default_factory=list)
    index_blocks: list[Block] = field(default_factory=list)
    hot_blocks: list[Block] = field(default_factory=list)
    host_blocks: list[Block] = field(default_factory=list)
    hot_warm: bool = False
    ready_at_s: float = 0.0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    preemptions: int = 0
    cached_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return self.req.prompt_tokens + self.num_output


@dataclass
class KVPools:
    """The pools and the counters the residency policies act on (owned by the engine)."""

    config: EngineConfig
    gpu: PagePool
    cpu: PagePool | None
    host: PagePool | None
    counters: EngineCounters
    running: list[RequestState]

    @property
    def cpu_block_bytes(self) -> int:
        sizing = self.config.sizing
        return sizing.indexer_block_bytes if self.config.policy == "hisparse" else sizing.full_block_bytes
