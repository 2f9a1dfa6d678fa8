"""Workloads of the GPU check, each checked against a reference (run with the kernel overlay on PYTHONPATH).

    python benchmarks/gpu_check_workloads.py sanitize [--device cuda|cpu]
    python benchmarks/gpu_check_workloads.py graph --out OUT/graph.json [--device cuda|cpu]

sanitize: a small launch that exercises every kernel once, meant to run under compute-sanitizer
(memcheck, racecheck, synccheck, initcheck): an MTP3 resolve (two requests of four rows, the union
of their top-k), a CUDA-graph padding request, padding rows after the real ones that name a real
request, then gather_compact, gather_plan (paged and staging) and invalidation. Every result is
compared with the numpy oracle; prints WORKLOAD-OK.

graph: captures resolve -> gather_compact -> gather_plan -> invalidate in one CUDA graph and
replays it over several decode steps (new top-k and written slots copied into the captured input
buffers before each replay), against the same ops run eagerly on cloned state: every output,
the long-lived state (LRU, hot indices, stats) and the hot cache must be equal after every step.
Writes a JSON report; prints GRAPH-OK.

--device cpu runs the same code on the CPU kernels (no sanitizer, no graph: the "graph" side is
a second eager run), which is how the CPU tests check this script without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT / "kernels" / "hisparse" / "tests"))  # hs_cases: the tests' scenarios

import hisparse_kernels as hk  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from hisparse_kernels import oracle  # noqa: E402
from hs_cases import (  # noqa: E402
    ResolveState,
    assert_lru_permutations,
    assert_same,
    make_scenario,
    op_resolve,
    oracle_resolve,
    topk,
    warm_state,
)

ROW_BYTES = 64
I32 = torch.int32


def mtp3_scenario(rng: np.random.Generator, top_k: int):
    """Two MTP3 requests (four rows each), a CUDA-graph padding request, and padding rows after the
    real ones that map to request 0 with a valid top-k (a later run of a state: resolved as padding)."""
    s = make_scenario(rng, top_k=top_k, rows_per_request=[4, 4, 1], hot_extra=top_k, hot_block_size=16,
                      source_block_size=16, null_fraction=0.05, padding_requests=(2,))
    s.row_bytes = ROW_BYTES
    s.request_ids_override = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 0, 0], np.int32)
    return s


def step_topk(rng, s, previous=None) -> np.ndarray:
    gi = topk(rng, s, previous)
    return np.concatenate([gi, topk(rng, s)[:2]])  # two padding rows naming request 0


def host_pool(rng, s, device: str) -> tuple[np.ndarray, torch.Tensor]:
    host = rng.integers(0, 256, size=(s.host_rows, s.row_bytes), dtype=np.uint8)
    pinned = torch.from_numpy(host.copy())
    return host, pinned.pin_memory() if device == "cuda" else pinned


def sanitize(device: str) -> dict:
    rng = np.random.default_rng(7)
    s = mtp3_scenario(rng, top_k=64)
    host, pinned = host_pool(rng, s, device)
    state = warm_state(rng, s)
    gi = step_topk(rng, s)
    layout = oracle.CacheLayout(0, s.hot_block_size, s.hot_block_size * s.row_bytes, s.row_bytes,
                                s.hot_num_blocks * s.hot_block_size)
    slab = rng.integers(0, 256, size=(s.hot_num_blocks, s.hot_block_size, s.row_bytes), dtype=np.uint8)
    hot = torch.from_numpy(slab.copy()).to(device)
    want_state, want = oracle_resolve(s, gi, state)
    got_state, got = op_resolve(torch.ops.hisparse_kernels.hisparse_resolve_residency, s, gi, state, device=device,
                                host_cache=pinned, hot_cache=hot)
    assert_same(got_state, got, want_state, want, "sanitize: resolve")
    assert_lru_permutations(got_state)
    ops = torch.ops.hisparse_kernels

    def dev(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    # The resolve above left hot untouched (it only reads the pool's shape); now the copies.
    want_hot = slab.reshape(-1).copy()
    oracle.gather_compact(host=host, hot=want_hot, layout=layout, miss_global_indices=want.swap_host_physical_rows,
                          miss_hot_indices=want.swap_device_physical_rows, miss_counts=want.swap_counts)
    ops.hisparse_gather_compact(pinned, hot, dev(got.swap_host_physical_rows), dev(got.swap_device_physical_rows),
                                dev(got.swap_counts))
    row_states = s.request_state_indices[s.request_ids]
    oracle.gather_plan(host=host, hot=want_hot, layout=layout, global_indices=want.resolved_global_indices,
                       hot_indices=want.hot_indices, miss_mask=np.where(want.miss_mask < 0, 0, want.miss_mask),
                       request_state_indices=row_states)
    ops.hisparse_gather_plan(pinned, hot, dev(got.resolved_global_indices), dev(got.hot_indices),
                             dev(np.where(got.miss_mask < 0, 0, got.miss_mask)), dev(row_states))
    staging_rows = s.num_rows * s.top_k
    staging = torch.zeros(staging_rows, s.row_bytes, dtype=torch.uint8, device=device)
    want_staging = np.zeros(staging_rows * s.row_bytes, np.uint8)
    flat_dst = np.arange(staging_rows, dtype=np.int32).reshape(s.num_rows, s.top_k)
    mask = (want.resolved_global_indices >= 0).astype(np.int32)
    oracle.gather_plan(host=host, hot=want_staging, layout=oracle.CacheLayout(0, 1, s.row_bytes, s.row_bytes,
                       staging_rows), global_indices=want.resolved_global_indices, hot_indices=flat_dst,
                       miss_mask=mask)
    ops.hisparse_gather_plan(pinned, staging, dev(got.resolved_global_indices), dev(flat_dst), dev(mask), None)
    dgi = torch.from_numpy(got_state.device_global_indices.copy()).to(device)
    req = rng.integers(-1, 3, size=40, dtype=np.int32)
    slots = rng.choice(got_state.device_global_indices[got_state.device_global_indices >= 0], 40).astype(np.int64)
    want_dgi = got_state.device_global_indices.copy()
    oracle.invalidate_written_slots(device_global_indices=want_dgi, request_state_indices=s.request_state_indices,
                                    req_id_per_token=req, written_slots=slots)
    ops.hisparse_invalidate_written_slots(dgi, dev(s.request_state_indices), dev(req), dev(slots))
    if device == "cuda":
        torch.cuda.synchronize()
    np.testing.assert_array_equal(hot.cpu().numpy().reshape(-1), want_hot, err_msg="sanitize: hot cache")
    np.testing.assert_array_equal(staging.cpu().numpy().reshape(-1), want_staging, err_msg="sanitize: staging")
    np.testing.assert_array_equal(dgi.cpu().numpy(), want_dgi, err_msg="sanitize: invalidation")
    return {"rows": s.num_rows, "top_k": s.top_k, "hot_size": s.hot_size, "misses": int(want.swap_counts.sum()),
            "invalidated": int((want_dgi != got_state.device_global_indices).sum())}


class Pipeline:
    """One decode step's four ops on fixed tensors (what a CUDA graph captures)."""

    def __init__(self, s, pinned, hot, state, device: str, tokens: int):
        self.s, self.pinned, self.hot, self.device = s, pinned, hot, device
        rows, k = s.num_rows, s.top_k

        def t(a):  # a copy on `device` (on CPU, .to would share the numpy array's memory)
            return torch.from_numpy(np.ascontiguousarray(a)).clone().to(device)

        self.dgi, self.lru, self.stats = t(state.device_global_indices), t(state.lru_slots), t(state.stats)
        self.hot_table, self.source_table = t(s.hot_block_table), t(s.source_block_table)
        self.request_ids, self.states = t(s.request_ids), t(s.request_state_indices)
        self.row_states = t(s.request_state_indices[s.request_ids])
        self.topk = torch.full((rows, k), -1, dtype=I32, device=device)
        self.req_of_token = torch.zeros(tokens, dtype=I32, device=device)
        self.written = torch.full((tokens,), -1, dtype=torch.int64, device=device)
        grid = dict(dtype=I32, device=device)
        self.outputs = {name: torch.full((rows, k), -7, **grid) for name in (
            "hot_indices", "attention", "miss_mask", "resolved", "swap_host", "swap_dev")}
        self.outputs["valid"] = torch.full((rows,), -7, **grid)
        self.outputs["swap_counts"] = torch.full((rows,), -7, **grid)
        self.staging = torch.zeros(rows * k, s.row_bytes, dtype=torch.uint8, device=device)
        self.flat_dst = torch.arange(rows * k, dtype=I32, device=device).view(rows, k)

    def run(self) -> None:
        s, o, ops = self.s, self.outputs, torch.ops.hisparse_kernels
        ops.hisparse_resolve_residency(
            self.pinned, self.hot, self.hot_table, self.topk, o["hot_indices"], self.dgi, self.lru, self.states,
            s.hot_size, s.max_union_rows, o["miss_mask"], self.stats, o["attention"], s.attention_block_stride,
            self.request_ids, self.source_table, s.source_block_size, o["resolved"], o["valid"], o["swap_host"],
            o["swap_dev"], o["swap_counts"], None, 0, 0)
        ops.hisparse_gather_compact(self.pinned, self.hot, o["swap_host"], o["swap_dev"], o["swap_counts"])
        ops.hisparse_gather_plan(self.pinned, self.staging, o["resolved"], self.flat_dst, o["miss_mask"],
                                 self.row_states, None, 0)
        ops.hisparse_invalidate_written_slots(self.dgi, self.states, self.req_of_token, self.written)

    def feed(self, gi: np.ndarray, req: np.ndarray, written: np.ndarray) -> None:
        self.topk.copy_(torch.from_numpy(gi))
        self.req_of_token.copy_(torch.from_numpy(req))
        self.written.copy_(torch.from_numpy(written))

    def snapshot(self) -> dict[str, np.ndarray]:
        out = {name: t.cpu().numpy() for name, t in self.outputs.items()}
        out.update(dgi=self.dgi.cpu().numpy(), lru=self.lru.cpu().numpy(), stats=self.stats.cpu().numpy(),
                   hot=self.hot.cpu().numpy(), staging=self.staging.cpu().numpy())
        return out


