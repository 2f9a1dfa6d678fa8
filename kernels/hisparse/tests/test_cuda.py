"""CUDA kernels: the same differential cases on the GPU, and bit for bit against vLLM's own ops.

Skipped, with the reason shown, where there is no GPU or the module was built CPU-only;
HISPARSE_REQUIRE_GPU=1 turns the skip into a failure (the GPU check script sets it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import hisparse_kernels as hk
import numpy as np
import pytest
import torch
from hisparse_kernels import oracle
from hs_cases import (
    POISON,
    SHARED_STATE_KINDS,
    ResolveOutputs,
    assert_lru_permutations,
    assert_same,
    cold_state,
    make_scenario,
    op_resolve,
    oracle_resolve,
    shared_state_launch,
    topk,
)
from hs_cases import warm_state as warm
from hypothesis import given, settings
from hypothesis import strategies as st


def _why_no_gpu() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    hk.load(announce_line=False)
    if hk.identity().built_for != "cuda":
        return "hisparse_kernels was built CPU-only (set HISPARSE_BUILD_CUDA=1)"
    return None


@pytest.fixture(scope="module")
def cuda_ops():
    reason = _why_no_gpu()
    if reason:
        if os.environ.get("HISPARSE_REQUIRE_GPU") == "1":
            pytest.fail(f"HISPARSE_REQUIRE_GPU=1 but {reason}")
        pytest.skip(reason)
    return torch.ops.hisparse_kernels


def _vllm_cache_ops():
    """vLLM's own _C_cache_ops kernels, where a CUDA vLLM is importable (no plugins loaded)."""
    os.environ["VLLM_PLUGINS"] = ""  # an allow-list naming none: the bundled plugin must not take over
    try:
        import vllm._custom_ops  # noqa: F401  (loads vLLM's kernel libraries)
    except Exception as exc:
        return None, f"vLLM not importable: {exc}"
    ops = torch.ops._C_cache_ops
    if not all(hasattr(ops, name) for name in hk.OP_NAMES):
        return None, "this vLLM has no HiSparse ops"
    return ops, None


@pytest.fixture(scope="module")
def vllm_ops(cuda_ops):
    ops, reason = _vllm_cache_ops()
    if ops is None:
        pytest.skip(reason)
    return ops


def multi_step(op, s, state, rng, steps=3, device="cuda", overlap=0.7):
    previous = None
    for step in range(steps):
        gi = topk(rng, s, previous, overlap=overlap)
        want_state, want = oracle_resolve(s, gi, state)
        got_state, got = op_resolve(op, s, gi, state, device=device)
        assert_same(got_state, got, want_state, want, f"step {step}")
        state, previous = want_state, gi


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**32 - 1), top_k=st.integers(1, 80), rows=st.lists(st.integers(1, 4), min_size=1,
       max_size=6), hot_extra=st.integers(0, 64), resident=st.sampled_from([0.0, 0.3]), pad=st.booleans(),
       overlap=st.floats(0.0, 1.0))
def test_resolve_random_matches_oracle(cuda_ops, seed, top_k, rows, hot_extra, resident, pad, overlap):
    rng = np.random.default_rng(seed)
    s = make_scenario(rng, top_k=top_k, rows_per_request=rows, hot_extra=hot_extra, resident_fraction=resident,
                      null_fraction=0.1, padding_requests=(0,) if pad else (), short_host=seed % 3 == 0)
    multi_step(cuda_ops.hisparse_resolve_residency, s, warm(rng, s), rng, overlap=overlap)


