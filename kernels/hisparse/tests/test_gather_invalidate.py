"""gather_plan, gather_compact and invalidate_written_slots: CPU kernel vs oracle, byte for byte.

Hot caches are views into a larger byte slab (block stride above block_size x row bytes,
an offset into the slab), as vLLM binds them, or 2-D staging buffers for gather_plan;
the whole slab is compared, so a write outside the planned rows fails too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hisparse_kernels import oracle
from hypothesis import given, settings
from hypothesis import strategies as st

POISON = -999
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None)


def make_hot(rng, *, paged: bool, num_blocks: int, block_size: int, row_bytes: int, pad_bytes: int,
             offset_bytes: int, dtype=torch.uint8):
    """(slab tensor, hot-cache view of it, oracle layout). Sizes are in bytes."""
    item = torch.tensor([], dtype=dtype).element_size()
    if paged:
        stride = block_size * row_bytes + pad_bytes
        total = offset_bytes + num_blocks * stride
        layout = oracle.CacheLayout(offset_bytes, block_size, stride, row_bytes, num_blocks * block_size)
    else:
        total = offset_bytes + num_blocks * row_bytes
        layout = oracle.CacheLayout(offset_bytes, 1, row_bytes, row_bytes, num_blocks)
    slab = torch.from_numpy(rng.integers(0, 256, size=total, dtype=np.uint8))
    typed = slab.view(dtype)
    if paged:
        view = typed.as_strided((num_blocks, block_size, row_bytes // item),
                                (layout.block_stride_bytes // item, row_bytes // item, 1), offset_bytes // item)
    else:
        view = typed.as_strided((num_blocks, row_bytes // item), (row_bytes // item, 1), offset_bytes // item)
    return slab, view, layout


def distinct_destinations(rng, rows: int, top_k: int, hot_rows: int) -> np.ndarray:
    """Unique destination rows (the resolver never plans two copies into one row), with -1
    and out-of-range entries mixed in."""
    flat = np.full(rows * top_k, -1, np.int32)
    live = min(hot_rows, rows * top_k)
    flat[:live] = rng.permutation(hot_rows)[:live]
    flat[rng.random(flat.size) < 0.05] = hot_rows + 3
    return rng.permutation(flat).reshape(rows, top_k)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 5), top_k=st.integers(1, 70),
       paged=st.booleans(), block_size=st.sampled_from([1, 4, 16]), row_units=st.integers(1, 6),
       pad_units=st.integers(0, 3), offset_units=st.integers(0, 3), with_states=st.booleans(),
       with_attention=st.booleans(), wide=st.booleans())
def test_gather_plan_matches_oracle(ops, seed, rows, top_k, paged, block_size, row_units, pad_units,
                                    offset_units, with_states, with_attention, wide):
    rng = np.random.default_rng(seed)
    dtype = torch.int16 if wide else torch.uint8
    row_bytes = 16 * row_units
    host_rows = int(rng.integers(1, 64))
    num_blocks = -(-rows * top_k // block_size) + 1 if paged else rows * top_k + 2
    slab, hot, layout = make_hot(rng, paged=paged, num_blocks=num_blocks, block_size=block_size if paged else 1,
                                 row_bytes=row_bytes, pad_bytes=16 * pad_units, offset_bytes=16 * offset_units,
                                 dtype=dtype)
    host = rng.integers(0, 256, size=(host_rows, row_bytes), dtype=np.uint8)
    gi = rng.integers(-1, host_rows + 6, size=(rows, top_k), dtype=np.int32)
    dst = distinct_destinations(rng, rows, top_k, layout.rows)
    mask = rng.integers(0, 2, size=(rows, top_k), dtype=np.int32)
    states = rng.integers(-1, 3, size=rows, dtype=np.int32) if with_states else None
    stride = layout.block_size + int(rng.integers(0, 3))
    want_slab = slab.numpy().copy()
    want_att = np.full((rows, top_k), POISON, np.int32) if with_attention else None
    oracle.gather_plan(host=host, hot=want_slab, layout=layout, global_indices=gi, hot_indices=dst,
                       miss_mask=mask, request_state_indices=states, attention_indices=want_att,
                       attention_block_stride=stride)
    att = torch.full((rows, top_k), POISON, dtype=torch.int32) if with_attention else None
    ops.hisparse_gather_plan(torch.from_numpy(host).view(dtype), hot, torch.from_numpy(gi),
                             torch.from_numpy(dst), torch.from_numpy(mask),
                             None if states is None else torch.from_numpy(states), att, stride)
    np.testing.assert_array_equal(slab.numpy(), want_slab)
    if with_attention:
        np.testing.assert_array_equal(att.numpy(), want_att)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 5), top_k=st.integers(1, 70),
       block_size=st.sampled_from([1, 8, 64]), row_units=st.integers(1, 41), pad_units=st.integers(0, 2))
def test_gather_compact_matches_oracle(ops, seed, rows, top_k, block_size, row_units, pad_units):
    rng = np.random.default_rng(seed)
    row_bytes = 16 * row_units
    host_rows = int(rng.integers(1, 64))
    slab, hot, layout = make_hot(rng, paged=True, num_blocks=-(-rows * top_k // block_size) + 1,
                                 block_size=block_size, row_bytes=row_bytes, pad_bytes=16 * pad_units,
                                 offset_bytes=16)
    host = rng.integers(0, 256, size=(host_rows, row_bytes), dtype=np.uint8)
    gi = rng.integers(-1, host_rows + 6, size=(rows, top_k), dtype=np.int32)
    dst = distinct_destinations(rng, rows, top_k, layout.rows)
    counts = rng.integers(-2, top_k + 3, size=rows + 1, dtype=np.int32)  # clamped to [0, top_k]
    want = slab.numpy().copy()
    oracle.gather_compact(host=host, hot=want, layout=layout, miss_global_indices=gi, miss_hot_indices=dst,
                          miss_counts=counts)
    ops.hisparse_gather_compact(torch.from_numpy(host), hot, torch.from_numpy(gi), torch.from_numpy(dst),
                                torch.from_numpy(counts))
    np.testing.assert_array_equal(slab.numpy(), want)


def test_gather_zero_fills_rows_past_the_host_pool(ops):
    host = np.full((4, 32), 7, np.uint8)
    hot = torch.full((2, 2, 32), 9, dtype=torch.uint8)
    gi = np.array([[2, 4, 100, -1]], np.int32)  # copy, zero, zero, skip
    dst = np.array([[0, 1, 2, 3]], np.int32)
    ops.hisparse_gather_compact(torch.from_numpy(host), hot, torch.from_numpy(gi), torch.from_numpy(dst),
                                torch.tensor([4], dtype=torch.int32))
    rows = hot.view(4, 32)
    assert (rows[0] == 7).all() and (rows[1] == 0).all() and (rows[2] == 0).all() and (rows[3] == 9).all()


def test_gather_plan_padding_rows_copy_nothing(ops):
    host = np.full((4, 16), 7, np.uint8)
    hot = torch.zeros(2, 16, dtype=torch.uint8)
    att = torch.full((2, 1), POISON, dtype=torch.int32)
    ops.hisparse_gather_plan(torch.from_numpy(host), hot, torch.tensor([[1], [2]], dtype=torch.int32),
                             torch.tensor([[0], [1]], dtype=torch.int32), torch.ones(2, 1, dtype=torch.int32),
                             torch.tensor([-1, 0], dtype=torch.int32), att, 1)
    assert (hot[0] == 0).all() and (hot[1] == 7).all()
    assert att.flatten().tolist() == [-1, 1]


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), states=st.integers(1, 6), region=st.integers(1, 80),
       requests=st.integers(1, 6), tokens=st.integers(0, 40))
def test_invalidate_matches_oracle(ops, seed, states, region, requests, tokens):
    rng = np.random.default_rng(seed)
    dgi = rng.integers(-1, 30, size=(states, region), dtype=np.int32)  # duplicates on purpose
    state_of = rng.integers(-1, states + 2, size=requests, dtype=np.int32)  # padding and out of range
    req = rng.integers(-2, requests + 2, size=tokens, dtype=np.int32)
    slots = rng.integers(-1, 30, size=tokens, dtype=np.int64)
    want = dgi.copy()
    oracle.invalidate_written_slots(device_global_indices=want, request_state_indices=state_of,
                                    req_id_per_token=req, written_slots=slots)
    got = torch.from_numpy(dgi.copy())
    ops.hisparse_invalidate_written_slots(got, torch.from_numpy(state_of), torch.from_numpy(req),
                                          torch.from_numpy(slots))
    np.testing.assert_array_equal(got.numpy(), want)


def test_invalidate_clears_every_copy_across_requests(ops):
    dgi = torch.tensor([[5, 7, 5, -1], [7, 7, 1, 5], [5, 5, 5, 5]], dtype=torch.int32)
    ops.hisparse_invalidate_written_slots(dgi, torch.tensor([1, 0, -1], dtype=torch.int32),
                                          torch.tensor([0, 1, 2, 9], dtype=torch.int32),
                                          torch.tensor([7, 5, 5, 5], dtype=torch.int64))
    assert dgi.tolist() == [[-1, 7, -1, -1], [-1, -1, 1, 5], [5, 5, 5, 5]]


@pytest.mark.parametrize("bad, message", [
    ("written_int32", "written_slots must be a contiguous 1D int64"),
    ("length", "equal length"),
])
def test_invalidate_refuses_bad_arguments(ops, bad, message):
    slots = torch.tensor([1, 2], dtype=torch.int32 if bad == "written_int32" else torch.int64)
    req = torch.tensor([0] if bad == "length" else [0, 0], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=message):
        ops.hisparse_invalidate_written_slots(torch.zeros(1, 4, dtype=torch.int32),
                                              torch.tensor([0], dtype=torch.int32), req, slots)
