"""Where a request's KV lives: admission with prefix caching, growth, the offload connector's CPU pool,
and Hybrid HiSparse's full and mixed residency (docs/facts.md §3-4, the blog's "Technical Implementation").

HiSparse accounting follows the blog's concurrency calculator so the engine's capacity can be checked
against it: the GPU pool is counted in HMA pages; a fully resident 64-token block costs
ceil(full block bytes / page bytes) pages; a request in mixed residency holds one index page per 64
tokens (the indexer KV never leaves the GPU) plus hot_groups x (ceil(hot_rows/64) + retained_pages)
pages of hot buffer and retained tail, and its sparse-MLA rows live in the host pool.

Offload connector (offload_prompt_only, vLLM's default true): only blocks inside the prompt are stored to
the CPU pool; blocks a request generates stay on the GPU (prefix-cached there, hashed as vLLM hashes every
full block) and are stored only when offload_prompt_only is false. A later turn re-sends the reply as
part of its prompt, and those blocks are stored then.

Miss model (sim.hisparse_miss_rate, else the hardware profile's calibrated rate, else 0.05): each query token of a mixed request
selects min(top-K, context) rows per layer, spread uniformly over its context, so the share from
host-only pages is (context - resident tail) / context. A cold hot buffer (the first step after the
request turns mixed, and every prefill chunk) misses all of those; once warm, 5% miss. The blog gives no
hit rate, only that 2x top-K rows "ensures a high hit rate"; consecutive decode steps select mostly the
same rows, so a warm buffer misses only the rows new to the top-K, and 5% is our assumption for that.
"""

from __future__ import annotations

import math

from harness.sim.state import KVPools, RequestState, StepTransfers


