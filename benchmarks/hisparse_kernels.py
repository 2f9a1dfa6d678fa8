"""Time the HiSparse kernels at the blog's shapes (a measurement, not a test).

Resolver: time per decode step at top-K 2,048, with 4,096 hot rows (one row per request)
and 10,240 (MTP3: four rows per request, their union resolved together), 1 to 256 rows,
656-byte rows (GLM-5.3's fp8 MLA rows). Each step's top-K differs from the last by a churn
share (default 10%), replayed over a cycle of steps after a warm-up, so hits, misses and
evictions all happen. Gathers: GB/s of gather_compact and gather_plan copying the misses of
a cold step, as a ratio of a pinned host-to-device copy of the same bytes, measured in the
same run. The bundled kernels and, where a CUDA vLLM is importable, vLLM's own ops, side by
side on identical inputs. Writes results.json and results.md to --out.

    PYTHONPATH=<kernel overlay> python benchmarks/hisparse_kernels.py --out DIR [--quick] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# This file shares its name with the package it measures: keep its folder off the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROW_BYTES = 656
TOP_K = 2048
BLOCK = 64  # hot, resident and source block size (tokens)
CONTEXT_TOKENS = 16384  # per request; top-K picks 1 in 8
STEPS = 16  # distinct top-K sets in the replay cycle
I32 = torch.int32


@dataclass(frozen=True)
class Shape:
    rows: int
    rows_per_request: int
    hot_size: int


FULL = [Shape(r, 1, 4096) for r in (1, 8, 32, 64, 128, 256)] + \
       [Shape(r, 4, 10240) for r in (4, 32, 64, 128, 256)]
QUICK = [Shape(1, 1, 4096), Shape(64, 1, 4096), Shape(8, 4, 10240), Shape(128, 4, 10240)]


class Batch:
    """Inputs and state of one shape, identical for every implementation timed."""

    def __init__(self, shape: Shape, device: str, churn: float, seed: int = 0):
        self.shape, self.device = shape, device
        requests = shape.rows // shape.rows_per_request
        pages = CONTEXT_TOKENS // BLOCK
        self.host_rows = (requests * pages + 1) * BLOCK
        host = torch.empty(self.host_rows, ROW_BYTES, dtype=torch.uint8)
        self.host = host.pin_memory() if device == "cuda" else host
        hot_blocks = shape.hot_size // BLOCK
        self.hot = torch.zeros(requests * hot_blocks + 1, BLOCK, ROW_BYTES, dtype=torch.uint8, device=device)
        self.hot_table = torch.arange(requests * hot_blocks, dtype=I32, device=device).view(requests, hot_blocks)
        self.source_table = (1 + torch.arange(requests * pages, dtype=I32, device=device)).view(requests, pages)
        self.request_ids = torch.arange(requests, dtype=I32, device=device).repeat_interleave(shape.rows_per_request)
        self.states = torch.arange(requests, dtype=I32, device=device)
        self.row_states = self.states[self.request_ids.long()].contiguous()
        self.topk = [torch.from_numpy(t).to(device) for t in self._topk_cycle(requests, churn, seed)]
        self.reset()

    def _topk_cycle(self, requests: int, churn: float, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        rpr = self.shape.rows_per_request
        base = np.stack([rng.choice(CONTEXT_TOKENS, TOP_K, replace=False) for _ in range(requests)])
        cycle = []
        for _ in range(STEPS):
            rows = []
            for request in range(requests):
                for _ in range(rpr):  # MTP rows of a request overlap (90% here)
                    row = base[request].copy()
                    drift = rng.random(TOP_K) < (0.1 if rpr > 1 else 0.0)
                    spare = np.setdiff1d(np.arange(CONTEXT_TOKENS), row)
                    row[drift] = rng.choice(spare, int(drift.sum()), replace=False)
                    rows.append(row)
            cycle.append(np.stack(rows).astype(np.int32))
            for request in range(requests):  # the next step: churn of the positions change
                change = rng.random(TOP_K) < churn
                spare = np.setdiff1d(np.arange(CONTEXT_TOKENS), base[request])
                base[request][change] = rng.choice(spare, int(change.sum()), replace=False)
        return cycle

    def reset(self) -> None:
        rows, dev = self.shape.rows, self.device
        requests = rows // self.shape.rows_per_request
        self.dgi = torch.full((requests, self.shape.hot_size), -1, dtype=I32, device=dev)
        self.lru = torch.arange(self.shape.hot_size, dtype=torch.int16, device=dev).repeat(requests, 1).contiguous()
        grid = dict(dtype=I32, device=dev)
        self.hot_indices = torch.empty(rows, TOP_K, **grid)
        self.attention = torch.empty(rows, TOP_K, **grid)
        self.miss_mask = torch.empty(rows, TOP_K, **grid)
        self.resolved = torch.empty(rows, TOP_K, **grid)
        self.swap_host = torch.empty(rows, TOP_K, **grid)
        self.swap_dev = torch.empty(rows, TOP_K, **grid)
        self.swap_counts = torch.zeros(rows, **grid)
        self.valid = torch.empty(rows, **grid)
        self.stats = torch.zeros(2, dtype=torch.uint64, device=dev)

    def resolve(self, ops, step: int) -> None:
        s = self.shape
        ops.hisparse_resolve_residency(
            self.host, self.hot, self.hot_table, self.topk[step % STEPS], self.hot_indices, self.dgi, self.lru,
            self.states, s.hot_size, s.rows_per_request * TOP_K, self.miss_mask, self.stats, self.attention, BLOCK,
            self.request_ids, self.source_table, BLOCK, self.resolved, self.valid, self.swap_host, self.swap_dev,
            self.swap_counts, None, 0, 0)

    def gather_compact(self, ops) -> None:
        ops.hisparse_gather_compact(self.host, self.hot, self.swap_host, self.swap_dev, self.swap_counts)

    def gather_plan(self, ops) -> None:
        ops.hisparse_gather_plan(self.host, self.hot, self.resolved, self.hot_indices, self.miss_mask,
                                 self.row_states, None, 0)


def time_ms(fn, iters: int, device: str) -> float:
    """Median wall time of one call, on the GPU's clock where there is one."""
    samples = []
    for i in range(iters):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(i)
            end.record()
            samples.append((start, end))
        else:
            t0 = time.perf_counter()
            fn(i)
            samples.append((time.perf_counter() - t0) * 1e3)
    if device == "cuda":
        torch.cuda.synchronize()
        samples = [a.elapsed_time(b) for a, b in samples]
    return statistics.median(samples)


