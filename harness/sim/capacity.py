"""What the simulated engine says about its KV capacity at start-up, as vLLM does (docs/facts.md §10):

- the KV cache line, `GPU KV cache size: N tokens, Maximum concurrency for M tokens per request: X.XXx`
  (vLLM's `update_kv_cache_capacity`; pools "GPU + host" with HiSparse, whose host groups are a separate
  pool: the smaller limit applies);
- the refusal of a max_model_len whose one request cannot fit the KV cache, with vLLM's ValueError text
  (`_check_enough_kv_cache_memory`), and its estimate of the largest length that would fit;
- with HiSparse on, its three start-up lines: enabled, the pools, the steady-state concurrency
  (docs/facts.md §2).

A request at max_model_len needs ceil(max_model_len / block) blocks; on the HiSparse policy it needs them
as HMA pages on the GPU (plus its hot buffer) and as blocks of the host pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.evidence import START_CONCURRENCY, START_ENABLED, START_POOLS
from harness.sim.state import EngineConfig

GIB = 2**30
# vLLM's texts (vllm/v1/core/kv_cache_utils.py, 0.32.0)
KV_LINE = "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"
REFUSAL = ("To serve at least one request with the model's max seq len ({max_model_len}), ({needed} GiB KV cache "
           "is needed, which is larger than the available KV cache memory ({available} GiB). {estimate}Try "
           "increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or "
           "decreasing `max_model_len` when initializing the engine. See "
           "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")
ESTIMATE = "Based on the available memory, the estimated maximum model length is {tokens}. "


def _gib(n_bytes: float) -> str:
    return f"{round(n_bytes / GIB, 2)}"


@dataclass(frozen=True)
class KvCapacity:
    pools: str  # "GPU" or "GPU + host"
    blocks_per_request: int  # at max_model_len
    max_concurrency: float  # requests of max_model_len the pools hold at once
    kv_cache_tokens: int  # max_concurrency x max_model_len, as vLLM reports it

    def line(self, max_model_len: int) -> str:
        return KV_LINE % (self.pools, f"{self.kv_cache_tokens:,}", f"{max_model_len:,}", self.max_concurrency)


def kv_capacity(config: EngineConfig) -> KvCapacity:
    blocks = math.ceil(config.max_model_len / config.block_size)
    if config.policy == "hisparse" and config.host_pool_bytes:
        gpu = config.sizing.pool_hisparse_pages / (blocks + config.hot_pages_per_request)
        host = (config.host_pool_bytes // config.sizing.host_block_bytes) / blocks
        concurrency, pools = min(gpu, host), "GPU + host"
    else:
        concurrency, pools = config.sizing.pool_full_blocks / blocks, "GPU"
    return KvCapacity(pools, blocks, concurrency, int(concurrency * config.max_model_len))


def refusal(config: EngineConfig) -> str | None:
    """vLLM's start-up ValueError where one request of max_model_len tokens cannot fit (None: it fits)."""
    blocks = math.ceil(config.max_model_len / config.block_size)
    sizing = config.sizing
    if config.policy == "hisparse" and config.host_pool_bytes:
        page = sizing.hisparse_page_bytes
        need_pages, have_pages = blocks + config.hot_pages_per_request, sizing.pool_hisparse_pages
        if need_pages <= have_pages:
            return None  # the host pool's own minimum is the preflight's refusal (harness/servers/preflight.py)
        needed, available = need_pages * page, sizing.kv_bytes_per_gpu
        fits = max(0, have_pages - config.hot_pages_per_request) * config.block_size
    else:
        if blocks <= sizing.pool_full_blocks:
            return None
        needed, available = blocks * sizing.full_block_bytes, sizing.kv_bytes_per_gpu
        fits = sizing.pool_full_blocks * config.block_size
    estimate = ESTIMATE.format(tokens=fits) if fits > 0 else ""
    return REFUSAL.format(max_model_len=config.max_model_len, needed=_gib(needed), available=_gib(available),
                          estimate=estimate)


def hisparse_start_lines(config: EngineConfig) -> list[str]:
    """The start-up lines vLLM logs when HiSparse is on (docs/facts.md §2), from the engine's own pools.

    The steady-state concurrency is the calculator's rule applied to those pools (docs/facts.md §4):
    max(baseline, min(max_num_seqs, GPU limit, host limit)) for requests of max_model_len tokens."""
    if config.policy != "hisparse" or config.host_pool_bytes is None:
        return []
    sizing, tokens = config.sizing, config.max_model_len
    blocks = math.ceil(tokens / config.block_size)
    gpu_pages, host_blocks = sizing.pool_hisparse_pages, config.host_pool_bytes // sizing.host_block_bytes
    gpu_limit = gpu_pages // (blocks + config.hot_pages_per_request)
    baseline = min(config.max_num_seqs, sizing.pool_full_blocks // blocks)
    concurrency = max(baseline, min(config.max_num_seqs, gpu_limit, host_blocks // blocks))
    return [START_ENABLED % (config.index_topk, config.hot_rows, max(0, config.hot_rows - config.index_topk),
                             config.max_num_seqs),
            START_POOLS % (config.host_pool_bytes / GIB, host_blocks, sizing.kv_bytes_per_gpu / GIB, gpu_pages),
            START_CONCURRENCY % (tokens, concurrency)]
