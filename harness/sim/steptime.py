"""Step time as a roofline: the larger of the bytes a step reads over HBM bandwidth and the FLOPs it does
over peak, plus host-to-device transfers the step waits for, plus a fixed per-step cost.

Per GPU at tensor parallel degree TP: weights and FLOPs split across ranks; the sparse-MLA and indexer KV
is replicated (every rank reads all of it). Coefficients live in the hardware profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.sim.profiles import GIB, HardwareProfile, ModelProfile


@dataclass(frozen=True)
class BatchItem:
    query_tokens: int    # tokens this request computes in the step (a prefill chunk, or 1 + drafts)
    context_tokens: int  # its context length once the step is done


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


def step_cost(items: list[BatchItem], *, model: ModelProfile, hardware: HardwareProfile,
              tensor_parallel_size: int, index_topk: int, sparse_row_bytes: int,
              h2d_bytes: float = 0.0) -> StepCost:
    tp = tensor_parallel_size
    tokens = sum(i.query_tokens for i in items)
    # the routed experts a batch touches: each token picks k of E, so an expert stays cold with (1-k/E)^T
    touched = 1.0 - (1.0 - model.num_experts_per_tok / model.n_routed_experts) ** tokens if tokens else 0.0
    weight_bytes = (model.shared_weight_gib + model.routed_weight_gib * touched) * GIB / tp
    kv_bytes = 0.0
    flops = 2.0 * model.active_params_per_token * tokens / tp
    per_row_flops = 4.0 * model.num_attention_heads * (model.kv_lora_rank + model.qk_rope_head_dim)
    per_key_index_flops = 2.0 * model.index_n_heads * model.index_head_dim
    for item in items:
        selected = min(index_topk, item.context_tokens)
        # sparse attention: each query token gathers its top-K rows in every layer; the rows a step's
        # queries share come from L2, so HBM serves each distinct row once (at most the whole context)
        distinct_rows = min(item.context_tokens, item.query_tokens * selected)
        kv_bytes += distinct_rows * model.num_layers * sparse_row_bytes
        # the indexer scores the whole context once per step (queries batched), in every indexer layer
        kv_bytes += item.context_tokens * model.num_indexer_layers * model.indexer_row_bytes
        mean_context = max(1.0, item.context_tokens - item.query_tokens / 2)
        flops += item.query_tokens * selected * per_row_flops * model.num_layers / tp
        flops += item.query_tokens * mean_context * per_key_index_flops * model.num_indexer_layers / tp
    memory_s = (weight_bytes + kv_bytes) / (hardware.hbm_bytes_per_s * hardware.hbm_efficiency)
    compute_s = flops / (hardware.fp8_flops * hardware.flops_efficiency)
    h2d_s = h2d_bytes / hardware.h2d_bytes_per_s
    return StepCost(weight_bytes=weight_bytes, kv_bytes=kv_bytes, flops=flops, h2d_bytes=h2d_bytes,
                    memory_s=memory_s, compute_s=compute_s, h2d_s=h2d_s,
                    overhead_s=hardware.step_overhead_s if items else 0.0)