def graph(device: str, steps: int = 6) -> dict:
    rng = np.random.default_rng(11)
    s = mtp3_scenario(rng, top_k=256)
    host, pinned = host_pool(rng, s, device)
    state = warm_state(rng, s)
    slab = rng.integers(0, 256, size=(s.hot_num_blocks, s.hot_block_size, s.row_bytes), dtype=np.uint8)
    tokens = 24
    eager = Pipeline(s, pinned, torch.from_numpy(slab.copy()).to(device), state, device, tokens)
    captured = Pipeline(s, pinned, torch.from_numpy(slab.copy()).to(device), state, device, tokens)
    inputs, previous = [], None
    for _ in range(steps + 1):
        gi = step_topk(rng, s, previous)
        previous = gi[: sum(s.rows_per_request)]
        req = rng.integers(-1, len(s.rows_per_request), size=tokens, dtype=np.int32)
        written = rng.integers(-1, s.host_rows, size=tokens).astype(np.int64)
        inputs.append((gi, req, written))
    started = time.monotonic()
    # Step 0 runs eagerly on both (the warm-up a graph capture needs: first-call work such as
    # reading the device's limits happens outside the capture).
    for pipe in (eager, captured):
        pipe.feed(*inputs[0])
        pipe.run()
    graph_obj = None
    if device == "cuda":
        torch.cuda.synchronize()
        graph_obj = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph_obj):
            captured.run()
        # Capturing ran nothing: both pipelines still hold the state after step 0.
    compared = []
    for step in range(1, steps + 1):
        for pipe in (eager, captured):
            pipe.feed(*inputs[step])
        eager.run()
        if graph_obj is not None:
            graph_obj.replay()
        else:
            captured.run()
        if device == "cuda":
            torch.cuda.synchronize()
        want, got = eager.snapshot(), captured.snapshot()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"graph replay step {step}: {name}")
        assert_lru_permutations(ResolveState(got["dgi"], got["lru"]))
        compared.append({"step": step, "misses": int(want["swap_counts"].sum()),
                         "hits_total": int(want["stats"][0]), "misses_total": int(want["stats"][1])})
    return {"device": device, "captured": graph_obj is not None, "steps": steps, "rows": s.num_rows,
            "top_k": s.top_k, "hot_size": s.hot_size, "ops": ["resolve", "gather_compact", "gather_plan",
                                                              "invalidate"],
            "per_step": compared, "seconds": round(time.monotonic() - started, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=["sanitize", "graph"])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device visible to torch (--device cpu runs the CPU kernels)")
    hk.load(announce_line=False)
    if args.device == "cuda" and hk.identity().built_for != "cuda":
        parser.error("the hisparse_kernels on PYTHONPATH was built CPU-only")
    result = sanitize(args.device) if args.workload == "sanitize" else graph(args.device)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(json.dumps(result))
    print("WORKLOAD-OK" if args.workload == "sanitize" else "GRAPH-OK", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
