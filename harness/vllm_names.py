"""vLLM's Prometheus metric names, as /metrics exposes them (docs/facts.md §2), in one place.

Every module that reads or writes a `vllm:` series takes its name from here: the metrics derivation, the
HiSparse evidence, the report's time series, the calibration, and the simulated engine's exposition
(which registers counters under `family()` names: Prometheus adds `_total` itself).
"""

from __future__ import annotations

PREFIX = "vllm:"

# gauges
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"  # older vLLM: read as a fallback
OFFLOAD_CPU_USAGE = "vllm:kv_offload_cpu_cache_usage_perc"

# counters (exposed with `_total`)
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
EXTERNAL_PREFIX_QUERIES = "vllm:external_prefix_cache_queries_total"
EXTERNAL_PREFIX_HITS = "vllm:external_prefix_cache_hits_total"
REQUEST_SUCCESS = "vllm:request_success_total"
OFFLOAD_LOAD_BYTES = "vllm:kv_offload_load_bytes_total"
OFFLOAD_STORE_BYTES = "vllm:kv_offload_store_bytes_total"
OFFLOAD_LOAD_TIME = "vllm:kv_offload_load_time_total"
OFFLOAD_STORE_TIME = "vllm:kv_offload_store_time_total"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"

# histograms
ITERATION_TOKENS = "vllm:iteration_tokens_total"  # tokens each engine step scheduled: its count is the steps
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
E2E_LATENCY = "vllm:e2e_request_latency_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
PREFILL_TIME = "vllm:request_prefill_time_seconds"
DECODE_TIME = "vllm:request_decode_time_seconds"

# HiSparse: names drift between commits; these are the canonical ones (0.33.0's, as exposed) that
# harness/evidence.py maps every build's names onto
HISPARSE_PREFIX = "vllm:hisparse_"
HISPARSE_HITS = "vllm:hisparse_cache_hits_total"
HISPARSE_MISSES = "vllm:hisparse_cache_misses_total"
HISPARSE_H2D_BYTES = "vllm:hisparse_host_to_device_bytes_total"
HISPARSE_HOST_USAGE = "vllm:hisparse_host_cache_usage_perc"
HISPARSE_HOST_BLOCKS_USED = "vllm:hisparse_host_blocks_used"
HISPARSE_HOST_BLOCKS_TOTAL = "vllm:hisparse_host_blocks_total"
HISPARSE_PENDING = "vllm:hisparse_pending_transfers"
HISPARSE_PENDING_PAGES = "vllm:hisparse_pending_page_transfers"  # 0.33.0's exposed name of the gauge above


def family(name: str) -> str:
    """The name a Prometheus client registers a counter under (it adds `_total` when exposing)."""
    return name[: -len("_total")] if name.endswith("_total") else name
