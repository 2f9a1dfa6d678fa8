"""Exact reference model of the four HiSparse ops, in Python and numpy.

Written from the ops' documented behaviour, sharing no code with the C++/CUDA
implementations: dictionaries and lists instead of the packed arrays and hash table
the kernels use. The ops move bytes and indices only, so the model is exact and the
tests compare with plain equality, including entries an op must leave untouched.

Arrays are numpy and are updated in place, like the ops' in-place tensors. Byte
caches are flat uint8 arrays (the whole storage of the tensor) addressed with an
explicit layout, so strided views into a larger slab are modelled exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_I32 = np.int32


class UnionOverflow(ValueError):
    """A request's union of host rows exceeds max_union_rows (the GPU kernel traps)."""


@dataclass(frozen=True)
class CacheLayout:
    """Where hot row r lives in a flat byte storage: blocks of block_size rows."""

    offset_bytes: int
    block_size: int
    block_stride_bytes: int
    row_bytes: int
    rows: int

    def row_slice(self, row: int) -> slice:
        start = (self.offset_bytes + (row // self.block_size) * self.block_stride_bytes
                 + (row % self.block_size) * self.row_bytes)
        return slice(start, start + self.row_bytes)


def _attention(row: int, block_size: int, block_stride: int) -> int:
    if row < 0:
        return -1
    # The kernels store into int32: keep the same wrap-around.
    return int(np.int64(row // block_size * block_stride + row % block_size).astype(_I32))


def _translate(position: int, request: int, host_rows: int, source_table, source_block_size: int,
               resident_table, resident_block_size: int, resident_null_block: int) -> tuple[int, int]:
    """(host row or -1, resident row or -1) of one logical top-k position."""
    host, resident = position, -1
    if source_table is not None:
        host = -1
        if position >= 0 and 0 <= request < source_table.shape[0]:
            block = position // source_block_size
            if block < source_table.shape[1]:
                page = int(source_table[request, block])
                if page > 0:  # page 0 is the null page
                    host = page * source_block_size + position % source_block_size
        if resident_table is not None and position >= 0 and 0 <= request < resident_table.shape[0]:
            block = position // resident_block_size
            if block < resident_table.shape[1]:
                page = int(resident_table[request, block])
                if page >= 0 and page != resident_null_block:
                    resident = page * resident_block_size + position % resident_block_size
    if host >= host_rows:
        host = -1
    return host, resident


def resolve_residency(*, host_rows: int, hot_block_size: int, hot_block_table: np.ndarray,
                      global_indices: np.ndarray, hot_indices: np.ndarray,
                      device_global_indices: np.ndarray, lru_slots: np.ndarray,
                      request_state_indices: np.ndarray | None, region_stride: int,
                      max_union_rows: int, miss_mask=None, stats=None, attention_indices=None,
                      attention_block_stride: int = 0, request_ids=None, source_block_table=None,
                      source_block_size: int = 0, resolved_global_indices=None, valid_counts=None,
                      swap_host_physical_rows=None, swap_device_physical_rows=None, swap_counts=None,
                      resident_block_table=None, resident_block_size: int = 0,
                      resident_null_block: int = 0) -> None:
    num_rows, top_k = global_indices.shape
    if num_rows == 0 or top_k == 0:
        return

    def hot_row(request: int, slot: int) -> int:
        block = int(hot_block_table[request, slot // hot_block_size])
        return block * hot_block_size + slot % hot_block_size

    def put(row: int, col: int, value: int) -> None:
        hot_indices[row, col] = value
        if attention_indices is not None:
            attention_indices[row, col] = _attention(value, hot_block_size, attention_block_stride)

    # Runs: maximal blocks of consecutive rows that share a request.
    runs: list[tuple[int, int]] = []
    for row in range(num_rows):
        request = int(request_ids[row]) if request_ids is not None else row
        if runs and request_ids is not None and request == runs[-1][1]:
            continue
        runs.append((row, request))
    bounds = [start for start, _ in runs] + [num_rows]

    owned: set[int] = set()  # state rows an earlier run of this launch resolved
    for (first, request), end in zip(runs, bounds[1:], strict=True):
        if request_state_indices is None:
            state = request
        elif 0 <= request < len(request_state_indices):
            state = int(request_state_indices[request])
        else:
            state = -1
        if state in owned:  # one state row, one run: a later run is padding
            state = -1
        elif state >= 0:
            owned.add(state)
        rows = range(first, end)
        if state < 0:  # CUDA-graph padding: publish -1, touch no state
            for row in rows:
                for col in range(top_k):
                    put(row, col, -1)
                    if resolved_global_indices is not None:
                        resolved_global_indices[row, col] = -1
                if valid_counts is not None:
                    valid_counts[row] = 0
                if swap_counts is not None:
                    swap_counts[row] = 0
            continue

        refs: list[tuple[int, int, int]] = []  # (row, col, host row) still to resolve
        first_ref: dict[int, tuple[int, int]] = {}  # host row -> its first (row, col)
        for row in rows:
            valid = 0
            for col in range(top_k):
                host, resident = _translate(
                    int(global_indices[row, col]), request, host_rows, source_block_table,
                    source_block_size, resident_block_table, resident_block_size, resident_null_block)
                if resolved_global_indices is not None:
                    resolved_global_indices[row, col] = host
                valid += int(host >= 0 or resident >= 0)
                if miss_mask is not None:
                    miss_mask[row, col] = 0
                if resident >= 0:
                    put(row, col, resident)
                elif host < 0:
                    put(row, col, -1)
                else:
                    refs.append((row, col, host))
                    first_ref.setdefault(host, (row, col))
            if valid_counts is not None:
                valid_counts[row] = valid
        if len(first_ref) > max_union_rows:
            raise UnionOverflow(f"request {request} resolves {len(first_ref)} host rows, "
                                f"above max_union_rows={max_union_rows}")
        if not first_ref:  # nothing to look up: the LRU is left alone
            for row in rows:
                if swap_counts is not None:
                    swap_counts[row] = 0
            continue

        dgi = device_global_indices[state]
        lru = lru_slots[state]
        hits: list[int] = []
        stale: list[int] = []
        owner: dict[int, tuple[str, int]] = {}  # host row -> ("hit" | "miss" | "invalid", slot)
        for slot in (int(s) for s in lru):
            held = int(dgi[slot]) if 0 <= slot < region_stride else -1
            if held >= 0 and held in first_ref:
                owner[held] = ("hit", slot)
                hits.append(slot)
            else:
                stale.append(slot)

        missing = [host for host in first_ref if host not in owner]  # first-reference order
        assert len(missing) <= len(stale), "precondition: the union fits the evictable slots"
        plan_base = first * top_k
        for k, host in enumerate(missing):
            slot = stale[k]
            valid_slot = 0 <= slot < region_stride
            owner[host] = ("miss", slot) if valid_slot else ("invalid", slot)
            if swap_host_physical_rows is not None:
                swap_host_physical_rows.flat[plan_base + k] = host
                swap_device_physical_rows.flat[plan_base + k] = hot_row(request, slot) if valid_slot else -1
            if valid_slot:
                dgi[slot] = host

        hit_refs = miss_refs = 0
        for row, col, host in refs:
            kind, slot = owner[host]
            if kind == "invalid":
                put(row, col, -1)
                continue
            put(row, col, hot_row(request, slot))
            if kind == "miss" and first_ref[host] == (row, col):
                miss_refs += 1
                if miss_mask is not None:
                    miss_mask[row, col] = 1
            else:
                hit_refs += 1
        if swap_counts is not None:
            for row in rows:
                swap_counts[row] = min(top_k, max(0, len(missing) - (row - first) * top_k))
        if stats is not None:
            stats[0] += np.uint64(hit_refs)
            stats[1] += np.uint64(miss_refs)
        used = len(missing)
        lru[:] = np.asarray(stale[used:] + stale[:used] + hits, dtype=np.int16)


def _copy_row(host: np.ndarray, hot: np.ndarray, layout: CacheLayout, g: int, dst: int) -> None:
    if g < 0 or dst < 0 or dst >= layout.rows:
        return
    target = layout.row_slice(dst)
    if g < host.shape[0]:
        hot[target] = host[g]
    else:  # no source row: zero the slot rather than leave stale bytes
        hot[target] = 0


def gather_plan(*, host: np.ndarray, hot: np.ndarray, layout: CacheLayout, global_indices: np.ndarray,
                hot_indices: np.ndarray, miss_mask: np.ndarray, request_state_indices=None,
                attention_indices=None, attention_block_stride: int = 0) -> None:
    num_rows, top_k = global_indices.shape
    for row in range(num_rows):
        padding = request_state_indices is not None and int(request_state_indices[row]) < 0
        for col in range(top_k):
            dst = int(hot_indices[row, col])
            if attention_indices is not None:
                attention_indices[row, col] = -1 if padding else _attention(
                    dst, layout.block_size, attention_block_stride)
            if padding or int(miss_mask[row, col]) == 0:
                continue
            _copy_row(host, hot, layout, int(global_indices[row, col]), dst)


def gather_compact(*, host: np.ndarray, hot: np.ndarray, layout: CacheLayout,
                   miss_global_indices: np.ndarray, miss_hot_indices: np.ndarray,
                   miss_counts: np.ndarray) -> None:
    num_rows, top_k = miss_global_indices.shape
    for row in range(num_rows):
        for col in range(min(top_k, max(0, int(miss_counts[row])))):
            _copy_row(host, hot, layout, int(miss_global_indices[row, col]), int(miss_hot_indices[row, col]))


def invalidate_written_slots(*, device_global_indices: np.ndarray, request_state_indices: np.ndarray,
                             req_id_per_token: np.ndarray, written_slots: np.ndarray) -> None:
    num_states = device_global_indices.shape[0]
    for request, slot in zip(req_id_per_token.tolist(), written_slots.tolist(), strict=True):
        if not 0 <= request < len(request_state_indices):
            continue
        state = int(request_state_indices[request])
        if 0 <= state < num_states and slot >= 0:
            row = device_global_indices[state]
            row[row == slot] = -1
