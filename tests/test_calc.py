"""The concurrency calculator library against docs/facts.md §4's worked values and its variants."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from harness.calc import (
    BLOCK_BYTES,
    CalcError,
    CalcInputs,
    CalcResult,
    calculate,
    calculate_range,
    find_crossover,
)
from harness.errors import HarnessError

GIB = 2**30


def calc(**fields) -> CalcResult:
    return calculate(CalcInputs.build(**fields))


# ---------------------------------------------------------------- docs/facts.md §4, exactly

def test_kv_hbm_h200_tp8_is_17_8_gib():
    result = calc()
    assert result.kv_hbm_per_gpu_gib == 17.8
    assert result.hbm_per_gpu_gib == 131.32
    assert result.weights_per_gpu_gib == pytest.approx(19.556 / 8 + 684.167 / 8, abs=1e-3)


@pytest.mark.parametrize(("seq_len", "hot_rows", "baseline", "hisparse", "min_pool_gib"), [
    (81_920, None, 4, 39, 134),
    (81_920, 10_240, 4, 22, None),
    (142_000, None, 2, 29, 173),
    (142_000, 10_240, 2, 18, None),
])
def test_worked_values_default_host_pool(seq_len, hot_rows, baseline, hisparse, min_pool_gib):
    result = calc(seq_len=seq_len, hot_rows=hot_rows)
    assert (result.baseline_total, result.hisparse_total) == (baseline, hisparse)
    if min_pool_gib is not None:
        assert result.min_host_pool_per_dp_gib == min_pool_gib
    # the page's default pool is the minimum, so its default answers are never host-limited
    assert result.host_pool_is_default
    assert result.host_pool_gib == max(16, result.min_host_pool_per_dp_gib)
    assert result.hisparse_limiter == "gpu"
    assert result.layout == "unscaled"


def test_host_pool_fixed_at_134_gib_limits_142000_tokens_to_22():
    result = calc(seq_len=142_000, host_pool_gib=134)
    assert (result.baseline_total, result.hisparse_total) == (2, 22)
    assert result.hisparse_limiter == "host"
    assert result.host_limit_per_dp == 22 < result.hisparse_gpu_limit_per_dp == 29
    assert not result.host_pool_is_default


def test_worked_values_follow_from_the_formulas():
    # 81,920 tokens = 1,280 blocks; KV 17.8 GiB.
    kv = 17.8 * GIB
    assert math.floor(kv / 3_052_800) // 1280 == 4
    assert math.floor(kv / 184_320) // (1280 + 20 * 64 + 20 * 2) == 39
    assert math.ceil(39 * 1280 * 2_875_392 / GIB) == 134
    result = calc()
    assert result.blocks_per_request == 1280
    assert result.multiplier == pytest.approx(39 / 4)


def test_speculative_tokens_set_hot_rows_and_explicit_rows_win():
    assert calc(speculative_tokens=3).hot_rows == 10_240
    assert calc(speculative_tokens=3).hisparse_total == 22
    assert calc(speculative_tokens=1).hot_rows == 6_144
    assert calc().hot_rows == 4_096
    assert calc(speculative_tokens=3, hot_rows=4096).hot_rows == 4096
    assert calc(seq_len=142_000, speculative_tokens=3).hisparse_total == 18


# ---------------------------------------------------------------- variants

def test_bf16_uses_bf16_blocks():
    result = calc(kv_dtype="bf16")
    assert result.block_bytes == {"baseline": 5_928_192, "hisparse_gpu": 294_912, "host": 5_750_784}
    kv = 17.8 * GIB
    assert result.baseline_total == math.floor(kv / 5_928_192) // 1280 == 2
    assert result.hisparse_total == math.floor(kv / 294_912) // 2600 == 24
    assert result.min_host_pool_per_dp_gib == math.ceil(24 * 1280 * 5_750_784 / GIB) == 165
    assert calc(kv_dtype="bfloat16").hisparse_total == 24


def test_dp2_with_expert_parallel_shards_experts_over_16_gpus():
    result = calc(dp=2)
    assert result.gpus == 16 and result.dp == 2
    assert result.weights_per_gpu_gib == pytest.approx(19.556 / 8 + 684.167 / 16, abs=1e-3)
    assert result.kv_hbm_per_gpu_gib == 60.6
    assert (result.baseline_per_dp, result.hisparse_per_dp) == (16, 135)
    assert (result.baseline_total, result.hisparse_total) == (32, 270)
    assert result.host_pool_copies == 2
    assert result.physical_host_gib == result.host_pool_gib * 2 + 128
    implied, explicit = calc(gpus=16), calc(gpus=16, dp=2)
    assert implied.model_dump(exclude={"inputs"}) == explicit.model_dump(exclude={"inputs"})
    assert calc(gpus=16).hisparse_total == 270


def test_expert_parallel_off_replicates_experts_per_dp_replica():
    result = calc(dp=2, expert_parallel=False)
    assert result.kv_hbm_per_gpu_gib == 17.8  # same per-GPU weights as DP1
    assert (result.baseline_total, result.hisparse_total) == (8, 78)
    assert result.min_host_pool_per_dp_gib == 134
    assert calc(expert_parallel=False).hisparse_total == 39  # with DP1, EP changes nothing


def test_vllm_layout_uses_656_byte_rows():
    result = calc(layout="vllm")
    assert result.layout == "vllm" and "656-byte" in result.layout_description
    assert result.block_bytes == {"baseline": 3_452_160, "hisparse_gpu": 209_920, "host": 3_274_752}
    kv = 17.8 * GIB
    assert result.baseline_total == math.floor(kv / 3_452_160) // 1280 == 4
    assert result.hisparse_total == math.floor(kv / 209_920) // 2600 == 35
    assert result.min_host_pool_per_dp_gib == 137
    long = calc(layout="vllm", seq_len=142_000, speculative_tokens=3)
    assert (long.baseline_total, long.hisparse_total) == (2, 16)
    assert "576-byte" in calc().layout_description


def test_vllm_layout_rows_match_the_656_byte_row():
    fp8 = BLOCK_BYTES[("vllm", "fp8")]
    assert fp8.host == 64 * 78 * 656
    assert fp8.baseline == 64 * (78 * 656 + 21 * 132)
    assert BLOCK_BYTES[("unscaled", "fp8")].host == 64 * 78 * 576


def test_gpu_presets_and_custom_hbm():
    assert calc(gpu="B200").hbm_per_gpu_gib == round(180e9 / GIB, 2) == 167.64
    assert calc(gpu="b300").hbm_per_gpu_gib == round(288e9 / GIB, 2) == 268.22
    assert calc(gpu="B200").kv_hbm_per_gpu_gib == 51.3
    custom = calc(hbm_gib=141e9 / GIB)
    assert custom.gpu == "custom" and custom.hisparse_total == 39


def test_kv_hbm_override_is_used_as_given():
    result = calc(kv_hbm_gib=17.8)
    assert result.hisparse_total == 39
    assert calc(kv_hbm_gib=40).hisparse_total > 39


def test_model_that_does_not_fit_sizes_nothing():
    result = calc(tp=1)
    assert not result.model_fits
    assert result.kv_hbm_per_gpu_gib == 0
    assert result.baseline_total == result.hisparse_total == 0
    assert any("does not fit" in note for note in result.notes)


def test_host_ram_caps_the_pool_and_notes_vllm_refusal():
    result = calc(host_ram_gib=100)
    assert result.effective_host_pool_gib == 100
    assert result.hisparse_limiter == "host" and result.hisparse_total < 39
    assert any("caps the HiSparse pool" in n for n in result.notes)
    assert any("refuses to start" in n for n in result.notes)
    assert not calc(host_ram_gib=4096).notes


def test_no_tp_host_sharing_multiplies_physical_host_ram():
    shared, per_rank = calc(), calc(tp_host_sharing=False)
    assert per_rank.hisparse_total == shared.hisparse_total
    assert per_rank.host_pool_copies == 8
    assert per_rank.physical_host_gib == 134 * 8 + 128


def test_hisparse_disabled_predicts_the_baseline():
    result = calc(hisparse_enabled=False)
    assert result.predicted_total == result.baseline_total == 4
    assert result.physical_host_gib == 128
    assert calc().predicted_total == 39


def test_enabling_length_has_no_multiplier():
    result = calc(seq_len=1_048_576)
    assert result.baseline_total == 0 and result.hisparse_total == 5
    assert result.multiplier is None
    assert any("HiSparse enables this length" in n for n in result.notes)


def test_result_is_pure_and_json_round_trips():
    inputs = CalcInputs.build(seq_len=142_000, dp=2)
    first, second = calculate(inputs), calculate(inputs)
    assert first == second
    data = json.loads(first.model_dump_json())
    assert data["hisparse_total"] == first.hisparse_total
    assert data["layout"] == "unscaled"
    assert CalcResult.model_validate(data) == first


# ---------------------------------------------------------------- range and crossover

def test_calculate_range_keeps_other_inputs():
    results = calculate_range(CalcInputs.build(speculative_tokens=3), [81_920, 142_000])
    assert [r.hisparse_total for r in results] == [22, 18]
    assert [r.inputs.seq_len for r in results] == [81_920, 142_000]
    with pytest.raises(CalcError):
        calculate_range(CalcInputs(), [0])


@pytest.mark.parametrize("fields", [{}, {"speculative_tokens": 3}, {"layout": "vllm", "kv_dtype": "bf16"},
                                    {"dp": 4, "hot_rows": 8192}])
def test_crossover_is_the_first_winning_length(fields):
    inputs = CalcInputs.build(**fields)
    crossover = find_crossover(inputs, 1024, 1_048_576)
    assert crossover is not None and crossover > 1024
    at, before = calculate_range(inputs, [crossover, crossover - 1])
    assert at.hisparse_total > at.baseline_total
    assert before.hisparse_total == before.baseline_total
    # every shorter length (one per 64-token block) loses or ties
    shorter = calculate_range(inputs, list(range(1024, crossover, 64)))
    assert all(r.hisparse_total == r.baseline_total for r in shorter)


def test_crossover_at_range_start_and_none():
    assert find_crossover(CalcInputs(), 8192, 1_048_576) == 8192  # 4,096 hot rows win from ~5.4K tokens
    # max_num_seqs caps both modes alike at short lengths
    assert find_crossover(CalcInputs.build(max_num_seqs=1), 64, 100_000) is None
    with pytest.raises(CalcError, match="empty"):
        find_crossover(CalcInputs(), 2000, 1000)


# ---------------------------------------------------------------- bad inputs

@pytest.mark.parametrize(("fields", "needle"), [
    ({"seq_len": 0}, "seq_len"),
    ({"seq_len": -5}, "seq_len"),
    ({"tp": 0}, "tp"),
    ({"dp": -1}, "dp"),
    ({"host_pool_gib": 0}, "host_pool_gib"),
    ({"hbm_gib": -1.0}, "hbm_gib"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"gpus": 8, "tp": 3}, "does not divide 8 GPUs"),
    ({"gpus": 16, "tp": 8, "dp": 4}, "not the 16 GPUs"),
    ({"gpu": "A100"}, "unknown GPU 'A100'"),
    ({"gpu": "H200", "hbm_gib": 100.0}, "not both"),
    ({"kv_dtype": "int4"}, "kv_dtype"),
    ({"layout": "sglang"}, "layout"),
    ({"hot_rows": 40_000}, "hot_rows"),
    ({"seq_len": "81920"}, "seq_len"),
    ({"turbo": True}, "turbo: unknown input"),
])
def test_bad_inputs_give_one_line_errors(fields, needle):
    with pytest.raises(CalcError) as info:
        CalcInputs.build(**fields)
    message = str(info.value)
    assert needle in message and "\n" not in message
    assert isinstance(info.value, HarnessError)
    with pytest.raises(ValidationError):  # a ValueError for callers that construct directly
        CalcInputs(**fields)


# ---------------------------------------------------------------- invariants

@settings(max_examples=60, deadline=None)
@given(seq_len=st.integers(1, 2_000_000), tp=st.sampled_from([1, 2, 4, 8]), dp=st.integers(1, 8),
       ep=st.booleans(), gpu=st.sampled_from(["H200", "B200", "B300"]),
       dtype=st.sampled_from(["fp8", "bf16"]), layout=st.sampled_from(["unscaled", "vllm"]),
       hot_rows=st.integers(64, 32_768), max_num_seqs=st.integers(1, 2048))
def test_invariants(seq_len, tp, dp, ep, gpu, dtype, layout, hot_rows, max_num_seqs):
    r = calc(seq_len=seq_len, tp=tp, dp=dp, expert_parallel=ep, gpu=gpu, kv_dtype=dtype, layout=layout,
             hot_rows=hot_rows, max_num_seqs=max_num_seqs)
    assert r.hisparse_total >= r.baseline_total >= 0
    assert r.baseline_total == r.baseline_per_dp * dp and r.hisparse_total == r.hisparse_per_dp * dp
    assert r.hisparse_per_dp <= max(max_num_seqs, r.baseline_per_dp)
    assert r.baseline_per_dp <= max_num_seqs
    if r.min_host_pool_per_dp_gib <= 4096:  # the default pool is the minimum unless clamped
        assert r.hisparse_limiter != "host"
    assert round(r.kv_hbm_per_gpu_gib, 1) == r.kv_hbm_per_gpu_gib
