"""A launch profile -> the engine's configuration: the same serve, kv and speculative settings a vLLM
arm takes, plus the `sim:` section's profiles and scaling knobs. A vLLM arm's profile works too (its
`sim:` section names the profiles that describe it), which is how `harness calibrate` replays a real run."""

from __future__ import annotations

import hashlib
import random

from harness.config import LaunchProfile
from harness.config.sim import SimSettings
from harness.errors import HarnessError
from harness.sim.engine import EngineConfig, Policy
from harness.sim.profiles import (
    GIB,
    HISPARSE_FIELDS,
    HardwareProfile,
    ModelProfile,
    kv_sizing,
    load_hardware_profile,
    load_model_profile,
)

# vLLM's defaults for an OpenAI server on a datacenter GPU when the profile leaves them out
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_HISPARSE_MISS_RATE = 0.05  # residency.py: our assumption until a run with HiSparse counters calibrates it
CPU_KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"  # vLLM CPU's KV space in GiB (docs/facts.md §8)


def draft_acceptance_for_mean(mean_length: float, num_speculative_tokens: int) -> float:
    """The per-position acceptance p with 1 + p + p^2 + ... + p^k = mean_length (bisection)."""
    k = num_speculative_tokens
    target = min(max(mean_length, 1.0), 1.0 + k)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if 1.0 + sum(mid**i for i in range(1, k + 1)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def policy_of(profile: LaunchProfile) -> Policy:
    ignored = profile.sim is not None and profile.sim.faults.ignore_hisparse  # a build that drops the flags
    if profile.kv.hisparse is not None and not ignored:
        return "hisparse"
    return "offload" if profile.kv.offload is not None else "none"


def run_speed_factor(sim: SimSettings, run_seed: int | None = None) -> float:
    """step_time_scale x one draw of 1 + N(0, run_jitter), seeded by sim.run_seed, else `run_seed`
    (None: fresh entropy, a new draw each start)."""
    factor = sim.step_time_scale
    if sim.run_jitter > 0:
        rng = random.Random(sim.run_seed if sim.run_seed is not None else run_seed)
        factor *= max(0.5, 1.0 + rng.gauss(0.0, sim.run_jitter))
    return factor


def stable_seed(*parts: str) -> int:
    """A seed from names (run id, deployment) that is the same in every process, unlike hash()."""
    return int.from_bytes(hashlib.sha256("\0".join(parts).encode()).digest()[:8], "big")


def _kv_bytes(profile: LaunchProfile) -> int | None:
    """A KV space the profile fixes in bytes: --kv-cache-memory-bytes, or vLLM CPU's KV space variable."""
    if profile.serve.kv_cache_memory_bytes is not None:
        return profile.serve.kv_cache_memory_bytes
    raw = profile.env.get(CPU_KV_SPACE_ENV)
    if raw is None:
        return None
    try:
        return int(float(raw) * GIB)
    except ValueError:
        raise HarnessError(f"env {CPU_KV_SPACE_ENV}={raw!r} is not a number of GiB") from None


def engine_config(profile: LaunchProfile, run_seed: int | None = None, *, model: ModelProfile | None = None,
                  hardware: HardwareProfile | None = None) -> EngineConfig:
    """`model` and `hardware` replace the profiles the `sim:` section names (a calibration's trial values)."""
    sim = profile.sim or SimSettings()
    serve = profile.serve
    model = model or load_model_profile(sim.model_profile)
    hardware = hardware or load_hardware_profile(sim.hardware_profile)
    block_size = serve.block_size or model.block_size_tokens
    pool_tokens = sim.kv_pool_tokens
    if pool_tokens is None and serve.num_gpu_blocks_override is not None:
        pool_tokens = serve.num_gpu_blocks_override * block_size
    sizing = kv_sizing(model, hardware, tensor_parallel_size=serve.tensor_parallel_size,
                       kv_cache_dtype=serve.kv_cache_dtype, gpu_memory_utilization=serve.gpu_memory_utilization,
                       sparse_row_bytes=sim.sparse_row_bytes, pool_tokens=pool_tokens, block_size_tokens=block_size,
                       kv_bytes=_kv_bytes(profile))
    k = profile.speculative.num_speculative_tokens if profile.speculative is not None else 0
    # an explicit mean acceptance wins, then the calibrated deployment's, then the model's assumption
    acceptance = hardware.mtp_draft_acceptance or model.mtp_draft_acceptance
    if k and sim.mtp_acceptance_mean is not None:
        acceptance = draft_acceptance_for_mean(sim.mtp_acceptance_mean, k)
    hisparse = profile.kv.hisparse if policy_of(profile) == "hisparse" else None
    offload = profile.kv.offload
    if hisparse is not None:
        missing = [f for f in HISPARSE_FIELDS if getattr(model, f) is None]
        if model.attention != "sparse_mla" or missing:
            raise HarnessError(f"kv.hisparse: HiSparse needs a sparse-MLA model profile with "
                               f"{', '.join(HISPARSE_FIELDS)}; sim profile {model.name} is {model.attention} "
                               f"attention" + (f" without {', '.join(missing)}" if missing else ""))
    topk = sim.index_topk or model.index_topk or 0
    hot_rows = (hisparse.device_buffer_size if hisparse and hisparse.device_buffer_size
                else (k + 2) * topk if k else 2 * topk)  # (decode query length + 1) x top-K, docs/facts.md §2
    miss_rate = sim.hisparse_miss_rate
    if miss_rate is None:
        miss_rate = hardware.hisparse_miss_rate if hardware.hisparse_miss_rate is not None else DEFAULT_HISPARSE_MISS_RATE
    return EngineConfig(
        model=model, hardware=hardware, sizing=sizing, policy=policy_of(profile),
        max_num_seqs=serve.max_num_seqs or hardware.default_max_num_seqs or DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens=(serve.max_num_batched_tokens or hardware.default_max_num_batched_tokens
                                or DEFAULT_MAX_NUM_BATCHED_TOKENS),
        max_model_len=serve.max_model_len or model.max_position_embeddings,
        tensor_parallel_size=serve.tensor_parallel_size,
        enable_prefix_caching=serve.enable_prefix_caching is not False,
        index_topk=topk, num_speculative_tokens=k, draft_acceptance=acceptance,
        offload_cpu_bytes=offload.cpu_bytes if offload else None,
        offload_prompt_only=offload.offload_prompt_only is not False if offload else True,
        host_pool_bytes=int(hisparse.host_pool_gib * GIB) if hisparse else None,
        hot_rows=hot_rows, hisparse_miss_rate=miss_rate, seed=sim.seed,
        step_time_factor=run_speed_factor(sim, run_seed), reply_history_ratio=hardware.reply_history_ratio or 1.0)
