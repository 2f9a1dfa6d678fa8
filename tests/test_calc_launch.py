"""Sizing launch profiles: the inputs `plan` derives and the three warnings it prints."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.calc import CalcError, inputs_for_launch, pinned_host_gib, sizing_for_launch, sizing_warnings
from harness.config import LaunchProfile, load_launch

# The blog's Hybrid HiSparse arm (docs/facts.md §1).
BLOG_ARM = {
    "engine": "vllm",
    "build": "neuralmagic/vllm@e8ef1e07bd",
    "gpu": "H200",
    "host_ram_gib": 2048,
    "serve": {"model": "zai-org/GLM-5.3", "tensor_parallel_size": 8, "kv_cache_dtype": "fp8",
              "gpu_memory_utilization": 0.92, "max_model_len": 142_000, "max_num_batched_tokens": 32_768,
              "max_num_seqs": 256},
    "kv": {"hisparse": {"host_pool_gib": 384},
           "offload": {"spec": "TieringOffloadingSpec", "cpu_bytes": 137_438_953_472}},
    "speculative": {"method": "mtp", "num_speculative_tokens": 3},
}
WORKLOAD_LONGEST = 74_160 + 12 * 753 + 13 * 220  # first turn + later turns + outputs = 86,056


def profile(tmp_path: Path, **changes) -> LaunchProfile:
    data = {**BLOG_ARM, **changes}
    path = tmp_path / "arm.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_launch(path).profile


def test_blog_arm_inputs(tmp_path):
    inputs = inputs_for_launch(profile(tmp_path), 142_000)
    assert (inputs.gpu, inputs.tp, inputs.dp, inputs.max_num_seqs) == ("H200", 8, 1, 256)
    assert inputs.kv_dtype == "fp8" and inputs.layout == "vllm"
    assert inputs.effective_hot_rows == 10_240  # MTP3: (3 + 2) x 2048
    assert inputs.host_pool_gib == 384 and inputs.indexer_offload_gib == 128
    assert inputs.host_ram_gib == 2048 and inputs.hisparse_enabled
    assert not inputs.expert_parallel  # the blog's command has no --enable-expert-parallel


def test_blog_arm_prediction_both_layouts(tmp_path):
    arm = profile(tmp_path)
    blog = sizing_for_launch(arm, 142_000, layout="unscaled")
    assert (blog.baseline_total, blog.hisparse_total, blog.predicted_total) == (2, 18, 18)
    assert blog.hisparse_limiter == "gpu" and blog.min_host_pool_per_dp_gib == 107
    real = sizing_for_launch(arm, 142_000)
    assert real.layout == "vllm"
    assert (real.baseline_total, real.hisparse_total) == (2, 16)
    workload = sizing_for_launch(arm, WORKLOAD_LONGEST)
    assert workload.hisparse_total == 19
    assert pinned_host_gib(arm) == 512


def test_blog_arm_warns_only_about_queueing_points(tmp_path):
    warnings = sizing_warnings(profile(tmp_path), 142_000, [1, 8, 16, 24, 32])
    assert len(warnings) == 2
    assert all("measures queueing" in w for w in warnings)
    assert "concurrency 24 exceeds the predicted HiSparse concurrency 16" in warnings[0]
    assert sizing_warnings(profile(tmp_path), 142_000, [1, 8, 16], layout="unscaled") == []


def test_host_pool_below_minimum_warns(tmp_path):
    small = profile(tmp_path, kv={"hisparse": {"host_pool_gib": 50}})
    warnings = sizing_warnings(small, 142_000, [1])
    assert len(warnings) == 1
    assert "host_pool_gib 50 is below the 109 GiB" in warnings[0]
    assert sizing_for_launch(small, 142_000).hisparse_limiter == "host"


def test_pinned_pools_above_95_percent_of_host_ram_warn(tmp_path):
    tight = profile(tmp_path, host_ram_gib=530)  # 512 GiB pinned > 0.95 x 530 = 503.5
    warnings = sizing_warnings(tight, 142_000, [1])
    assert len(warnings) == 1 and "vLLM refuses to start" in warnings[0] and "512 GiB" in warnings[0]
    assert sizing_warnings(profile(tmp_path, host_ram_gib=540), 142_000, [1]) == []
    undeclared = {k: v for k, v in BLOG_ARM.items() if k != "host_ram_gib"}
    path = tmp_path / "nohost.yaml"
    path.write_text(yaml.safe_dump(undeclared))
    assert sizing_warnings(load_launch(path).profile, 142_000, [1]) == []


def test_offload_baseline_arm_predicts_baseline(tmp_path):
    offload = profile(tmp_path, kv={"offload": {"spec": "TieringOffloadingSpec", "cpu_bytes": "512GiB"}})
    result = sizing_for_launch(offload, 142_000)
    assert not result.inputs.hisparse_enabled
    assert result.predicted_total == result.baseline_total == 2
    assert result.physical_host_gib == 512
    warnings = sizing_warnings(offload, 142_000, [1, 2, 8])
    assert warnings == [
        "concurrency 8 exceeds the predicted baseline (no HiSparse) concurrency 2 at 142000 tokens "
        "(vllm layout): that point measures queueing"]


def test_release_profile_device_buffer_dp_bf16_defaults(tmp_path):
    release = profile(tmp_path, build="==0.33.0", gpu=None, speculative=None,
                      serve={"model": "zai-org/GLM-5.3", "tensor_parallel_size": 4, "data_parallel_size": 2,
                             "enable_expert_parallel": True},
                      kv={"hisparse": {"host_pool_gib": 200, "device_buffer_size": 8192}})
    inputs = inputs_for_launch(release, 81_920)
    assert inputs.gpu == "H200" and inputs.dp == 2 and inputs.expert_parallel
    assert inputs.effective_hot_rows == 8192
    assert inputs.kv_dtype == "bf16"  # kv_cache_dtype unset = auto = the model's bf16
    assert inputs.max_num_seqs == 1024 and inputs.gpu_memory_utilization == 0.92
    result = sizing_for_launch(release, 81_920)
    assert result.gpus == 8 and result.host_pool_copies == 2
    assert pinned_host_gib(release) == 400


def test_unknown_profile_gpu_is_one_line(tmp_path):
    with pytest.raises(CalcError, match="no calculator preset") as info:
        sizing_for_launch(profile(tmp_path, gpu="MI300X"), 81_920)
    assert "\n" not in str(info.value)