def bench_resolver(impls: dict, shape: Shape, device: str, iters: int, churn: float) -> list[dict]:
    out = []
    for name, ops in impls.items():
        batch = Batch(shape, device, churn)
        for step in range(STEPS):  # warm-up: reach the steady state of the cycle
            batch.resolve(ops, step)
            batch.gather_compact(ops)
        before = batch.stats.cpu().tolist()
        resolve_ms = time_ms(lambda i, b=batch, o=ops: b.resolve(o, i), iters, device)
        step_ms = time_ms(lambda i, b=batch, o=ops: (b.resolve(o, i), b.gather_compact(o)), iters, device)
        hits, misses = (a - b for a, b in zip(batch.stats.cpu().tolist(), before, strict=True))
        out.append({"impl": name, **asdict(shape), "resolve_ms": round(resolve_ms, 4),
                    "resolve_plus_gather_ms": round(step_ms, 4),
                    "miss_rate": round(misses / max(1, hits + misses), 4)})
    return out


def gather_once(name: str, ops, shape: Shape, device: str, iters: int) -> dict:
    batch = Batch(shape, device, churn=0.0)
    batch.resolve(ops, 0)  # cold: every valid position is a miss
    rows = int(batch.swap_counts.sum())
    nbytes = rows * ROW_BYTES
    src = batch.host.view(-1)[:nbytes]
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    copy_ms = time_ms(lambda i: dst.copy_(src, non_blocking=True), iters, device)
    compact_ms = time_ms(lambda i: batch.gather_compact(ops), iters, device)
    plan_ms = time_ms(lambda i: batch.gather_plan(ops), iters, device)

    def gbps(ms: float) -> float:
        return nbytes / (ms * 1e-3) / 1e9

    return {"impl": name, **asdict(shape), "rows_copied": rows, "bytes": nbytes,
            "h2d_copy_gbps": round(gbps(copy_ms), 2),
            "gather_compact_gbps": round(gbps(compact_ms), 2),
            "gather_compact_vs_copy": round(copy_ms / compact_ms, 3),
            "gather_plan_gbps": round(gbps(plan_ms), 2),
            "gather_plan_vs_copy": round(copy_ms / plan_ms, 3)}