@pytest.mark.parametrize("rows, hot_extra, steps", [
    ([1], 2048, 3), ([4], 2048, 3), ([1, 4, 1, 2], 0, 3),
    ([1] * 256, 2048, 2),  # 256 rows, 4,096 hot rows each
    ([4] * 64, 2048, 2),  # 256 rows of MTP3: 64 unions of four rows, 10,240 hot rows each
], ids=["1x4096", "mtp3x10240", "mixed", "256-rows", "256-rows-mtp3"])
def test_resolve_production_shapes(cuda_ops, rows, hot_extra, steps):
    """top-k 2,048 with 4,096 (no MTP) and 10,240 (MTP3: the union of four rows) hot rows, up to
    256 launch rows: many tiles of 1,024 threads, the roomy union table in opt-in shared memory."""
    rng = np.random.default_rng(len(rows) * 10 + hot_extra)
    s = make_scenario(rng, top_k=2048, rows_per_request=rows, hot_extra=hot_extra, hot_block_size=64,
                      source_block_size=64, null_fraction=0.02)
    assert s.hot_size == 2048 * max(rows) + hot_extra
    multi_step(cuda_ops.hisparse_resolve_residency, s, cold_state(s), rng, steps=steps)


def test_cuda_graph_padding_run_after_real_rows(cuda_ops):
    """FULL-graph padding rows map to request 0 after the real rows and carry no top-k."""
    rng = np.random.default_rng(2)
    s = make_scenario(rng, top_k=256, rows_per_request=[2, 2], hot_block_size=64, source_block_size=64)
    state = warm(rng, s)
    real = topk(rng, s)
    reference_state, reference = oracle_resolve(s, real, state)
    s.request_ids_override = np.array([0, 0, 1, 1, 0, 0], np.int32)
    padded = np.concatenate([real, np.full((2, s.top_k), -1, np.int32)])
    want_state, want = oracle_resolve(s, padded, state)
    got_state, got = op_resolve(cuda_ops.hisparse_resolve_residency, s, padded, state, device="cuda")
    assert_same(got_state, got, want_state, want, "padding after real rows")
    np.testing.assert_array_equal(got_state.lru_slots, reference_state.lru_slots)
    np.testing.assert_array_equal(got.hot_indices[:4], reference.hot_indices)
    assert (got.hot_indices[4:] == -1).all() and (got.swap_counts[4:] == 0).all()


@pytest.mark.parametrize("kind", SHARED_STATE_KINDS)
def test_one_state_row_one_run(cuda_ops, kind):
    """Two runs naming one state row (padding rows with a valid top-k, a duplicate state index, a
    request split in two runs) would be resolved by two blocks at once; the first run owns the state
    and the result is the oracle's every time, with each LRU a permutation."""
    for trial in range(5):
        rng = np.random.default_rng(1000 * trial + SHARED_STATE_KINDS.index(kind))
        s, gi, reference, reference_gi, later = shared_state_launch(rng, kind, top_k=512, hot_block_size=64,
                                                                   source_block_size=64)
        state = warm(rng, s)
        want_state, want = oracle_resolve(s, gi, state)
        got_state, got = op_resolve(cuda_ops.hisparse_resolve_residency, s, gi, state, device="cuda")
        assert_same(got_state, got, want_state, want, f"{kind}, trial {trial}")
        assert_lru_permutations(got_state)
        alone_state, _ = oracle_resolve(reference, reference_gi, state)
        np.testing.assert_array_equal(got_state.lru_slots, alone_state.lru_slots)
        assert (got.hot_indices[later] == -1).all() and (got.miss_mask[later] == POISON).all()


def test_out_of_range_lru_slots(cuda_ops):
    rng = np.random.default_rng(8)
    s = make_scenario(rng, top_k=64, rows_per_request=[1, 3])
    state = cold_state(s)
    state.lru_slots[:, :3] = [s.hot_size + 5, -7, 32767]
    gi = topk(rng, s)
    want_state, want = oracle_resolve(s, gi, state)
    got_state, got = op_resolve(cuda_ops.hisparse_resolve_residency, s, gi, state, device="cuda")
    assert_same(got_state, got, want_state, want, "corrupt LRU")


