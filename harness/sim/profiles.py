"""Model and hardware profiles (data files under profiles/) and the KV sizing derived from them.

Sizing follows the blog's concurrency calculator (docs/facts.md §4) so that the engine's capacity can be
checked against it: KV per GPU = util * HBM - weights per GPU - reserve, rounded to 0.1 GiB; MLA KV is
replicated across TP ranks, so every rank holds a whole copy and the pool is that of one GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import yaml
from pydantic import Field, ValidationError

from harness.errors import HarnessError
from harness.io import data_path
from harness.schema import StrictModel

PROFILES_DIR = data_path("sim")
GIB = 2**30


class ModelProfile(StrictModel):
    name: str
    max_position_embeddings: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_dense_layers: int = Field(ge=0)
    num_attention_heads: int = Field(gt=0)
    kv_lora_rank: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    index_topk: int = Field(gt=0)
    index_n_heads: int = Field(gt=0)
    index_head_dim: int = Field(gt=0)
    num_indexer_layers: int = Field(gt=0)
    n_routed_experts: int = Field(gt=0)
    num_experts_per_tok: int = Field(gt=0)
    sparse_row_bytes_fp8: int = Field(gt=0)
    sparse_row_bytes_bf16: int = Field(gt=0)
    indexer_row_bytes: int = Field(gt=0)
    shared_weight_gib: float = Field(gt=0)
    routed_weight_gib: float = Field(ge=0)
    weight_bytes_per_param: float = Field(gt=0)
    hot_groups: int = Field(gt=0)
    retained_pages: int = Field(ge=0)
    rows_per_hisparse_page: int = Field(gt=0)
    block_size_tokens: int = Field(gt=0)
    mtp_draft_acceptance: float = Field(gt=0, le=1)

    @property
    def active_params_per_token(self) -> float:
        """Parameters one token multiplies through: shared weights plus its share of the routed experts."""
        routed = self.routed_weight_gib * self.num_experts_per_tok / self.n_routed_experts
        return (self.shared_weight_gib + routed) * GIB / self.weight_bytes_per_param


class HardwareProfile(StrictModel):
    name: str
    hbm_gib: float = Field(gt=0)
    hbm_bytes_per_s: float = Field(gt=0)
    fp8_flops: float = Field(gt=0)
    bf16_flops: float = Field(gt=0)
    h2d_bytes_per_s: float = Field(gt=0)
    d2h_bytes_per_s: float = Field(gt=0)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    runtime_reserve_gib: float = Field(ge=0)
    hbm_efficiency: float = Field(gt=0, le=1)
    flops_efficiency: float = Field(gt=0, le=1)
    step_overhead_s: float = Field(ge=0)


def _load(name: str, kind: type[StrictModel]) -> StrictModel:
    path = PROFILES_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.yaml")))
        raise HarnessError(f"sim profile {name!r} not found under {PROFILES_DIR} (known: {known})")
    try:
        return kind.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (ValidationError, yaml.YAMLError) as exc:
        raise HarnessError(f"{path}: not a valid {kind.__name__}: {str(exc).splitlines()[0]}") from None


def load_model_profile(name: str) -> ModelProfile:
    profile = _load(name, ModelProfile)
    assert isinstance(profile, ModelProfile)
    return profile


def load_hardware_profile(name: str) -> HardwareProfile:
    profile = _load(name, HardwareProfile)
    assert isinstance(profile, HardwareProfile)
    return profile


@dataclass(frozen=True)
class KVSizing:
    """Bytes of one 64-token block in each place it can live, and the pool sizes in those units."""

    block_size_tokens: int
    sparse_row_bytes: int
    full_block_bytes: int       # every sparse-MLA layer + every indexer layer: the baseline block
    hisparse_page_bytes: int    # one HMA page of the HiSparse pool (calculator's "HiSparse GPU" block)
    host_block_bytes: int       # the sparse-MLA rows of all layers: what the HiSparse host pool stores
    indexer_block_bytes: int    # indexer rows of all indexer layers
    kv_bytes_per_gpu: int

    @property
    def pool_full_blocks(self) -> int:
        return self.kv_bytes_per_gpu // self.full_block_bytes

    @property
    def pool_hisparse_pages(self) -> int:
        return self.kv_bytes_per_gpu // self.hisparse_page_bytes

    @property
    def pages_per_full_block(self) -> int:
        return math.ceil(self.full_block_bytes / self.hisparse_page_bytes)


def weights_gib_per_gpu(model: ModelProfile, tensor_parallel_size: int) -> float:
    return (model.shared_weight_gib + model.routed_weight_gib) / tensor_parallel_size


def kv_gib_per_gpu(model: ModelProfile, hardware: HardwareProfile, tensor_parallel_size: int,
                   gpu_memory_utilization: float | None = None) -> float:
    """The calculator's KV HBM per GPU, rounded to 0.1 GiB as the page does (docs/facts.md §4)."""
    util = hardware.gpu_memory_utilization if gpu_memory_utilization is None else gpu_memory_utilization
    raw = util * hardware.hbm_gib - weights_gib_per_gpu(model, tensor_parallel_size) - hardware.runtime_reserve_gib
    return round(raw, 1)


def kv_sizing(model: ModelProfile, hardware: HardwareProfile, *, tensor_parallel_size: int,
              kv_cache_dtype: str | None, gpu_memory_utilization: float | None = None,
              sparse_row_bytes: int | None = None, pool_tokens: int | None = None) -> KVSizing:
    """Block sizes and the per-GPU pool; `pool_tokens` replaces the HBM-derived pool (scaled workloads)."""
    fp8 = (kv_cache_dtype or "auto").startswith("fp8")
    row = sparse_row_bytes or (model.sparse_row_bytes_fp8 if fp8 else model.sparse_row_bytes_bf16)
    bs = model.block_size_tokens
    full = bs * (model.num_layers * row + model.num_indexer_layers * model.indexer_row_bytes)
    if pool_tokens is not None:
        kv_bytes = math.ceil(pool_tokens / bs) * full
    else:
        kv_gib = kv_gib_per_gpu(model, hardware, tensor_parallel_size, gpu_memory_utilization)
        if kv_gib <= 0:
            raise HarnessError(
                f"no room for KV: {model.name} at TP{tensor_parallel_size} on {hardware.name} leaves "
                f"{kv_gib} GiB per GPU after weights and the {hardware.runtime_reserve_gib} GiB reserve")
        kv_bytes = int(kv_gib * GIB)
    return KVSizing(
        block_size_tokens=bs,
        sparse_row_bytes=row,
        full_block_bytes=full,
        hisparse_page_bytes=bs * model.rows_per_hisparse_page * row,
        host_block_bytes=bs * model.num_layers * row,
        indexer_block_bytes=bs * model.num_indexer_layers * model.indexer_row_bytes,
        kv_bytes_per_gpu=kv_bytes,
    )
