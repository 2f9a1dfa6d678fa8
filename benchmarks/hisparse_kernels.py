"""Time the HiSparse kernels at the blog's shapes (a measurement, not a test).

Resolver: time per decode step at top-K 2,048, with 4,096 hot rows (one row per request) and
10,240 (MTP3: four rows per request, their union resolved together), 1 to 256 rows, 656-byte
rows (GLM-5.3's fp8 MLA rows). Each step's top-K differs from the last by a churn share (default
10%), a sequence that never repeats, after a few warm-up steps.

Timing on a GPU is of CUDA-graph replays, as vLLM decodes: one step (resolve, or resolve +
gather_compact) is captured once on a fixed top-K buffer; before each replay the next step's top-K
is copied into it, and GPU events around the replay time the step, without the host's launch
overhead. The same steps issued eagerly are reported beside it, to show what the host adds.

Gathers: GB/s of gather_compact and gather_plan copying the misses of a cold step, each timed as
a graph of repeated calls, against two references measured in the same run: a large pinned DMA
(one copy of --dma-mib from the host pool to the GPU) and the link's nominal rate (PCIe Gen5 x16,
63.0 GB/s a direction after 128b/130b coding). The host pool is --pool-gib of ordinary memory
registered with cudaHostRegister (production registers a 384 GiB pool and reads random rows of
it); each request's source pages are drawn at random across the whole pool. Where the machine
has too little free memory, the pool shrinks and the results say so.

The bundled kernels and, where a CUDA vLLM is importable, vLLM's own ops, side by side on
identical inputs. Writes results.json and results.md to --out; --budget-s stops before a shape
that would start past the budget (the skipped shapes are listed).

    PYTHONPATH=<kernel overlay> python benchmarks/hisparse_kernels.py --out DIR [--quick] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
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
WARMUP_STEPS = 6  # before any timing (fills the hot buffer, first-call work)
I32 = torch.int32
# PCIe Gen5 x16: 32 GT/s x 16 lanes, 128b/130b coding, one direction.
PCIE_GEN5_X16_GBPS = round(32e9 * 16 * 128 / 130 / 8 / 1e9, 1)


@dataclass(frozen=True)
class Shape:
    rows: int
    rows_per_request: int
    hot_size: int


FULL = [Shape(r, 1, 4096) for r in (1, 8, 32, 64, 128, 256)] + \
       [Shape(r, 4, 10240) for r in (4, 32, 64, 128, 256)]
QUICK = [Shape(1, 1, 4096), Shape(64, 1, 4096), Shape(256, 1, 4096), Shape(8, 4, 10240), Shape(256, 4, 10240)]
SMOKE = [Shape(1, 1, 4096), Shape(8, 4, 10240)]  # --device cpu


class HostPool:
    """The host pool: pinned by cudaHostRegister on a GPU (ordinary memory on CPU)."""

    def __init__(self, gib: float, device: str):
        self.requested_gib, self.device = gib, device
        self.registered = False
        self.register_s = 0.0
        self.note = None
        nbytes = int(gib * 2**30)
        if device == "cuda":
            available = _available_gib()
            if available is not None and gib > available - 8:  # leave the OS and torch room
                nbytes = int(max(1.0, available - 8) * 2**30)
                self.note = f"{gib} GiB requested, {available} GiB available: pool shrunk to {nbytes / 2**30:.1f} GiB"
        rows = nbytes // ROW_BYTES
        self.tensor = torch.empty(rows, ROW_BYTES, dtype=torch.uint8)
        if device == "cuda":
            started = time.monotonic()
            err = torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), self.tensor.numel(), 0)
            if int(err) != 0:
                raise RuntimeError(f"cudaHostRegister of {nbytes / 2**30:.1f} GiB failed: error {int(err)}")
            self.registered = True
            self.register_s = round(time.monotonic() - started, 2)

    @property
    def rows(self) -> int:
        return self.tensor.shape[0]

    @property
    def gib(self) -> float:
        return round(self.tensor.numel() / 2**30, 2)

    def close(self) -> None:
        if self.registered:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
            self.registered = False


def _available_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


class Batch:
    """Inputs and state of one shape, identical for every implementation timed."""

    def __init__(self, shape: Shape, pool: HostPool, device: str, churn: float, steps: int, seed: int = 0):
        self.shape, self.device, self.pool = shape, device, pool
        rng = np.random.default_rng(seed)
        requests = shape.rows // shape.rows_per_request
        pages = CONTEXT_TOKENS // BLOCK
        pool_pages = pool.rows // BLOCK
        if pool_pages <= requests * pages:
            raise ValueError(f"a pool of {pool.gib} GiB is too small for {requests} requests")
        # Random pages across the whole pool (page 0 is the null page).
        picked = 1 + rng.choice(pool_pages - 1, size=requests * pages, replace=False)
        hot_blocks = shape.hot_size // BLOCK
        self.hot = torch.zeros(requests * hot_blocks + 1, BLOCK, ROW_BYTES, dtype=torch.uint8, device=device)
        self.hot_table = torch.arange(requests * hot_blocks, dtype=I32, device=device).view(requests, hot_blocks)
        self.source_table = torch.from_numpy(picked.astype(np.int32)).to(device).view(requests, pages)
        self.request_ids = torch.arange(requests, dtype=I32, device=device).repeat_interleave(shape.rows_per_request)
        self.states = torch.arange(requests, dtype=I32, device=device)
        self.row_states = self.states[self.request_ids.long()].contiguous()
        self.topk = [torch.from_numpy(t).to(device) for t in self._topk_steps(rng, requests, churn, steps)]
        self.static_topk = torch.empty_like(self.topk[0])  # what a captured step reads
        self.reset()

    def _topk_steps(self, rng, requests: int, churn: float, steps: int) -> list[np.ndarray]:
        rpr = self.shape.rows_per_request
        base = np.argsort(rng.random((requests, CONTEXT_TOKENS)), axis=1)[:, :TOP_K].copy()
        out = []
        for _ in range(steps):
            rows = []
            for request in range(requests):
                for _ in range(rpr):  # MTP rows of a request overlap (90% here)
                    row = base[request].copy()
                    if rpr > 1:
                        drift = rng.random(TOP_K) < 0.1
                        spare = np.setdiff1d(np.arange(CONTEXT_TOKENS), row, assume_unique=True)
                        row[drift] = rng.choice(spare, int(drift.sum()), replace=False)
                    rows.append(row)
            out.append(np.stack(rows).astype(np.int32))
            for request in range(requests):  # the next step: `churn` of the positions change
                change = rng.random(TOP_K) < churn
                spare = np.setdiff1d(np.arange(CONTEXT_TOKENS), base[request], assume_unique=True)
                base[request][change] = rng.choice(spare, int(change.sum()), replace=False)
        return out

    def reset(self) -> None:
        rows, dev = self.shape.rows, self.device
        requests = rows // self.shape.rows_per_request
        self.dgi = torch.full((requests, self.shape.hot_size), -1, dtype=I32, device=dev)
        self.lru = torch.arange(self.shape.hot_size, dtype=torch.int16, device=dev).repeat(requests, 1).contiguous()
        grid = dict(dtype=I32, device=dev)
        self.hot_indices = torch.empty(rows, TOP_K, **grid)
        self.attention = torch.empty(rows, TOP_K, **grid)
        self.miss_mask = torch.zeros(rows, TOP_K, **grid)
        self.resolved = torch.empty(rows, TOP_K, **grid)
        self.swap_host = torch.empty(rows, TOP_K, **grid)
        self.swap_dev = torch.empty(rows, TOP_K, **grid)
        self.swap_counts = torch.zeros(rows, **grid)
        self.valid = torch.empty(rows, **grid)
        self.stats = torch.zeros(2, dtype=torch.uint64, device=dev)

    def resolve(self, ops, topk: torch.Tensor) -> None:
        s = self.shape
        ops.hisparse_resolve_residency(
            self.pool.tensor, self.hot, self.hot_table, topk, self.hot_indices, self.dgi, self.lru, self.states,
            s.hot_size, s.rows_per_request * TOP_K, self.miss_mask, self.stats, self.attention, BLOCK,
            self.request_ids, self.source_table, BLOCK, self.resolved, self.valid, self.swap_host, self.swap_dev,
            self.swap_counts, None, 0, 0)

    def gather_compact(self, ops) -> None:
        ops.hisparse_gather_compact(self.pool.tensor, self.hot, self.swap_host, self.swap_dev, self.swap_counts)

    def gather_plan(self, ops) -> None:
        ops.hisparse_gather_plan(self.pool.tensor, self.hot, self.resolved, self.hot_indices, self.miss_mask,
                                 self.row_states, None, 0)


def time_eager_ms(fn, calls: int, device: str) -> float:
    """Median time of one call issued eagerly (on a GPU: between events, host launch gaps included)."""
    samples = []
    for i in range(calls):
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


def capture(fn) -> torch.cuda.CUDAGraph:
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def time_replays_ms(graph: torch.cuda.CUDAGraph, before_each, replays: int) -> float:
    """Median GPU time of one replay; `before_each(i)` (not timed) refills the captured inputs."""
    samples = []
    for i in range(replays):
        before_each(i)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        samples.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in samples)


def resolver_row(name: str, ops, shape: Shape, pool: HostPool, device: str, replays: int, churn: float) -> dict:
    batch = Batch(shape, pool, device, churn, steps=WARMUP_STEPS + 3 * replays + 1)  # +1: the capture's input
    steps = iter(batch.topk)
    for _ in range(WARMUP_STEPS):  # fills the hot buffer; first-call work happens outside any capture
        batch.resolve(ops, next(steps))
        batch.gather_compact(ops)
    row = {"impl": name, **asdict(shape)}
    before = batch.stats.cpu().tolist()

    def feed(i):
        batch.static_topk.copy_(next(steps))

    def step():
        batch.resolve(ops, batch.static_topk)
        batch.gather_compact(ops)

    if device == "cuda":
        feed(0)
        row["resolve_plus_gather_ms"] = round(time_replays_ms(capture(step), feed, replays), 4)
        hits, misses = (a - b for a, b in zip(batch.stats.cpu().tolist(), before, strict=True))
        resolve_graph = capture(lambda: batch.resolve(ops, batch.static_topk))
        row["resolve_ms"] = round(time_replays_ms(resolve_graph, feed, replays), 4)
    else:
        for _ in range(replays):
            next(steps)
    before_eager = batch.stats.cpu().tolist()

    def eager_step(i):
        batch.resolve(ops, next(steps))
        batch.gather_compact(ops)

    row["resolve_plus_gather_eager_ms"] = round(time_eager_ms(eager_step, replays, device), 4)
    if device != "cuda":
        hits, misses = (a - b for a, b in zip(batch.stats.cpu().tolist(), before_eager, strict=True))
    row["miss_rate"] = round(misses / max(1, hits + misses), 4)
    return row


def bench_resolver(impls: dict, shape: Shape, pool: HostPool, device: str, replays: int, churn: float) -> list[dict]:
    return [resolver_row(name, ops, shape, pool, device, replays, churn) for name, ops in impls.items()]


def gather_once(name: str, ops, shape: Shape, pool: HostPool, device: str, replays: int, dma_gbps: float | None) -> dict:
    batch = Batch(shape, pool, device, churn=0.0, steps=1)
    batch.resolve(ops, batch.topk[0])  # cold: every valid position is a miss
    rows = int(batch.swap_counts.sum())
    nbytes = rows * ROW_BYTES
    if device == "cuda":
        compact_ms = time_replays_ms(capture(lambda: batch.gather_compact(ops)), lambda i: None, replays)
        plan_ms = time_replays_ms(capture(lambda: batch.gather_plan(ops)), lambda i: None, replays)
    else:
        compact_ms = time_eager_ms(lambda i: batch.gather_compact(ops), replays, device)
        plan_ms = time_eager_ms(lambda i: batch.gather_plan(ops), replays, device)

    def gbps(ms: float) -> float:
        return nbytes / (ms * 1e-3) / 1e9

    row = {"impl": name, **asdict(shape), "rows_copied": rows, "bytes": nbytes,
           "gather_compact_gbps": round(gbps(compact_ms), 2), "gather_plan_gbps": round(gbps(plan_ms), 2),
           "gather_compact_vs_link": round(gbps(compact_ms) / PCIE_GEN5_X16_GBPS, 3),
           "gather_plan_vs_link": round(gbps(plan_ms) / PCIE_GEN5_X16_GBPS, 3)}
    if dma_gbps:
        row["gather_compact_vs_dma"] = round(gbps(compact_ms) / dma_gbps, 3)
        row["gather_plan_vs_dma"] = round(gbps(plan_ms) / dma_gbps, 3)
    return row


def dma_reference(pool: HostPool, device: str, mib: int) -> dict:
    """One large pinned host-to-device copy from the pool: the link's practical rate here."""
    if device != "cuda":
        return {"dma_gbps": None, "note": "no DMA on CPU"}
    nbytes = min(mib * 2**20, pool.tensor.numel())
    src = pool.tensor.view(-1)[:nbytes]
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src, non_blocking=True)  # warm
    samples = []
    for _ in range(3):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end))
    ms = statistics.median(samples)
    return {"dma_bytes": nbytes, "dma_ms": round(ms, 3), "dma_gbps": round(nbytes / (ms * 1e-3) / 1e9, 2)}


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
    dma = meta.get("dma", {})
    lines = [f"# HiSparse kernels ({meta.get('gpu', meta['device'])}, torch {meta['torch']})", "",
             f"bundled: {meta['bundled_identity']['version']} sha256 {meta['bundled_identity']['source_sha256'][:12]}"
             f"; vLLM: {meta.get('vllm', 'not compared')}; timing: {meta['timing']}", "",
             f"host pool: {meta['pool']['gib']} GiB ({'cudaHostRegister, ' + str(meta['pool']['register_s']) + ' s' if meta['pool']['registered'] else 'not pinned'})"
             f"{'; ' + meta['pool']['note'] if meta['pool'].get('note') else ''}; large DMA "
             f"{dma.get('dma_gbps')} GB/s; link nominal {PCIE_GEN5_X16_GBPS} GB/s (PCIe Gen5 x16)", "",
             "## Resolver per decode step (top-K 2,048, 656-byte rows)", "",
             "| impl | rows | rows/request | hot rows | resolve ms | resolve + gather ms | eager resolve + gather ms | miss rate |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['impl']} | {r['rows']} | {r['rows_per_request']} | {r['hot_size']} | {r.get('resolve_ms', '-')} | "
              f"{r.get('resolve_plus_gather_ms', '-')} | {r['resolve_plus_gather_eager_ms']} | {r['miss_rate']} |"
              for r in resolver]
    lines += ["", "## Gathers of a cold step (random rows of the pool) vs a large DMA and the link", "",
              "| impl | rows | rows/request | MiB | compact GB/s | compact/DMA | compact/link | plan GB/s | plan/DMA | plan/link |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {g['impl']} | {g['rows']} | {g['rows_per_request']} | {g['bytes'] / 2**20:.1f} | "
              f"{g['gather_compact_gbps']} | {g.get('gather_compact_vs_dma', '-')} | {g['gather_compact_vs_link']} | "
              f"{g['gather_plan_gbps']} | {g.get('gather_plan_vs_dma', '-')} | {g['gather_plan_vs_link']} |"
              for g in gather]
    if meta.get("skipped"):
        lines += ["", f"Not run (time budget): {', '.join(meta['skipped'])}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="five shapes (1 to 256 rows, both hot sizes)")
    parser.add_argument("--replays", type=int, default=None, help="graph replays per timing")
    parser.add_argument("--churn", type=float, default=0.1, help="share of top-K positions new each step")
    parser.add_argument("--pool-gib", type=float, default=None,
                        help="host pool size (default 32 on a GPU, 0.25 on CPU)")
    parser.add_argument("--dma-mib", type=int, default=1024, help="size of the reference DMA copy")
    parser.add_argument("--budget-s", type=float, default=None, help="start no shape after this many seconds")
    args = parser.parse_args()
    started = time.monotonic()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device visible to torch (use --device cpu for a smoke run)")
    shapes = SMOKE if args.device == "cpu" else (QUICK if args.quick else FULL)
    replays = args.replays or (3 if args.device == "cpu" else (8 if args.quick else 20))
    impls, meta = implementations(args.device)
    pool = HostPool(args.pool_gib or (32.0 if args.device == "cuda" else 0.25), args.device)
    meta["pool"] = {"gib": pool.gib, "requested_gib": pool.requested_gib, "registered": pool.registered,
                    "register_s": pool.register_s, "note": pool.note}
    meta["timing"] = ("CUDA graph replays (GPU events), median of " + str(replays) if args.device == "cuda"
                      else "eager, wall clock (CPU smoke)")
    meta["dma"] = dma_reference(pool, args.device, args.dma_mib)
    meta["link_nominal_gbps"] = PCIE_GEN5_X16_GBPS
    args.out.mkdir(parents=True, exist_ok=True)
    resolver, gather, meta["skipped"] = [], [], []
    try:
        for shape in shapes:
            if args.budget_s is not None and time.monotonic() - started > args.budget_s:
                meta["skipped"].append(f"{shape.rows}x{shape.rows_per_request}/{shape.hot_size}")
                continue
            resolver += bench_resolver(impls, shape, pool, args.device, replays, args.churn)
            gather += [gather_once(name, ops, shape, pool, args.device, replays, meta["dma"].get("dma_gbps"))
                       for name, ops in impls.items()]
            print(f"done rows={shape.rows} hot={shape.hot_size} ({time.monotonic() - started:.0f}s)", flush=True)
            (args.out / "results.json").write_text(  # after every shape: a budget kill keeps what ran
                json.dumps({"meta": meta, "resolver": resolver, "gather": gather}, indent=2))
    finally:
        pool.close()
    meta["seconds"] = round(time.monotonic() - started, 1)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "resolver": resolver, "gather": gather},
                                                      indent=2))
    table = markdown(meta, resolver, gather)
    (args.out / "results.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_PLUGINS", "")  # vLLM's ops stay vLLM's for the side-by-side
    raise SystemExit(main())