@pytest.mark.parametrize("paged", [True, False])
def test_gathers_match_oracle(cuda_ops, paged):
    rng = np.random.default_rng(int(paged))
    rows, top_k, row_bytes, block = 3, 300, 656, 64
    host = rng.integers(0, 256, size=(500, row_bytes), dtype=np.uint8)
    blocks = -(-rows * top_k // block) + 2
    stride = block * row_bytes + 64 if paged else row_bytes
    layout = oracle.CacheLayout(0, block if paged else 1, stride, row_bytes, blocks * block)
    slab = rng.integers(0, 256, size=blocks * (stride if paged else block * row_bytes), dtype=np.uint8)
    gi = rng.integers(-1, 520, size=(rows, top_k), dtype=np.int32)
    dst = rng.permutation(layout.rows)[: rows * top_k].astype(np.int32).reshape(rows, top_k)
    mask = rng.integers(0, 2, size=(rows, top_k), dtype=np.int32)
    states = np.array([0, -1, 2], np.int32)
    counts = np.array([top_k, 17, -3], np.int32)
    want = slab.copy()
    att_want = np.full((rows, top_k), -999, np.int32)
    oracle.gather_plan(host=host, hot=want, layout=layout, global_indices=gi, hot_indices=dst, miss_mask=mask,
                       request_state_indices=states, attention_indices=att_want, attention_block_stride=block + 7)
    if paged:
        oracle.gather_compact(host=host, hot=want, layout=layout, miss_global_indices=gi, miss_hot_indices=dst,
                              miss_counts=counts)
    d_slab = torch.from_numpy(slab.copy()).cuda()
    hot = (d_slab.as_strided((blocks, block, row_bytes), (stride, row_bytes, 1)) if paged
           else d_slab.view(-1, row_bytes))
    att = torch.full((rows, top_k), -999, dtype=torch.int32, device="cuda")
    pinned = torch.from_numpy(host).pin_memory()

    def dev(a):
        return torch.from_numpy(a).cuda()

    cuda_ops.hisparse_gather_plan(pinned, hot, dev(gi), dev(dst), dev(mask), dev(states), att, block + 7)
    if paged:
        cuda_ops.hisparse_gather_compact(pinned, hot, dev(gi), dev(dst), dev(counts))
    torch.cuda.synchronize()
    np.testing.assert_array_equal(d_slab.cpu().numpy(), want)
    np.testing.assert_array_equal(att.cpu().numpy(), att_want)


# (hot-cache byte offset, host-pool byte offset, extra bytes per hot block): the vector width
# every row allows is 16 bytes, 4 bytes or 1 byte (the narrow paths: views into larger slabs).
MISALIGNED = [(0, 0, 64), (4, 0, 64), (0, 4, 64), (0, 0, 4), (1, 0, 64), (0, 3, 64), (0, 0, 2)]


@pytest.mark.parametrize("hot_offset, host_offset, block_pad", MISALIGNED,
                         ids=["16B", "hot+4", "host+4", "stride+4", "hot+1", "host+3", "stride+2"])
def test_gathers_on_misaligned_views(cuda_ops, hot_offset, host_offset, block_pad):
    rng = np.random.default_rng(hot_offset * 100 + host_offset * 10 + block_pad)
    rows, top_k, row_bytes, block, host_rows = 3, 200, 656, 16, 700
    blocks = -(-rows * top_k // block) + 2
    stride = block * row_bytes + block_pad
    layout = oracle.CacheLayout(hot_offset, block, stride, row_bytes, blocks * block)
    slab = rng.integers(0, 256, size=hot_offset + blocks * stride, dtype=np.uint8)
    host = rng.integers(0, 256, size=(host_rows, row_bytes), dtype=np.uint8)
    gi = rng.integers(-1, host_rows + 20, size=(rows, top_k), dtype=np.int32)
    dst = rng.permutation(layout.rows)[: rows * top_k].astype(np.int32).reshape(rows, top_k)
    mask = rng.integers(0, 2, size=(rows, top_k), dtype=np.int32)
    counts = np.array([top_k, 77, 0], np.int32)
    want = slab.copy()
    oracle.gather_plan(host=host, hot=want, layout=layout, global_indices=gi, hot_indices=dst, miss_mask=mask)
    oracle.gather_compact(host=host, hot=want, layout=layout, miss_global_indices=gi, miss_hot_indices=dst,
                          miss_counts=counts)
    flat = torch.empty(host_offset + host.size, dtype=torch.uint8).pin_memory()
    pinned = flat[host_offset:].view(host_rows, row_bytes)
    pinned.copy_(torch.from_numpy(host))
    d_slab = torch.from_numpy(slab.copy()).cuda()
    hot = d_slab.as_strided((blocks, block, row_bytes), (stride, row_bytes, 1), hot_offset)

    def dev(a):
        return torch.from_numpy(a).cuda()

    cuda_ops.hisparse_gather_plan(pinned, hot, dev(gi), dev(dst), dev(mask), None)
    cuda_ops.hisparse_gather_compact(pinned, hot, dev(gi), dev(dst), dev(counts))
    torch.cuda.synchronize()
    np.testing.assert_array_equal(d_slab.cpu().numpy(), want)


TESTS = Path(__file__).resolve().parent
TRAP = """
    import os, sys, numpy as np, torch
    import hisparse_kernels as hk
    from hs_cases import cold_state, make_scenario, op_resolve, topk
    hk.load(announce_line=False)
    rng = np.random.default_rng(12)
    s = make_scenario(rng, top_k=256, rows_per_request=[3], hot_extra=64)
    gi = topk(rng, s, overlap=0.0, absent=0.0)
    s.max_union_rows = 300  # three rows of 256 distinct positions: a union of about 700
    try:
        op_resolve(torch.ops.hisparse_kernels.hisparse_resolve_residency, s, gi, cold_state(s), device="cuda")
    except Exception as exc:
        print("TRAPPED", type(exc).__name__, str(exc).splitlines()[0], flush=True)
        os._exit(0)  # the context is gone: no teardown that could touch it
    print("NO TRAP", flush=True)
    os._exit(1)
"""


def test_union_overflow_traps_in_a_subprocess(cuda_ops):
    """More than max_union_rows host rows in one run: the kernel traps (vLLM's contract), which
    ends the CUDA context, so it runs in a process of its own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(TRAP)], capture_output=True, text=True, env=env,
                          timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "TRAPPED" in proc.stdout, output[-3000:]
    print(output[-2000:])  # the kernel's printf line, where the driver flushed it before the context ended


def test_invalidate_matches_oracle(cuda_ops):
    rng = np.random.default_rng(3)
    dgi = rng.integers(-1, 50, size=(6, 1000), dtype=np.int32)
    args = (rng.integers(-1, 8, size=5, dtype=np.int32), rng.integers(-2, 7, size=300, dtype=np.int32),
            rng.integers(-1, 50, size=300, dtype=np.int64))
    want = dgi.copy()
    oracle.invalidate_written_slots(device_global_indices=want, request_state_indices=args[0],
                                    req_id_per_token=args[1], written_slots=args[2])
    got = torch.from_numpy(dgi).cuda()
    cuda_ops.hisparse_invalidate_written_slots(got, *(torch.from_numpy(a).cuda() for a in args))
    np.testing.assert_array_equal(got.cpu().numpy(), want)


def test_unpinned_host_cache_is_refused(cuda_ops):
    with pytest.raises(RuntimeError, match="pinned"):
        cuda_ops.hisparse_gather_compact(torch.zeros(4, 16, dtype=torch.uint8),
                                         torch.zeros(1, 4, 16, dtype=torch.uint8, device="cuda"),
                                         torch.zeros(1, 1, dtype=torch.int32, device="cuda"),
                                         torch.zeros(1, 1, dtype=torch.int32, device="cuda"),
                                         torch.zeros(1, dtype=torch.int32, device="cuda"))


@pytest.mark.parametrize("seed", range(6))
def test_resolve_bit_for_bit_with_vllm(cuda_ops, vllm_ops, seed):
    rng = np.random.default_rng(100 + seed)
    top_k = [64, 2048, 33, 512, 2048, 1][seed]
    rows = [[1, 2, 4], [4], [1] * 9, [2, 2], [1, 1], [3]][seed]
    s = make_scenario(rng, top_k=top_k, rows_per_request=rows, hot_extra=[0, 2048, 5, 64, 2048, 1][seed],
                      hot_block_size=64, source_block_size=64, resident_fraction=0.2 if seed % 2 else 0.0,
                      null_fraction=0.05, padding_requests=(0,) if seed == 2 else ())
    state, previous = warm(rng, s), None
    for step in range(3):
        gi = topk(rng, s, previous)
        theirs_state, theirs = op_resolve(vllm_ops.hisparse_resolve_residency, s, gi, state, device="cuda")
        ours_state, ours = op_resolve(cuda_ops.hisparse_resolve_residency, s, gi, state, device="cuda")
        assert_same(ours_state, ours, theirs_state, theirs, f"vs vLLM, step {step}")
        state, previous = theirs_state, gi
    assert hk.call_counts()["_C_cache_ops"]["cuda"]["hisparse_resolve_residency"] == 0, "vLLM's op was ours"


def test_gathers_bit_for_bit_with_vllm(cuda_ops, vllm_ops):
    rng = np.random.default_rng(7)
    rows, top_k, row_bytes, block = 4, 2048, 656, 64
    host = torch.from_numpy(rng.integers(0, 256, size=(20000, row_bytes), dtype=np.uint8)).pin_memory()
    blocks = -(-rows * top_k // block) + 1
    gi = torch.from_numpy(rng.integers(-1, 20100, size=(rows, top_k), dtype=np.int32)).cuda()
    dst = torch.from_numpy(rng.permutation(blocks * block)[: rows * top_k].astype(np.int32).reshape(rows, top_k)).cuda()
    mask = torch.from_numpy(rng.integers(0, 2, size=(rows, top_k), dtype=np.int32)).cuda()
    counts = torch.tensor([top_k, 5, 0, 900], dtype=torch.int32, device="cuda")
    results = []
    for ops in (vllm_ops, cuda_ops):
        hot = torch.zeros(blocks, block, row_bytes, dtype=torch.uint8, device="cuda")
        att = torch.full((rows, top_k), -999, dtype=torch.int32, device="cuda")
        ops.hisparse_gather_plan(host, hot, gi, dst, mask, None, att, block)
        staged = torch.zeros(rows * top_k, row_bytes, dtype=torch.uint8, device="cuda")
        ops.hisparse_gather_plan(host, staged, gi, dst, mask, None, None, 0)
        ops.hisparse_gather_compact(host, hot, gi, dst, counts)
        torch.cuda.synchronize()
        results.append((hot.cpu(), att.cpu(), staged.cpu()))
    for theirs, ours in zip(*results, strict=True):
        assert torch.equal(theirs, ours)
    assert hk.call_counts()["_C_cache_ops"]["cuda"]["hisparse_gather_plan"] == 0, "vLLM's op was ours"


def test_resolve_outputs_unwritten_entries_stay(cuda_ops):
    """A padding run writes no miss_mask and no swap plan beyond its count (poison survives)."""
    rng = np.random.default_rng(5)
    s = make_scenario(rng, top_k=128, rows_per_request=[2, 1], padding_requests=(1,))
    _, got = op_resolve(cuda_ops.hisparse_resolve_residency, s, topk(rng, s), cold_state(s), device="cuda")
    assert (got.miss_mask[2] == -999).all()
    assert isinstance(got, ResolveOutputs)
