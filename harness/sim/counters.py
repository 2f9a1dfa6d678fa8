"""What the engine counts, in vLLM's terms: the values behind every `vllm:` series it exposes."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                           7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                             60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass
class Histogram:
    bounds_s: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket (not cumulative); last is +Inf
    sum_s: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds_s) + 1)

    def observe(self, value_s: float) -> None:
        self.counts[bisect.bisect_left(self.bounds_s, value_s)] += 1
        self.sum_s += value_s
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, n in zip((*map(str, self.bounds_s), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


@dataclass
class EngineCounters:
    """Monotone totals (counters) since the engine started."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    request_success: int = 0
    request_success_stop: int = 0          # of which finished before max_tokens
    preemptions: int = 0
    prefix_cache_queries: int = 0        # tokens looked up in the GPU prefix cache
    prefix_cache_hits: int = 0
    external_prefix_cache_queries: int = 0   # tokens looked up in the connector's host cache
    external_prefix_cache_hits: int = 0
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    kv_offload_load_bytes: int = 0
    kv_offload_store_bytes: int = 0
    kv_offload_load_time_s: float = 0.0
    kv_offload_store_time_s: float = 0.0
    hisparse_cache_hits: int = 0         # top-K row lookups (x layers) served from GPU (resident or hot)
    hisparse_cache_misses: int = 0       # rows copied from pinned host memory
    hisparse_host_to_device_bytes: int = 0
    hisparse_spills: int = 0             # requests moved from full to mixed residency
    steps: int = 0
    step_tokens: int = 0                 # tokens scheduled, summed over steps (vLLM's iteration histogram)
    busy_s: float = 0.0


@dataclass
class EngineHistograms:
    time_to_first_token: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    inter_token_latency: Histogram = field(default_factory=lambda: Histogram(TOKEN_LATENCY_BUCKETS_S))
    request_time_per_output_token: Histogram = field(
        default_factory=lambda: Histogram(TOKEN_LATENCY_BUCKETS_S))
    e2e_request_latency: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS_S))
    request_queue_time: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS_S))
    request_prefill_time: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS_S))
    request_decode_time: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS_S))


@dataclass(frozen=True)
class EngineGauges:
    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage_perc: float
    kv_offload_cpu_cache_usage_perc: float | None
    hisparse_host_cache_usage_perc: float | None
    hisparse_pending_page_transfers: int | None