class Residency:
    def __init__(self, pools: KVPools):
        self.pools = pools
        self.config = pools.config
        self.block_size = pools.config.block_size

    # ---------------------------------------------------------------- admission

    def admit(self, state: RequestState, budget: int, now_s: float) -> int | None:
        """Give a waiting request its KV; the tokens it computes this step (0 while loading), or None."""
        pools, config, block_size = self.pools, self.config, self.block_size
        total = state.num_tokens
        hashes = list(state.req.block_hashes[:(total - 1) // block_size]) if config.enable_prefix_caching else []
        gpu_hit = pools.gpu.longest_prefix(hashes)
        if config.policy == "hisparse":
            host_hit = self._host_prefix(hashes)
            if host_hit > len(gpu_hit):
                return self._start_mixed(state, hashes, host_hit, budget, now_s)
        for block in gpu_hit:
            pools.gpu.acquire(block)
        state.kv_blocks = list(gpu_hit)
        computed = len(gpu_hit) * block_size
        loaded: list[int] = []
        if config.policy == "offload" and pools.cpu is not None:
            loaded = hashes[len(gpu_hit):len(gpu_hit) + pools.cpu.prefix_length(hashes[len(gpu_hit):])]
        n = 0 if loaded else min(total - computed, budget)
        while not self._grow_full(state, computed + len(loaded) * block_size + n):
            if not (config.policy == "hisparse" and self.relieve(needed_by=None)):
                self._drop(state)
                if config.policy == "hisparse":
                    return self._start_mixed(state, hashes, self._host_prefix(hashes), budget, now_s)
                return None
        for i, h in enumerate(loaded):
            pools.gpu.set_hash(state.kv_blocks[len(gpu_hit) + i], h)
        self._count_lookup(state, hits_tokens=computed, external_tokens=len(loaded) * block_size)
        state.num_computed = computed + len(loaded) * block_size
        state.cached_tokens = state.num_computed
        if loaded:
            nbytes = len(loaded) * pools.cpu_block_bytes
            seconds = nbytes / config.hardware.h2d_bytes_per_s
            pools.counters.kv_offload_load_bytes += nbytes
            pools.counters.kv_offload_load_time_s += seconds
            state.ready_at_s = now_s + seconds
        self.on_computed(state, 0)
        return n

    def _start_mixed(self, state: RequestState, hashes: list[int], hit_blocks: int, budget: int,
                     now_s: float) -> int | None:
        """No residency: the prefix lives only on the host; placeholders, index pages and a hot buffer."""
        pools, block_size = self.pools, self.block_size
        assert pools.host is not None
        computed = hit_blocks * block_size
        n = min(state.num_tokens - computed, budget)
        state.mode = "mixed"
        for h in hashes[:hit_blocks]:
            block = pools.host.lookup(h)
            assert block is not None
            pools.host.acquire(block)
            state.host_blocks.append(block)
        hot = None
        while hot is None:
            hot = pools.gpu.allocate(1, self.config.hot_pages_per_request, "hot")
            if hot is None and not self.relieve(needed_by=None):
                self._drop(state)
                return None
        state.hot_blocks = hot
        while not self._grow_mixed(state, computed + n):
            if not self.relieve(needed_by=None):
                self._drop(state)
                return None
        self._count_lookup(state, hits_tokens=0, external_tokens=computed)
        state.num_computed = computed
        state.cached_tokens = computed
        state.hot_warm = False
        if hit_blocks:
            # the indexer KV of the prefix comes back from the offload connector's CPU pool
            nbytes = hit_blocks * self.config.sizing.indexer_block_bytes
            seconds = nbytes / self.config.hardware.h2d_bytes_per_s
            pools.counters.kv_offload_load_bytes += nbytes
            pools.counters.kv_offload_load_time_s += seconds
            state.ready_at_s = now_s + seconds
            return 0
        return n

    def _host_prefix(self, hashes: list[int]) -> int:
        """Blocks of the prefix HiSparse can start from: sparse rows in the host pool, indexer KV on CPU."""
        pools = self.pools
        assert pools.host is not None
        n = pools.host.prefix_length(hashes)
        return min(n, pools.cpu.prefix_length(hashes[:n])) if pools.cpu is not None else 0

    def _count_lookup(self, state: RequestState, hits_tokens: int, external_tokens: int) -> None:
        counters = self.pools.counters
        counters.prefix_cache_queries += state.num_tokens
        counters.prefix_cache_hits += hits_tokens
        if self.pools.cpu is not None:
            counters.external_prefix_cache_queries += state.num_tokens - hits_tokens
            counters.external_prefix_cache_hits += external_tokens

    # ---------------------------------------------------------------- growth and pressure

    def grow(self, state: RequestState, target_tokens: int) -> bool:
        if state.mode == "mixed":
            return self._grow_mixed(state, target_tokens)
        return self._grow_full(state, target_tokens)

    def _grow_full(self, state: RequestState, target_tokens: int) -> bool:
        extra = math.ceil(target_tokens / self.block_size) - len(state.kv_blocks)
        if extra <= 0:
            return True
        blocks = self.pools.gpu.allocate(extra, self.config.pages_per_kv_block, "kv")
        if blocks is None:
            return False
        state.kv_blocks.extend(blocks)
        return True

    def _grow_mixed(self, state: RequestState, target_tokens: int) -> bool:
        pools = self.pools
        assert pools.host is not None
        need = math.ceil(target_tokens / self.block_size)
        extra_host = need - len(state.host_blocks)
        if extra_host > 0 and not pools.host.can_allocate(extra_host):
            return False
        extra = need - len(state.index_blocks)
        if extra > 0:
            blocks = pools.gpu.allocate(extra, 1, "index")
            if blocks is None:
                return False
            state.index_blocks.extend(blocks)
        if extra_host > 0:
            state.host_blocks.extend(pools.host.allocate(extra_host, 1, "kv") or [])
        return True

    def relieve(self, needed_by: RequestState | None) -> bool:
        """HiSparse under pressure: move the fully resident request that frees most pages to mixed
        residency (its rows are already mirrored on the host, so no copy). False when none would help."""
        pools, config = self.pools, self.config
        if config.policy != "hisparse":
            return False
        assert pools.host is not None
        best, best_gain = None, 0
        for s in pools.running:
            if s.mode != "full" or not s.kv_blocks:
                continue
            freed = sum(b.pages for b in s.kv_blocks if b.ref_count == 1)
            gain = freed - len(s.kv_blocks) - config.hot_pages_per_request
            unmirrored = len(s.kv_blocks) - len(s.host_blocks)
            if gain > best_gain and pools.host.can_allocate(max(0, unmirrored)):
                best, best_gain = s, gain
        if best is None:
            return False
        self._spill(best)
        return True

    def _spill(self, state: RequestState) -> None:
        pools = self.pools
        assert pools.host is not None
        missing = len(state.kv_blocks) - len(state.host_blocks)
        if missing > 0:
            state.host_blocks.extend(pools.host.allocate(missing, 1, "kv") or [])
        n_blocks = len(state.kv_blocks)
        pools.gpu.release(state.kv_blocks)
        state.kv_blocks = []
        state.hot_blocks = pools.gpu.allocate(1, self.config.hot_pages_per_request, "hot") or []
        state.index_blocks = pools.gpu.allocate(n_blocks, 1, "index") or []
        state.mode = "mixed"
        state.hot_warm = False
        pools.counters.hisparse_spills += 1

    # ---------------------------------------------------------------- completion and release

    def on_computed(self, state: RequestState, before_tokens: int) -> None:
        """Blocks completed in this step: hash them (prefix cache), store to CPU, mirror to the host."""
        pools, config, block_size = self.pools, self.config, self.block_size
        hashes = state.req.block_hashes
        offloadable = state.req.prompt_tokens // block_size if config.offload_prompt_only else len(hashes)
        for i in range(before_tokens // block_size, state.num_computed // block_size):
            h = hashes[i] if i < len(hashes) else None
            if state.mode == "full" and h is not None and i < len(state.kv_blocks):
                pools.gpu.set_hash(state.kv_blocks[i], h)
            if pools.cpu is not None and h is not None and i < offloadable and pools.cpu.lookup(h) is None:
                stored = pools.cpu.allocate(1, 1, "kv")
                if stored is not None:
                    pools.cpu.set_hash(stored[0], h)
                    pools.cpu.release(stored)
                    pools.counters.kv_offload_store_bytes += pools.cpu_block_bytes
                    pools.counters.kv_offload_store_time_s += pools.cpu_block_bytes / config.hardware.d2h_bytes_per_s
            if pools.host is not None:
                self._mirror(state, i, h)

    def _mirror(self, state: RequestState, index: int, content_hash: int | None) -> None:
        """Eager host mirror of a completed block (mixed requests already own their host blocks)."""
        host = self.pools.host
        assert host is not None
        if index < len(state.host_blocks):
            if content_hash is not None:
                host.set_hash(state.host_blocks[index], content_hash)
            return
        if index != len(state.host_blocks):
            return  # an earlier block could not be mirrored: the mirror stays a prefix
        existing = host.lookup(content_hash) if content_hash is not None else None
        if existing is not None:
            host.acquire(existing)
            state.host_blocks.append(existing)
            return
        blocks = host.allocate(1, 1, "kv")
        if blocks is not None:
            if content_hash is not None:
                host.set_hash(blocks[0], content_hash)
            state.host_blocks.append(blocks[0])

    def _drop(self, state: RequestState) -> None:
        self.release(state)
        state.mode = "full"

    def release(self, state: RequestState) -> None:
        pools = self.pools
        pools.gpu.release(state.kv_blocks + state.index_blocks + state.hot_blocks)
        if pools.host is not None:
            pools.host.release(state.host_blocks)
        state.kv_blocks, state.index_blocks, state.hot_blocks, state.host_blocks = [], [], [], []

    # ---------------------------------------------------------------- per-step transfers

    def step_transfers(self, scheduled: list[tuple[RequestState, int]]) -> StepTransfers:
        """Host-to-device copies the step waits for: hot-buffer misses of mixed requests, in bytes and in
        the host pages they come from (the misses spread uniformly over a request's host-only pages, so m
        misses over P pages touch P * (1 - (1 - 1/P)^m) of them)."""
        config, counters = self.config, self.pools.counters
        layers = config.model.num_layers
        tail = (config.model.retained_pages or 0) * self.block_size
        decode_tokens = 1 + config.num_speculative_tokens
        total_bytes = 0.0
        total_pages = 0.0
        for state, n in scheduled:
            if state.mode != "mixed":
                continue
            context = state.num_computed + n
            selected = min(config.index_topk, context)
            host_only = max(0, state.num_computed - tail)
            from_host = selected * n * host_only / context if context else 0.0
            cold = (not state.hot_warm) or n > decode_tokens
            misses = min(host_only, from_host) if cold else from_host * config.hisparse_miss_rate
            misses = int(round(misses))
            hits = max(0, selected * n - misses)
            counters.hisparse_cache_misses += misses * layers
            counters.hisparse_cache_hits += hits * layers
            nbytes = misses * layers * config.sizing.sparse_row_bytes
            counters.hisparse_host_to_device_bytes += nbytes
            total_bytes += nbytes
            host_pages = math.ceil(host_only / self.block_size)
            if misses and host_pages:
                total_pages += host_pages * (1.0 - (1.0 - 1.0 / host_pages) ** misses)
            if n <= decode_tokens:
                state.hot_warm = True
        return StepTransfers(h2d_bytes=total_bytes, pages=int(round(total_pages)))

    # ---------------------------------------------------------------- invariants

    def check(self, state: RequestState) -> str:
        need = math.ceil(state.num_computed / self.block_size)
        rid = state.req.request_id
        if state.mode == "full":
            if len(state.kv_blocks) < need:
                return f"{rid}: {len(state.kv_blocks)} resident blocks for {state.num_computed} tokens"
            return ""
        if len(state.index_blocks) < need:
            return f"{rid}: {len(state.index_blocks)} index pages for {state.num_computed} tokens"
        if sum(b.pages for b in state.hot_blocks) != self.config.hot_pages_per_request:
            return f"{rid}: hot buffer of {sum(b.pages for b in state.hot_blocks)} pages"
        if len(state.host_blocks) < need:
            return f"{rid}: {len(state.host_blocks)} host blocks for {state.num_computed} tokens"
        return ""
