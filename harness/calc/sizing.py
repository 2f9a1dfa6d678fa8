"""Sizing a launch profile with the calculator: what `plan` prints and warns about."""

from __future__ import annotations

from harness.calc.formulas import (
    GIB,
    GPU_HBM_GB,
    VLLM_PINNED_FRACTION_LIMIT,
    CalcError,
    CalcInputs,
    CalcResult,
    KvDtype,
    Layout,
    calculate,
)
from harness.config import LaunchProfile

# vLLM's default max_num_seqs for an API server on a GPU of H100 class or larger.
VLLM_DEFAULT_MAX_NUM_SEQS = 1024
_BF16_KV_DTYPES = ("auto", "bfloat16", "float16")  # auto stores the model dtype, bf16 for GLM-5.3


def _kv_dtype(profile: LaunchProfile) -> KvDtype:
    dtype = profile.serve.kv_cache_dtype or "auto"
    return "bf16" if dtype in _BF16_KV_DTYPES else "fp8"


def inputs_for_launch(profile: LaunchProfile, seq_len: int, layout: Layout = "vllm") -> CalcInputs:
    """Calculator inputs for a launch profile. The `vllm` layout is the default because a
    deployment stores 656-byte rows; the calculator page uses `unscaled`."""
    serve = profile.serve
    gpu = (profile.gpu or "H200").strip().upper()
    if gpu not in GPU_HBM_GB:
        raise CalcError(f"gpu: the profile's GPU {profile.gpu!r} has no calculator preset; "
                        f"use one of {', '.join(GPU_HBM_GB)}")
    hisparse = profile.kv.hisparse
    offload = profile.kv.offload
    fields: dict[str, object] = {
        "seq_len": seq_len, "gpu": gpu, "tp": serve.tensor_parallel_size, "dp": serve.data_parallel_size or 1,
        "expert_parallel": bool(serve.enable_expert_parallel),
        "max_num_seqs": serve.max_num_seqs or VLLM_DEFAULT_MAX_NUM_SEQS,
        "kv_dtype": _kv_dtype(profile), "layout": layout,
        "indexer_offload_gib": offload.cpu_bytes / GIB if offload is not None else 0.0,
        "host_ram_gib": profile.host_ram_gib,
        "hisparse_enabled": hisparse is not None,
    }
    if serve.gpu_memory_utilization is not None:
        fields["gpu_memory_utilization"] = serve.gpu_memory_utilization
    if profile.speculative is not None:
        fields["speculative_tokens"] = profile.speculative.num_speculative_tokens
    if hisparse is not None:
        fields["host_pool_gib"] = hisparse.host_pool_gib
        if hisparse.device_buffer_size is not None:
            fields["hot_rows"] = hisparse.device_buffer_size
    return CalcInputs.build(**fields)


def sizing_for_launch(profile: LaunchProfile, seq_len: int, layout: Layout = "vllm") -> CalcResult:
    """The calculator's answer for a launch profile at `seq_len` tokens per request.

    GPU from profile.gpu (default H200); TP, DP, expert parallelism, max_num_seqs,
    gpu_memory_utilization and the KV dtype from serve; the host pool from kv.hisparse (a
    profile without HiSparse gets the default pool and predicts the baseline); hot rows from
    kv.hisparse.device_buffer_size or the speculative token count; the offload pool and host
    RAM from the profile.
    """
    return calculate(inputs_for_launch(profile, seq_len, layout))


def pinned_host_gib(profile: LaunchProfile) -> float:
    """Pinned pools the server asks for: a HiSparse pool per DP replica plus the offload pool."""
    total = 0.0
    if profile.kv.hisparse is not None:
        total += profile.kv.hisparse.host_pool_gib * (profile.serve.data_parallel_size or 1)
    if profile.kv.offload is not None:
        total += profile.kv.offload.cpu_bytes / GIB
    return total


def sizing_warnings(profile: LaunchProfile, seq_len: int, concurrencies: list[int],
                    layout: Layout = "vllm") -> list[str]:
    """One line per sizing problem of a deployment whose longest request is `seq_len` tokens:
    points above the predicted concurrency, a HiSparse pool below the minimum, pinned pools
    above 95% of the declared host RAM."""
    result = sizing_for_launch(profile, seq_len, layout)
    mode = "HiSparse" if result.inputs.hisparse_enabled else "baseline (no HiSparse)"
    warnings = []
    if result.predicted_total == 0:
        return [f"{mode} holds no request of {seq_len:,} tokens ({result.layout} layout): the server is expected "
                "to refuse this max_model_len at start-up, and its points to be recorded as does not fit"]
    for parallel in sorted(set(concurrencies)):
        if parallel > result.predicted_total:
            warnings.append(
                f"concurrency {parallel} exceeds the predicted {mode} concurrency {result.predicted_total} "
                f"at {seq_len} tokens ({result.layout} layout): that point measures queueing")
    hisparse = profile.kv.hisparse
    if hisparse is not None and hisparse.host_pool_gib < result.min_host_pool_per_dp_gib:
        warnings.append(
            f"kv.hisparse.host_pool_gib {hisparse.host_pool_gib:g} is below the "
            f"{result.min_host_pool_per_dp_gib} GiB HiSparse needs at {seq_len} tokens "
            f"({result.layout} layout): the host pool limits concurrency to {result.hisparse_total}")
    pinned = pinned_host_gib(profile)
    if profile.host_ram_gib is not None and pinned > VLLM_PINNED_FRACTION_LIMIT * profile.host_ram_gib:
        warnings.append(
            f"pinned pools ({pinned:g} GiB: HiSparse host pool + offload cpu_bytes) exceed "
            f"{VLLM_PINNED_FRACTION_LIMIT:.0%} of host_ram_gib {profile.host_ram_gib:g}: vLLM refuses to start")
    return warnings
