"""Step time as a roofline: the larger of the bytes a step reads over memory bandwidth and the FLOPs it
does over peak, plus host-to-device transfers the step waits for, plus host work: a fixed per-step cost, a
cost per scheduled request, and a fixed cost of a step that carries a prompt chunk (new shapes: attention
metadata, kernels not yet cached for that shape, the allocator).

Per GPU at tensor parallel degree TP: weights and FLOPs split across ranks; the sparse-MLA and indexer KV
is replicated (every rank reads all of it); dense attention's KV heads split across ranks. Coefficients
(the fractions of peak reached, the host costs) live in the hardware profile; `harness calibrate` fits them.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.sim.profiles import GIB, HardwareProfile, ModelProfile


@dataclass(frozen=True)
class BatchItem:
    query_tokens: int    # tokens this request computes in the step (a prefill chunk, or 1 + drafts)
    context_tokens: int  # its context length once the step is done
    sampled_tokens: int = 1  # positions that go through the LM head (prefill: the last one; decode: 1 + drafts)
    prefill: bool = False    # a prompt chunk (or a recompute) rather than a decode step


@dataclass(frozen=True)
class StepCost:
    weight_bytes: float
    kv_bytes: float
    flops: float
    h2d_bytes: float
    memory_s: float
    compute_s: float
    h2d_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return max(self.memory_s, self.compute_s) + self.h2d_s + self.overhead_s


def _sparse_mla(item: BatchItem, model: ModelProfile, tp: int, index_topk: int,
                sparse_row_bytes: int) -> tuple[float, float]:
    """KV bytes and attention FLOPs of one request: top-K rows per layer, the indexer over the context."""
    assert model.kv_lora_rank and model.qk_rope_head_dim and model.index_n_heads and model.index_head_dim
    assert model.num_indexer_layers and model.indexer_row_bytes
    selected = min(index_topk, item.context_tokens)
    # each query token gathers its top-K rows in every layer; the rows a step's queries share come from
    # L2, so HBM serves each distinct row once (at most the whole context)
    distinct_rows = min(item.context_tokens, item.query_tokens * selected)
    kv_bytes = distinct_rows * model.num_layers * sparse_row_bytes
    # the indexer scores the whole context once per step (queries batched), in every indexer layer
    kv_bytes += item.context_tokens * model.num_indexer_layers * model.indexer_row_bytes
    mean_context = max(1.0, item.context_tokens - item.query_tokens / 2)
    per_row_flops = 4.0 * model.num_attention_heads * (model.kv_lora_rank + model.qk_rope_head_dim)
    per_key_index_flops = 2.0 * model.index_n_heads * model.index_head_dim
    flops = item.query_tokens * selected * per_row_flops * model.num_layers / tp
    flops += item.query_tokens * mean_context * per_key_index_flops * model.num_indexer_layers / tp
    return kv_bytes, flops


def _dense(item: BatchItem, model: ModelProfile, tp: int, row_bytes: int) -> tuple[float, float]:
    """KV bytes and attention FLOPs of one request: the whole context in every layer, once per step."""
    assert model.head_dim
    kv_bytes = item.context_tokens * model.num_layers * row_bytes / tp
    mean_context = max(1.0, item.context_tokens - item.query_tokens / 2)
    flops = 4.0 * item.query_tokens * mean_context * model.num_attention_heads * model.head_dim * model.num_layers / tp
    return kv_bytes, flops


def step_cost(items: list[BatchItem], *, model: ModelProfile, hardware: HardwareProfile,
              tensor_parallel_size: int, index_topk: int, sparse_row_bytes: int,
              h2d_bytes: float = 0.0) -> StepCost:
    tp = tensor_parallel_size
    tokens = sum(i.query_tokens for i in items)
    sampled = sum(i.sampled_tokens for i in items)
    # the routed experts a batch touches: each token picks k of E, so an expert stays cold with (1-k/E)^T
    touched = 1.0 - (1.0 - model.num_experts_per_tok / model.n_routed_experts) ** tokens if tokens else 0.0
    weight_bytes = (model.shared_weight_gib + model.routed_weight_gib * touched + model.lm_head_weight_gib) * GIB / tp
    kv_bytes = 0.0
    flops = 2.0 * (model.active_params_per_token * tokens + model.lm_head_params * sampled) / tp
    for item in items:
        if model.attention == "dense":
            item_bytes, item_flops = _dense(item, model, tp, sparse_row_bytes)
        else:
            item_bytes, item_flops = _sparse_mla(item, model, tp, index_topk, sparse_row_bytes)
        kv_bytes += item_bytes
        flops += item_flops
    # one byte per weight computes at the FP8 peak, wider weights at the BF16 peak
    peak = hardware.fp8_flops if model.weight_bytes_per_param <= 1 else hardware.bf16_flops
    memory_s = (weight_bytes + kv_bytes) / (hardware.hbm_bytes_per_s * hardware.hbm_efficiency)
    compute_s = flops / (peak * hardware.flops_efficiency)
    h2d_s = h2d_bytes / hardware.h2d_bytes_per_s
    overhead_s = 0.0
    if items:
        overhead_s = hardware.step_overhead_s + hardware.step_overhead_per_seq_s * len(items)
        if any(i.prefill for i in items):
            overhead_s += hardware.prefill_step_overhead_s
    return StepCost(weight_bytes=weight_bytes, kv_bytes=kv_bytes, flops=flops, h2d_bytes=h2d_bytes,
                    memory_s=memory_s, compute_s=compute_s, h2d_s=h2d_s, overhead_s=overhead_s)