def bench_gather(impls: dict, shape: Shape, device: str, iters: int) -> list[dict]:
    return [gather_once(name, ops, shape, device, iters) for name, ops in impls.items()]


def implementations(device: str) -> tuple[dict, dict]:
    import hisparse_kernels as hk

    hk.load()
    impls = {"bundled": torch.ops.hisparse_kernels}
    meta = {"bundled_identity": hk.identity().__dict__, "torch": torch.__version__, "device": device}
    if device == "cuda":
        meta["gpu"] = torch.cuda.get_device_name()
        try:
            import vllm
            import vllm._custom_ops  # noqa: F401  (loads vLLM's kernel libraries)

            if all(hasattr(torch.ops._C_cache_ops, n) for n in hk.OP_NAMES):
                impls["vllm"] = torch.ops._C_cache_ops
                meta["vllm"] = vllm.__version__
        except Exception as exc:
            meta["vllm"] = f"not compared: {type(exc).__name__}: {exc}"
    return impls, meta


def markdown(meta: dict, resolver: list[dict], gather: list[dict]) -> str:
    lines = [f"# HiSparse kernels ({meta.get('gpu', meta['device'])}, torch {meta['torch']})", "",
             f"bundled: {meta['bundled_identity']['version']} sha256 {meta['bundled_identity']['source_sha256'][:12]}"
             f"; vLLM: {meta.get('vllm', 'not compared')}", "",
             "## Resolver per decode step (top-K 2,048, 656-byte rows)", "",
             "| impl | rows | rows/request | hot rows | resolve ms | resolve + gather ms | miss rate |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['impl']} | {r['rows']} | {r['rows_per_request']} | {r['hot_size']} | {r['resolve_ms']} | "
              f"{r['resolve_plus_gather_ms']} | {r['miss_rate']} |" for r in resolver]
    lines += ["", "## Gathers of a cold step vs a pinned host-to-device copy of the same bytes", "",
              "| impl | rows | rows/request | MiB | H2D copy GB/s | compact GB/s | compact/copy | plan GB/s | plan/copy |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {g['impl']} | {g['rows']} | {g['rows_per_request']} | {g['bytes'] / 2**20:.1f} | "
              f"{g['h2d_copy_gbps']} | {g['gather_compact_gbps']} | {g['gather_compact_vs_copy']} | "
              f"{g['gather_plan_gbps']} | {g['gather_plan_vs_copy']} |" for g in gather]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="four shapes, fewer iterations")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--churn", type=float, default=0.1, help="share of top-K positions new each step")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device visible to torch (use --device cpu for a smoke run)")
    shapes = QUICK if args.quick or args.device == "cpu" else FULL
    iters = args.iters or (5 if args.device == "cpu" else (20 if args.quick else 50))
    impls, meta = implementations(args.device)
    resolver, gather = [], []
    for shape in shapes:
        resolver += bench_resolver(impls, shape, args.device, iters, args.churn)
        gather += bench_gather(impls, shape, args.device, iters)
        print(f"done rows={shape.rows} hot={shape.hot_size}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "resolver": resolver, "gather": gather},
                                                      indent=2))
    table = markdown(meta, resolver, gather)
    (args.out / "results.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
