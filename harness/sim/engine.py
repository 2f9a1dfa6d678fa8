"""The simulated engine: vLLM v1's scheduler over one GPU page pool, with a KV residency policy.

Clock-agnostic: `step(now_s)` schedules one batch, advances every request in it and returns how long the
step took; the caller (the live server or the virtual-time driver) owns the clock. Policies:
- none: GPU only; a running request that cannot grow preempts the most recently admitted (recompute).
- offload: as none, plus the OffloadingConnector: computed prompt blocks are stored to a CPU pool (LRU)
  and a later prefix hit there is loaded back at host-to-device bandwidth before the request runs.
- hisparse: Hybrid HiSparse (see residency.py): full residency while the pool has room; under pressure
  requests move to mixed residency (index pages + hot buffer on the GPU, sparse-MLA rows on the host).
"""

from __future__ import annotations

import random
from collections import deque

from harness.errors import HarnessError
from harness.sim.counters import EngineCounters, EngineGauges, EngineHistograms
from harness.sim.kvpool import PagePool
from harness.sim.residency import Residency
from harness.sim.state import (
    EngineConfig,
    FinishedRequest,
    KVPools,
    Policy,
    RequestState,
    SimRequest,
    StepRecord,
    StepResult,
)
from harness.sim.steptime import BatchItem, step_cost

__all__ = ["Engine", "EngineConfig", "FinishedRequest", "Policy", "RequestState", "SimRequest", "StepRecord",
           "StepResult"]

STEP_RECORD_LEN = 16384  # the latest steps the engine keeps a record of (a few minutes of a live server)

