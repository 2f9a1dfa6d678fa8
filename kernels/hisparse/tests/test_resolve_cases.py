"""Resolver edge cases, each checked against the oracle and against its own expected effect."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hisparse_kernels import oracle
from hs_cases import (
    POISON,
    SHARED_STATE_KINDS,
    ResolveState,
    assert_lru_permutations,
    assert_same,
    cold_state,
    make_scenario,
    op_resolve,
    oracle_resolve,
    shared_state_launch,
    topk,
    warm_state,
)


def run_both(ops, s, gi, state):
    want_state, want = oracle_resolve(s, gi, state)
    got_state, got = op_resolve(ops.hisparse_resolve_residency, s, gi, state)
    assert_same(got_state, got, want_state, want, "op vs oracle")
    return got_state, got


def rows_of(s, request):
    start = sum(s.rows_per_request[:request])
    return range(start, start + s.rows_per_request[request])


def test_padding_request_publishes_minus_one_and_touches_no_state(ops):
    rng = np.random.default_rng(1)
    s = make_scenario(rng, top_k=24, rows_per_request=[2, 1, 2], padding_requests=(1,))
    state = warm_state(rng, s)
    got_state, got = run_both(ops, s, topk(rng, s), state)
    for row in rows_of(s, 1):
        assert (got.hot_indices[row] == -1).all() and (got.attention_indices[row] == -1).all()
        assert (got.resolved_global_indices[row] == -1).all()
        assert got.valid_counts[row] == 0 and got.swap_counts[row] == 0
        assert (got.miss_mask[row] == POISON).all(), "padding rows never write miss_mask"
    used = {int(x) for x in s.request_state_indices if x >= 0}
    for free in set(range(s.num_states)) - used:
        np.testing.assert_array_equal(got_state.lru_slots[free], state.lru_slots[free])
        np.testing.assert_array_equal(got_state.device_global_indices[free], state.device_global_indices[free])


def test_cuda_graph_padding_run_after_real_rows_leaves_request_state_alone(ops):
    """FULL-graph padding rows map to request 0 after the real rows and carry no top-k."""
    rng = np.random.default_rng(2)
    s = make_scenario(rng, top_k=16, rows_per_request=[2, 2])
    state = warm_state(rng, s)
    real = topk(rng, s)
    _, reference = oracle_resolve(s, real, state)
    reference_state, _ = oracle_resolve(s, real, state)
    s.request_ids_override = np.array([0, 0, 1, 1, 0, 0], np.int32)
    padded = np.concatenate([real, np.full((2, s.top_k), -1, np.int32)])
    got_state, got = run_both(ops, s, padded, state)
    np.testing.assert_array_equal(got_state.lru_slots, reference_state.lru_slots)
    np.testing.assert_array_equal(got.hot_indices[:4], reference.hot_indices)
    assert (got.hot_indices[4:] == -1).all() and (got.swap_counts[4:] == 0).all()


@pytest.mark.parametrize("kind", SHARED_STATE_KINDS)
def test_one_state_row_one_run(ops, kind):
    """Two runs naming one state row would update its LRU from two GPU blocks at once (vLLM's kernel
    races there: the LRU stops being a permutation). The first run owns the state row; a later run
    resolves as padding, so the launch leaves the state exactly as the launch without it."""
    rng = np.random.default_rng(40 + SHARED_STATE_KINDS.index(kind))
    s, gi, reference, reference_gi, later = shared_state_launch(rng, kind)
    state = warm_state(rng, s)
    got_state, got = run_both(ops, s, gi, state)
    want_state, want = oracle_resolve(reference, reference_gi, state)
    assert_lru_permutations(got_state)
    np.testing.assert_array_equal(got_state.lru_slots, want_state.lru_slots)
    np.testing.assert_array_equal(got_state.device_global_indices, want_state.device_global_indices)
    np.testing.assert_array_equal(got_state.stats, want_state.stats)
    assert (got.hot_indices[later] == -1).all() and (got.swap_counts[later] == 0).all()
    assert (got.valid_counts[later] == 0).all() and (got.miss_mask[later] == POISON).all()
    earlier = [row for row in range(s.num_rows) if row not in later]
    assert earlier == list(range(len(earlier)))  # the later run comes after every other row
    np.testing.assert_array_equal(got.hot_indices[earlier], want.hot_indices[: len(earlier)])
    np.testing.assert_array_equal(got.swap_host_physical_rows[earlier], want.swap_host_physical_rows[: len(earlier)])


def test_null_source_pages_resolve_to_minus_one(ops):
    rng = np.random.default_rng(3)
    s = make_scenario(rng, top_k=32, rows_per_request=[1, 2], null_fraction=1.0)
    state = warm_state(rng, s)
    got_state, got = run_both(ops, s, topk(rng, s, absent=0.0), state)
    assert (got.resolved_global_indices == -1).all() and (got.hot_indices == -1).all()
    assert (got.valid_counts == 0).all() and (got.swap_counts == 0).all()
    np.testing.assert_array_equal(got_state.lru_slots, state.lru_slots)


def test_fully_resident_rows_leave_the_lru_untouched(ops):
    rng = np.random.default_rng(4)
    s = make_scenario(rng, top_k=32, rows_per_request=[2, 1], resident_fraction=1.0, resident_null_block=0)
    s.resident_block_table = rng.integers(1, s.hot_num_blocks, size=s.resident_block_table.shape, dtype=np.int32)
    gi = topk(rng, s, absent=0.0)
    gi[gi >= s.source_block_table.shape[1] * s.source_block_size] = 0  # keep every position in the tables
    state = warm_state(rng, s)
    got_state, got = run_both(ops, s, gi, state)
    assert (got.hot_indices >= 0).all() and (got.swap_counts == 0).all() and (got.miss_mask == 0).all()
    np.testing.assert_array_equal(got_state.lru_slots, state.lru_slots)
    np.testing.assert_array_equal(got_state.device_global_indices, state.device_global_indices)
    np.testing.assert_array_equal(got_state.stats, state.stats)


def test_cold_start_misses_everything_in_lru_order(ops):
    rng = np.random.default_rng(5)
    s = make_scenario(rng, top_k=40, rows_per_request=[1, 1, 1], hot_extra=8)
    gi = topk(rng, s, absent=0.0)
    gi[gi >= s.source_block_table.shape[1] * s.source_block_size] = 1
    gi = np.stack([np.unique(r).tolist() + [-1] * (s.top_k - len(np.unique(r))) for r in gi]).astype(np.int32)
    got_state, got = run_both(ops, s, gi, cold_state(s))
    for request in range(3):
        row = rows_of(s, request)[0]
        valid = int(got.valid_counts[row])
        assert got.swap_counts[row] == valid == got.miss_mask[row].sum()
        state = s.request_state_indices[request]
        expected = np.roll(np.arange(s.hot_size, dtype=np.int16), -valid)
        np.testing.assert_array_equal(got_state.lru_slots[state], expected)


def test_hot_buffer_exactly_full(ops):
    """The union fills every hot slot: all evictables are consumed, none stay stale."""
    rng = np.random.default_rng(6)
    s = make_scenario(rng, top_k=48, rows_per_request=[1], with_source=False)
    assert s.hot_size == s.top_k == s.max_union_rows
    gi = rng.choice(s.host_rows, size=(1, s.top_k), replace=False).astype(np.int32)
    state = warm_state(rng, s)
    state.device_global_indices[np.isin(state.device_global_indices, gi)] = -1
    state.device_global_indices[:, :10] = gi[0, :10]  # ten hits, spread over the LRU
    got_state, got = run_both(ops, s, gi, state)
    owner = s.request_state_indices[0]
    assert set(got_state.device_global_indices[owner].tolist()) == set(gi[0].tolist())
    assert got.swap_counts[0] == s.top_k - 10


def test_repeated_top_k_hits_everything_and_is_a_fixed_point(ops):
    rng = np.random.default_rng(7)
    s = make_scenario(rng, top_k=32, rows_per_request=[3, 1], hot_extra=16)
    gi = topk(rng, s)
    first_state, first = run_both(ops, s, gi, warm_state(rng, s))
    second_state, second = run_both(ops, s, gi, first_state)
    assert (second.swap_counts == 0).all() and (second.miss_mask == 0).all()
    np.testing.assert_array_equal(second.hot_indices, first.hot_indices)
    np.testing.assert_array_equal(second_state.lru_slots, first_state.lru_slots)
    np.testing.assert_array_equal(second_state.device_global_indices, first_state.device_global_indices)
    assert second_state.stats[0] - first_state.stats[0] == (second.resolved_global_indices >= 0).sum()
    assert second_state.stats[1] == first_state.stats[1]


def test_out_of_range_lru_slots_resolve_invalid_without_writes(ops):
    rng = np.random.default_rng(8)
    s = make_scenario(rng, top_k=16, rows_per_request=[1, 2])
    state = cold_state(s)
    for owner in range(s.num_states):  # the oldest entries are corrupt: the first misses get them
        state.lru_slots[owner, :3] = [s.hot_size + 5, -7, 32767]
    got_state, got = run_both(ops, s, topk(rng, s), state)
    for request in range(2):
        first_row = rows_of(s, request)[0]
        assert (got.swap_device_physical_rows[first_row, :3] == -1).all()
        invalid = (got.resolved_global_indices[first_row] >= 0) & (got.hot_indices[first_row] == -1)
        assert invalid.sum() >= 1 and (got.miss_mask[first_row][invalid] == 0).all()
    assert (got_state.device_global_indices[:, :3] == -1).all()


def test_short_host_pool_drops_rows_past_its_end(ops):
    rng = np.random.default_rng(9)
    s = make_scenario(rng, top_k=32, rows_per_request=[2, 2], short_host=True)
    _, got = run_both(ops, s, topk(rng, s, absent=0.0), warm_state(rng, s))
    assert (got.resolved_global_indices < s.host_rows).all()
    assert (got.resolved_global_indices == -1).sum() > 0


def test_mtp_union_spills_the_swap_plan_into_later_rows(ops):
    rng = np.random.default_rng(10)
    s = make_scenario(rng, top_k=20, rows_per_request=[4, 1])
    got_state, got = run_both(ops, s, topk(rng, s, overlap=0.2, absent=0.0), cold_state(s))
    first = rows_of(s, 0)
    total = int(got.swap_counts[list(first)].sum())
    assert total > s.top_k and got.swap_counts[first[0]] == s.top_k and got.swap_counts[first[1]] > 0
    assert int(got.miss_mask[list(first)].sum()) == total


def test_stats_accumulate(ops):
    rng = np.random.default_rng(11)
    s = make_scenario(rng, top_k=16, rows_per_request=[2, 1])
    state = warm_state(rng, s)
    state.stats[:] = [5, 7]
    got_state, got = run_both(ops, s, topk(rng, s), state)
    assert got_state.stats[1] == 7 + int(got.miss_mask.sum())
    assert got_state.stats[0] > 5


def test_union_above_max_union_rows_is_refused(ops):
    rng = np.random.default_rng(12)
    s = make_scenario(rng, top_k=16, rows_per_request=[3], hot_extra=8)
    gi = topk(rng, s, overlap=0.0, absent=0.0)
    s.max_union_rows = 20
    with pytest.raises(oracle.UnionOverflow):
        oracle_resolve(s, gi, cold_state(s))
    with pytest.raises(RuntimeError, match="max_union_rows=20"):
        op_resolve(ops.hisparse_resolve_residency, s, gi, cold_state(s))


def test_optional_outputs_may_be_omitted(ops):
    rng = np.random.default_rng(13)
    s = make_scenario(rng, top_k=16, rows_per_request=[2, 1])
    gi = topk(rng, s)
    state = warm_state(rng, s)
    want = state.copy()
    hot_out = np.full(gi.shape, POISON, np.int32)
    oracle.resolve_residency(host_rows=s.host_rows, hot_block_size=s.hot_block_size,
                             hot_block_table=s.hot_block_table, global_indices=gi, hot_indices=hot_out,
                             device_global_indices=want.device_global_indices, lru_slots=want.lru_slots,
                             request_state_indices=s.request_state_indices, region_stride=s.hot_size,
                             max_union_rows=s.max_union_rows, request_ids=s.request_ids,
                             source_block_table=s.source_block_table, source_block_size=s.source_block_size)
    t = {k: torch.from_numpy(v.copy()) for k, v in dict(
        dgi=state.device_global_indices, lru=state.lru_slots, hot=np.full(gi.shape, POISON, np.int32)).items()}
    ops.hisparse_resolve_residency(
        torch.zeros(s.host_rows, 16, dtype=torch.uint8),
        torch.zeros(s.hot_num_blocks, s.hot_block_size, 16, dtype=torch.uint8),
        torch.from_numpy(s.hot_block_table), torch.from_numpy(gi), t["hot"], t["dgi"], t["lru"],
        torch.from_numpy(s.request_state_indices), s.hot_size, s.max_union_rows,
        request_ids=torch.from_numpy(s.request_ids), source_block_table=torch.from_numpy(s.source_block_table),
        source_block_size=s.source_block_size)
    np.testing.assert_array_equal(t["hot"].numpy(), hot_out)
    np.testing.assert_array_equal(t["lru"].numpy(), want.lru_slots)
    np.testing.assert_array_equal(t["dgi"].numpy(), want.device_global_indices)


def test_strided_attention_and_valid_count_views(ops):
    """vLLM passes row-strided attention indices and a strided valid-count column."""
    rng = np.random.default_rng(14)
    s = make_scenario(rng, top_k=12, rows_per_request=[1, 2])
    gi = topk(rng, s)
    want_state, want = oracle_resolve(s, gi, warm_state(np.random.default_rng(0), s))
    state = warm_state(np.random.default_rng(0), s)
    wide = torch.full((s.num_rows, s.top_k + 5), POISON, dtype=torch.int32)
    counts = torch.full((s.num_rows, 2), POISON, dtype=torch.int32)
    hot = torch.full(gi.shape, POISON, dtype=torch.int32)
    dgi, lru = torch.from_numpy(state.device_global_indices), torch.from_numpy(state.lru_slots)
    ops.hisparse_resolve_residency(
        torch.zeros(s.host_rows, 16, dtype=torch.uint8),
        torch.zeros(s.hot_num_blocks, s.hot_block_size, 16, dtype=torch.uint8),
        torch.from_numpy(s.hot_block_table), torch.from_numpy(gi), hot, dgi, lru,
        torch.from_numpy(s.request_state_indices), s.hot_size, s.max_union_rows,
        attention_indices=wide[:, : s.top_k], attention_block_stride=s.attention_block_stride,
        request_ids=torch.from_numpy(s.request_ids), source_block_table=torch.from_numpy(s.source_block_table),
        source_block_size=s.source_block_size, valid_counts=counts[:, 1])
    np.testing.assert_array_equal(wide[:, : s.top_k].numpy(), want.attention_indices)
    assert (wide[:, s.top_k:] == POISON).all() and (counts[:, 0] == POISON).all()
    np.testing.assert_array_equal(counts[:, 1].numpy(), want.valid_counts)
    np.testing.assert_array_equal(lru.numpy(), want_state.lru_slots)


@pytest.mark.parametrize("change, message", [
    (dict(region_stride=7), "region_stride"),
    (dict(max_union_rows=10_000), "max_union_rows"),
    (dict(lru_dtype=torch.int32), "lru_slots must be int16"),
    (dict(row_bytes=8), "multiples of 16"),
])
def test_contract_violations_are_refused(ops, change, message):
    rng = np.random.default_rng(15)
    s = make_scenario(rng, top_k=8, rows_per_request=[1])
    state = ResolveState(np.full((s.num_states, s.hot_size), -1, np.int32),
                         np.tile(np.arange(s.hot_size, dtype=np.int16), (s.num_states, 1)))
    row_bytes = change.get("row_bytes", 16)
    with pytest.raises(RuntimeError, match=message):
        ops.hisparse_resolve_residency(
            torch.zeros(s.host_rows, row_bytes, dtype=torch.uint8),
            torch.zeros(s.hot_num_blocks, s.hot_block_size, row_bytes, dtype=torch.uint8),
            torch.from_numpy(s.hot_block_table), torch.from_numpy(topk(rng, s)),
            torch.zeros((1, s.top_k), dtype=torch.int32), torch.from_numpy(state.device_global_indices),
            torch.from_numpy(state.lru_slots).to(change.get("lru_dtype", torch.int16)),
            torch.from_numpy(s.request_state_indices), change.get("region_stride", s.hot_size),
            change.get("max_union_rows", s.max_union_rows), request_ids=torch.from_numpy(s.request_ids),
            source_block_table=torch.from_numpy(s.source_block_table), source_block_size=s.source_block_size)
