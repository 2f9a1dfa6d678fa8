"""Self-consistent inputs for the resolver, and runners for the op and the oracle.

A `Scenario` is one batch layout (requests, rows per request, tables, sizes); `topk`
draws a step's logical top-k positions for it; `ResolveState` is the long-lived
per-request state that steps carry. The runners take the same inputs and return
numpy copies of every output and state array, each output poisoned beforehand so
"the op did not write here" is compared too.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
from hisparse_kernels import oracle

POISON = -999
I32 = np.int32


@dataclass
class Scenario:
    top_k: int
    hot_size: int
    max_union_rows: int
    rows_per_request: list[int]
    request_state_indices: np.ndarray  # [requests] (-1: CUDA-graph padding request)
    num_states: int
    hot_block_size: int
    hot_block_table: np.ndarray  # [requests, blocks]
    hot_num_blocks: int
    host_rows: int
    max_position: int
    source_block_size: int = 0
    source_block_table: np.ndarray | None = None
    resident_block_table: np.ndarray | None = None
    resident_null_block: int = 0
    attention_block_stride: int = 0
    row_bytes: int = 16
    with_request_ids: bool = True
    # Launch rows' requests when they are not simply rows_per_request in order (CUDA-graph
    # padding rows appended after the real ones map to request 0).
    request_ids_override: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        if self.request_ids_override is not None:
            return len(self.request_ids_override)
        return sum(self.rows_per_request)

    @property
    def request_ids(self) -> np.ndarray | None:
        if not self.with_request_ids:
            return None
        if self.request_ids_override is not None:
            return self.request_ids_override
        return np.repeat(np.arange(len(self.rows_per_request), dtype=I32), self.rows_per_request)


@dataclass
class ResolveState:
    device_global_indices: np.ndarray
    lru_slots: np.ndarray
    stats: np.ndarray = field(default_factory=lambda: np.zeros(2, np.uint64))

    def copy(self) -> ResolveState:
        return copy.deepcopy(self)


@dataclass
class ResolveOutputs:
    hot_indices: np.ndarray
    attention_indices: np.ndarray
    miss_mask: np.ndarray
    resolved_global_indices: np.ndarray
    valid_counts: np.ndarray
    swap_host_physical_rows: np.ndarray
    swap_device_physical_rows: np.ndarray
    swap_counts: np.ndarray

    @staticmethod
    def poisoned(rows: int, top_k: int) -> ResolveOutputs:
        def grid():
            return np.full((rows, top_k), POISON, I32)
        return ResolveOutputs(grid(), grid(), grid(), grid(), np.full(rows, POISON, I32), grid(), grid(),
                              np.full(rows, POISON, I32))


def make_scenario(rng: np.random.Generator, *, top_k: int, rows_per_request: list[int],
                  hot_extra: int = 0, hot_block_size: int = 8, source_block_size: int = 4,
                  null_fraction: float = 0.0, resident_fraction: float = 0.0, padding_requests=(),
                  short_host: bool = False, union_slack: int = 0, resident_null_block: int = 0,
                  attention_extra: int = 0, with_source: bool = True) -> Scenario:
    """A batch: request r has rows_per_request[r] consecutive rows (several: MTP)."""
    requests = len(rows_per_request)
    widest = max(rows_per_request)
    max_union = widest * top_k + union_slack
    hot_size = max_union + hot_extra
    num_states = requests + 2
    states = rng.permutation(num_states)[:requests].astype(I32)
    for r in padding_requests:
        states[r] = -1
    blocks_per_request = -(-hot_size // hot_block_size)
    hot_num_blocks = requests * blocks_per_request + 3
    hot_table = rng.permutation(hot_num_blocks)[: requests * blocks_per_request].astype(I32)
    max_position = 4 * top_k * widest + 8
    scenario = Scenario(
        top_k=top_k, hot_size=hot_size, max_union_rows=max_union, rows_per_request=rows_per_request,
        request_state_indices=states, num_states=num_states, hot_block_size=hot_block_size,
        hot_block_table=hot_table.reshape(requests, blocks_per_request), hot_num_blocks=hot_num_blocks,
        host_rows=0, max_position=max_position, attention_block_stride=hot_block_size + attention_extra,
        resident_null_block=resident_null_block, with_request_ids=with_source)
    if not with_source:  # positions are host rows, each row its own request
        scenario.host_rows = max_position if not short_host else max_position * 3 // 4
        return scenario
    source_blocks = -(-max_position // source_block_size)
    # Distinct positive pages across requests (0 is the null page): host rows never collide.
    pages = 1 + rng.permutation(requests * source_blocks + 4)[: requests * source_blocks]
    pages = pages.reshape(requests, source_blocks).astype(I32)
    pages[rng.random(pages.shape) < null_fraction] = 0
    # The last few positions fall outside the table: they translate to -1.
    scenario.source_block_table = pages[:, : max(1, source_blocks - 1)]
    scenario.source_block_size = source_block_size
    top_host = (int(pages.max()) + 1) * source_block_size
    scenario.host_rows = top_host if not short_host else top_host * 3 // 4
    if resident_fraction > 0:
        resident_blocks = -(-max_position // hot_block_size)
        table = rng.integers(0, hot_num_blocks, size=(requests, resident_blocks), dtype=I32)
        table[rng.random(table.shape) >= resident_fraction] = resident_null_block
        scenario.resident_block_table = table
    return scenario


def cold_state(s: Scenario) -> ResolveState:
    return ResolveState(np.full((s.num_states, s.hot_size), -1, I32),
                        np.tile(np.arange(s.hot_size, dtype=np.int16), (s.num_states, 1)))


def warm_state(rng: np.random.Generator, s: Scenario, fill: float = 0.6) -> ResolveState:
    """Random LRU order; unique cached host rows in a share of the slots (some the step will hit)."""
    dgi = np.full((s.num_states, s.hot_size), -1, I32)
    lru = np.zeros((s.num_states, s.hot_size), np.int16)
    for state in range(s.num_states):
        lru[state] = rng.permutation(s.hot_size).astype(np.int16)
        filled = rng.random(s.hot_size) < fill
        values = rng.choice(max(s.host_rows, s.hot_size), size=s.hot_size, replace=False)
        dgi[state, filled] = values[filled]
    return ResolveState(dgi, lru)


def topk(rng: np.random.Generator, s: Scenario, previous: np.ndarray | None = None,
         reuse: float = 0.5, absent: float = 0.1, overlap: float = 0.7) -> np.ndarray:
    """Unique positions per row; rows of one request overlap (MTP); -1 pads some entries."""
    rows = []
    first = 0
    for count in s.rows_per_request:
        base = rng.choice(s.max_position, size=s.top_k, replace=False)
        if previous is not None:
            keep = rng.random(s.top_k) < reuse
            old = previous[first][previous[first] >= 0]
            take = min(int(keep.sum()), len(old))
            if take:
                base = np.concatenate([rng.choice(old, size=take, replace=False),
                                       np.setdiff1d(base, old)])[: s.top_k]
                if len(base) < s.top_k:
                    spare = np.setdiff1d(np.arange(s.max_position), base)
                    base = np.concatenate([base, rng.choice(spare, s.top_k - len(base), replace=False)])
        for _ in range(count):
            row = base.copy()
            swap = rng.random(s.top_k) >= overlap
            spare = np.setdiff1d(np.arange(s.max_position), row)
            n = min(int(swap.sum()), len(spare))
            row[np.flatnonzero(swap)[:n]] = rng.choice(spare, size=n, replace=False)
            row = rng.permutation(row)
            row[rng.random(s.top_k) < absent] = -1
            rows.append(row)
        first += count
    return np.stack(rows).astype(I32)


def resolve_kwargs(s: Scenario, gi: np.ndarray, state: ResolveState, out: ResolveOutputs) -> dict:
    return dict(
        global_indices=gi, hot_indices=out.hot_indices, device_global_indices=state.device_global_indices,
        lru_slots=state.lru_slots, request_state_indices=s.request_state_indices, region_stride=s.hot_size,
        max_union_rows=s.max_union_rows, miss_mask=out.miss_mask, stats=state.stats,
        attention_indices=out.attention_indices, attention_block_stride=s.attention_block_stride,
        request_ids=s.request_ids, source_block_table=s.source_block_table,
        source_block_size=s.source_block_size, resolved_global_indices=out.resolved_global_indices,
        valid_counts=out.valid_counts, swap_host_physical_rows=out.swap_host_physical_rows,
        swap_device_physical_rows=out.swap_device_physical_rows, swap_counts=out.swap_counts,
        resident_block_table=s.resident_block_table,
        resident_block_size=s.hot_block_size if s.resident_block_table is not None else 0,
        resident_null_block=s.resident_null_block)


def hot_table_for(s: Scenario) -> np.ndarray:
    """Hot block table rows by request (with request ids) or by launch row (without)."""
    if s.with_request_ids:
        return s.hot_block_table
    return np.repeat(s.hot_block_table, s.rows_per_request, axis=0)


def oracle_resolve(s: Scenario, gi: np.ndarray, state: ResolveState) -> tuple[ResolveState, ResolveOutputs]:
    state = state.copy()
    out = ResolveOutputs.poisoned(*gi.shape)
    oracle.resolve_residency(host_rows=s.host_rows, hot_block_size=s.hot_block_size,
                             hot_block_table=hot_table_for(s), **resolve_kwargs(s, gi, state, out))
    return state, out


def op_resolve(op, s: Scenario, gi: np.ndarray, state: ResolveState, device: str = "cpu",
               host_cache: torch.Tensor | None = None,
               hot_cache: torch.Tensor | None = None) -> tuple[ResolveState, ResolveOutputs]:
    """Run `op` (an op packet, e.g. torch.ops.hisparse_kernels.hisparse_resolve_residency)."""
    state = state.copy()
    out = ResolveOutputs.poisoned(*gi.shape)

    def dev(a):
        return None if a is None else torch.from_numpy(np.ascontiguousarray(a).copy()).to(device)

    if host_cache is None:
        host_cache = torch.zeros(s.host_rows, s.row_bytes, dtype=torch.uint8)
        if device != "cpu":
            host_cache = host_cache.pin_memory()
    if hot_cache is None:
        hot_cache = torch.zeros(s.hot_num_blocks, s.hot_block_size, s.row_bytes, dtype=torch.uint8,
                                device=device)
    tensors = {k: dev(v) if isinstance(v, np.ndarray) else v for k, v in resolve_kwargs(s, gi, state, out).items()}
    _call(op, host_cache, hot_cache, dev, s, tensors)
    if device != "cpu":
        torch.cuda.synchronize()
    back = {k: v.cpu().numpy() for k, v in tensors.items() if isinstance(v, torch.Tensor)}
    state = ResolveState(back["device_global_indices"], back["lru_slots"], back["stats"])
    out = ResolveOutputs(*(back[name] for name in ResolveOutputs.__dataclass_fields__))
    return state, out


def _call(op, host_cache, hot_cache, dev, s: Scenario, t: dict) -> None:
    op(host_cache, hot_cache, dev(hot_table_for(s)), t["global_indices"], t["hot_indices"],
       t["device_global_indices"], t["lru_slots"], t["request_state_indices"], t["region_stride"],
       t["max_union_rows"], t["miss_mask"], t["stats"], t["attention_indices"], t["attention_block_stride"],
       t["request_ids"], t["source_block_table"], t["source_block_size"], t["resolved_global_indices"],
       t["valid_counts"], t["swap_host_physical_rows"], t["swap_device_physical_rows"], t["swap_counts"],
       t["resident_block_table"], t["resident_block_size"], t["resident_null_block"])


def assert_same(got_state: ResolveState, got: ResolveOutputs, want_state: ResolveState,
                want: ResolveOutputs, where: str) -> None:
    for name in ResolveOutputs.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=f"{where}: {name}")
    np.testing.assert_array_equal(got_state.lru_slots, want_state.lru_slots, err_msg=f"{where}: lru_slots")
    np.testing.assert_array_equal(got_state.device_global_indices, want_state.device_global_indices,
                                  err_msg=f"{where}: device_global_indices")
    np.testing.assert_array_equal(got_state.stats, want_state.stats, err_msg=f"{where}: stats")


SHARED_STATE_KINDS = ("padding_after_real_rows", "duplicate_state_index", "request_split_in_two_runs")


def shared_state_launch(rng: np.random.Generator, kind: str, top_k: int = 16, **scenario):
    """A launch in which two runs name one state row, which the resolver gives to the first run
    (a later one resolves as padding), and the launch that resolves to the same state without the
    later run. Returns (scenario, top-k, reference scenario, reference top-k, the later run's rows).

    padding_after_real_rows: CUDA-graph padding rows after the real ones map to request 0, with a
    valid top-k; duplicate_state_index: two requests are given one state row;
    request_split_in_two_runs: one request's rows come in two runs."""
    if kind == "padding_after_real_rows":
        s = make_scenario(rng, top_k=top_k, rows_per_request=[2, 2], **scenario)
        real = topk(rng, s)
        reference = copy.deepcopy(s)
        s.request_ids_override = np.array([0, 0, 1, 1, 0, 0], np.int32)
        return s, np.concatenate([real, topk(rng, s)[:2]]), reference, real, [4, 5]
    if kind == "duplicate_state_index":
        s = make_scenario(rng, top_k=top_k, rows_per_request=[2, 1, 2], **scenario)
        s.request_state_indices[2] = s.request_state_indices[0]
        reference = copy.deepcopy(s)
        reference.request_state_indices[2] = -1
        gi = topk(rng, s)
        return s, gi, reference, gi, [3, 4]
    if kind == "request_split_in_two_runs":
        s = make_scenario(rng, top_k=top_k, rows_per_request=[2, 1], **scenario)
        gi = topk(rng, s)
        reference = copy.deepcopy(s)
        s.request_ids_override = np.array([0, 0, 1, 0], np.int32)
        return s, np.concatenate([gi, gi[:1]]), reference, gi, [3]
    raise ValueError(kind)


def assert_lru_permutations(state: ResolveState) -> None:
    """Every state row's LRU holds each hot slot once (what a race between two runs breaks)."""
    hot_size = state.lru_slots.shape[1]
    for row, lru in enumerate(state.lru_slots):
        assert sorted(lru.tolist()) == list(range(hot_size)), f"state row {row}: LRU is no permutation"