class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.gpu = PagePool(config.pool_pages)
        self.cpu: PagePool | None = None
        self.host: PagePool | None = None
        if config.offload_cpu_bytes and config.policy in ("offload", "hisparse"):
            cpu_block = (config.sizing.indexer_block_bytes if config.policy == "hisparse"
                         else config.sizing.full_block_bytes)
            self.cpu = PagePool(config.offload_cpu_bytes // cpu_block)
        if config.policy == "hisparse":
            if not config.host_pool_bytes:
                raise HarnessError("the hisparse policy needs a host pool (kv.hisparse.host_pool_gib)")
            self.host = PagePool(config.host_pool_bytes // config.sizing.host_block_bytes)
            if config.hot_pages_per_request >= self.gpu.capacity_pages:
                raise HarnessError(f"a HiSparse hot buffer ({config.hot_pages_per_request} pages) does not fit "
                                   f"the GPU pool ({self.gpu.capacity_pages} pages); shrink the hot rows")
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.counters = EngineCounters()
        self.pools = KVPools(config=config, gpu=self.gpu, cpu=self.cpu, host=self.host, counters=self.counters,
                             running=self.running)
        self.residency = Residency(self.pools)  # the policy half of the engine
        self.histograms = EngineHistograms()
        self._rng = random.Random(config.seed)
        self._order = 0
        self._ids: set[str] = set()
        self._pending_h2d_bytes = 0.0
        self._pending_pages = 0  # host pages the step in flight copies (HiSparse)
        # the engine's own record of its latest steps, with the scheduler's stats of each (StepRecord)
        self.step_record: deque[StepRecord] = deque(maxlen=STEP_RECORD_LEN)
        self._step_index = 0

    @property
    def cpu_block_bytes(self) -> int:
        return self.pools.cpu_block_bytes

    # ---------------------------------------------------------------- interface

    def add_request(self, req: SimRequest, now_s: float) -> None:
        if req.request_id in self._ids:
            raise HarnessError(f"request id {req.request_id} already in the engine")
        if req.prompt_tokens + 1 > self.config.max_model_len:
            raise HarnessError(f"prompt of {req.prompt_tokens} tokens exceeds max_model_len "
                               f"{self.config.max_model_len}")
        self._ids.add(req.request_id)
        self.waiting.append(RequestState(req=req, arrival_s=now_s))

    def abort(self, request_id: str) -> bool:
        """Drop a request (its client went away); False when the engine does not hold it."""
        for state in self.running:
            if state.req.request_id == request_id:
                self.running.remove(state)
                self.residency.release(state)
                self._ids.discard(request_id)
                return True
        for state in self.waiting:
            if state.req.request_id == request_id:
                self.waiting.remove(state)
                self._ids.discard(request_id)
                return True
        return False

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def gauges(self) -> EngineGauges:
        return EngineGauges(
            num_requests_running=len(self.running),
            num_requests_waiting=len(self.waiting),
            kv_cache_usage_perc=self.gpu.usage,
            kv_offload_cpu_cache_usage_perc=(
                1.0 - self.cpu.free_pages / self.cpu.capacity_pages if self.cpu and self.cpu.capacity_pages
                else (0.0 if self.cpu else None)),
            hisparse_host_cache_usage_perc=(
                1.0 - self.host.free_pages / self.host.capacity_pages if self.host else None),
            # the copies of the step in flight; none once nothing runs
            hisparse_pending_page_transfers=(self._pending_pages if self.running else 0) if self.host else None,
        )

    def step(self, now_s: float) -> StepResult:
        """Schedule and run one batch starting at `now_s`; idle (duration to the next ready time) if none."""
        scheduled, preempted = self._schedule(now_s)
        if not scheduled:
            self._pending_pages = 0
            loading = [r.ready_at_s for r in self.running if r.ready_at_s > now_s]
            idle = (min(loading) - now_s) if loading else 0.0
            aborted = []
            if not self.running and self.waiting:
                # nothing runs and the head of the queue still does not fit: it never will
                state = self.waiting.popleft()
                self._ids.discard(state.req.request_id)
                aborted.append(state.req.request_id)
            return StepResult(now_s, idle, {}, [], preempted, 0, aborted, self._record(now_s, idle, 0))
        items = [BatchItem(n, r.num_computed + n, self._sampled(r, n), self._is_prefill(r)) for r, n in scheduled]
        transfers = self.residency.step_transfers(scheduled)
        self._pending_pages = transfers.pages
        h2d = transfers.h2d_bytes + self._pending_h2d_bytes
        self._pending_h2d_bytes = 0.0
        cost = step_cost(items, model=self.config.model, hardware=self.config.hardware,
                         tensor_parallel_size=self.config.tensor_parallel_size,
                         index_topk=self.config.index_topk, sparse_row_bytes=self.config.sizing.sparse_row_bytes,
                         h2d_bytes=h2d)
        duration_s = cost.total_s * self.config.step_time_factor
        end_s = now_s + duration_s
        tokens: dict[str, int] = {}
        finished: list[FinishedRequest] = []
        for state, n in scheduled:
            emitted = self._advance(state, n)
            if emitted:
                tokens[state.req.request_id] = emitted
                self._record_tokens(state, emitted, end_s)
            if self._is_done(state):
                finished.append(self._finish(state, end_s))
        scheduled_tokens = sum(n for _, n in scheduled)
        self.counters.steps += 1
        self.counters.step_tokens += scheduled_tokens
        self.counters.busy_s += duration_s
        return StepResult(now_s, duration_s, tokens, finished, preempted, scheduled_tokens,
                          record=self._record(now_s, duration_s, len(scheduled)))

    def _record(self, start_s: float, duration_s: float, scheduled: int) -> StepRecord:
        """The step's record with the stats vLLM's scheduler makes once the step's outputs are in."""
        record = StepRecord(self._step_index, start_s, start_s + duration_s, scheduled, self.gauges())
        self._step_index += 1
        self.step_record.append(record)
        return record

    # ---------------------------------------------------------------- scheduling

    @staticmethod
    def _is_prefill(state: RequestState) -> bool:
        return state.num_tokens - state.num_computed > 1 or state.num_output == 0

    def _sampled(self, state: RequestState, n: int) -> int:
        """Positions through the LM head: a decode step's every token, a prefill chunk's last if it ends it."""
        if self._is_prefill(state):
            return 1 if n >= state.num_tokens - state.num_computed else 0
        return n

    def _tokens_wanted(self, state: RequestState) -> int:
        remaining = state.num_tokens - state.num_computed
        if remaining > 1 or state.num_output == 0:
            return remaining  # prefill (or recompute) still to do
        k = self.config.num_speculative_tokens
        return max(1, min(1 + k, self.config.max_model_len - state.num_computed))

    def _schedule(self, now_s: float) -> tuple[list[tuple[RequestState, int]], list[str]]:
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[RequestState, int]] = []
        preempted: list[str] = []
        for state in list(self.running):
            if state not in self.running or state.ready_at_s > now_s or budget <= 0:
                continue
            n = min(self._tokens_wanted(state), budget)
            while not self.residency.grow(state, state.num_computed + n):
                if self.residency.relieve(needed_by=state):
                    continue  # HiSparse moved a request to mixed residency: try again
                victim = max(self.running, key=lambda s: s.order)  # the most recently admitted
                self._preempt(victim, preempted)
                for i, (s, m) in enumerate(scheduled):
                    if s is victim:
                        budget += m
                        del scheduled[i]
                        break
                if victim is state:
                    break
            else:
                scheduled.append((state, n))
                budget -= n
                if state.first_scheduled_s is None:
                    state.first_scheduled_s = now_s
        if preempted:
            return scheduled, preempted  # as vLLM: no admissions in a step that preempted
        while self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
            state = self.waiting[0]
            n = self.residency.admit(state, budget, now_s)
            if n is None:
                break
            self.waiting.popleft()
            self._order += 1
            state.order = self._order
            self.running.append(state)
            if state.first_scheduled_s is None:
                state.first_scheduled_s = now_s
            if state.ready_at_s > now_s or n == 0:
                continue
            scheduled.append((state, n))
            budget -= n
        return scheduled, preempted

    def _preempt(self, state: RequestState, preempted: list[str]) -> None:
        self.running.remove(state)
        self.residency.release(state)
        state.num_computed = 0
        state.mode = "full"
        state.hot_warm = False
        state.ready_at_s = 0.0
        state.preemptions += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(state)
        preempted.append(state.req.request_id)

    # ---------------------------------------------------------------- advancing

    def _advance(self, state: RequestState, n: int) -> int:
        """Apply a step of `n` computed tokens; return the tokens the request emits."""
        before = state.num_computed
        remaining = state.num_tokens - before
        if remaining > 1 or (remaining == 1 and state.num_output == 0):
            state.num_computed = before + n
            self.residency.on_computed(state, before)
            if state.num_computed < state.num_tokens:
                return 0
            state.num_output += 1
            return 1
        k = n - 1
        accepted = 0
        while accepted < k and self._rng.random() < self.config.draft_acceptance:
            accepted += 1
        if k > 0:
            self.counters.spec_decode_num_drafts += 1
            self.counters.spec_decode_num_draft_tokens += k
            self.counters.spec_decode_num_accepted_tokens += accepted
        emitted = min(1 + accepted, state.req.output_tokens - state.num_output,
                      self.config.max_model_len - state.num_tokens)
        emitted = max(emitted, 1)
        state.num_computed = before + emitted
        state.num_output += emitted
        self.residency.on_computed(state, before)
        return emitted

    def _record_tokens(self, state: RequestState, emitted: int, at_s: float) -> None:
        self.counters.generation_tokens += emitted
        if state.first_token_s is None:
            state.first_token_s = at_s
            self.histograms.time_to_first_token.observe(at_s - state.arrival_s)
        elif state.last_token_s is not None:
            self.histograms.inter_token_latency.observe(at_s - state.last_token_s)
        state.last_token_s = at_s

    def _is_done(self, state: RequestState) -> bool:
        return (state.num_output >= state.req.output_tokens
                or state.num_tokens >= self.config.max_model_len)

    def _finish(self, state: RequestState, at_s: float) -> FinishedRequest:
        self.running.remove(state)
        self.residency.release(state)
        self._ids.discard(state.req.request_id)
        c, h = self.counters, self.histograms
        c.request_success += 1
        c.prompt_tokens += state.req.prompt_tokens
        first_sched = state.first_scheduled_s if state.first_scheduled_s is not None else state.arrival_s
        first_token = state.first_token_s if state.first_token_s is not None else at_s
        h.e2e_request_latency.observe(at_s - state.arrival_s)
        h.request_queue_time.observe(first_sched - state.arrival_s)
        h.request_prefill_time.observe(first_token - first_sched)
        h.request_decode_time.observe(at_s - first_token)
        if state.num_output > 1:
            h.request_time_per_output_token.observe((at_s - first_token) / (state.num_output - 1))
        reason = "length" if state.num_output >= state.req.max_tokens else "stop"
        if reason == "stop":
            c.request_success_stop += 1
        return FinishedRequest(
            request_id=state.req.request_id, prompt_tokens=state.req.prompt_tokens,
            output_tokens=state.num_output, arrival_s=state.arrival_s, first_scheduled_s=first_sched,
            first_token_s=first_token, finished_s=at_s, preemptions=state.preemptions,
            cached_tokens=state.cached_tokens, finish_reason=reason)

    # ---------------------------------------------------------------- checks

    def check_invariants(self) -> list[str]:
        """Violations of the engine's invariants (empty when all hold); tests call it after every step."""
        problems = []
        for name, pool in (("gpu", self.gpu), ("cpu", self.cpu), ("host", self.host)):
            if pool is not None and not pool.conserved():
                problems.append(f"{name} pool pages not conserved")
        ids = [s.req.request_id for s in self.running] + [s.req.request_id for s in self.waiting]
        if len(ids) != len(set(ids)):
            problems.append("a request is both running and waiting, or twice in one")
        if len(self.running) > self.config.max_num_seqs:
            problems.append("more running requests than max_num_seqs")
        problems.extend(self.residency.check(state) for state in self.running)
        return [p for p in problems if p]
