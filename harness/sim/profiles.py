"""Model and hardware profiles (data files under harness/data/sim/, or any YAML file a path names) and
the KV sizing derived from them.

Two attention kinds: `sparse_mla` (GLM-5.x, DeepSeek-V3.2: one latent row per token per layer, read
top-K at a time, plus the indexer's keys) and `dense` (a plain Llama: K and V of every KV head, the whole
context read every step). Sizing follows the blog's concurrency calculator (docs/facts.md §4) so that the
engine's capacity can be checked against it: KV per GPU = util * HBM - weights per GPU - reserve,
rounded to 0.1 GiB; MLA KV is replicated across TP ranks, so every rank holds a whole copy and the pool
is that of one GPU.

A hardware profile also carries the step-time coefficients that `harness calibrate` fits, where each
one came from (`sources`) and, for a calibrated profile, the fit's provenance (`calibration`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from harness.errors import HarnessError
from harness.io import data_path
from harness.schema import StrictModel

PROFILES_DIR = data_path("sim")
GIB = 2**30
SPARSE_MLA_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "index_topk", "index_n_heads", "index_head_dim",
                     "num_indexer_layers", "sparse_row_bytes_fp8", "sparse_row_bytes_bf16", "indexer_row_bytes")
HISPARSE_FIELDS = ("hot_groups", "retained_pages", "rows_per_hisparse_page")  # only a HiSparse arm needs them
DENSE_FIELDS = ("num_kv_heads", "head_dim")


class ModelProfile(StrictModel):
    name: str
    attention: Literal["sparse_mla", "dense"] = "sparse_mla"
    max_position_embeddings: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_dense_layers: int = Field(default=0, ge=0)
    num_attention_heads: int = Field(gt=0)
    # sparse MLA (attention: sparse_mla)
    kv_lora_rank: int | None = Field(default=None, gt=0)
    qk_rope_head_dim: int | None = Field(default=None, gt=0)
    index_topk: int | None = Field(default=None, gt=0)
    index_n_heads: int | None = Field(default=None, gt=0)
    index_head_dim: int | None = Field(default=None, gt=0)
    num_indexer_layers: int | None = Field(default=None, gt=0)
    sparse_row_bytes_fp8: int | None = Field(default=None, gt=0)
    sparse_row_bytes_bf16: int | None = Field(default=None, gt=0)
    indexer_row_bytes: int | None = Field(default=None, gt=0)
    hot_groups: int | None = Field(default=None, gt=0)
    retained_pages: int | None = Field(default=None, ge=0)
    rows_per_hisparse_page: int | None = Field(default=None, gt=0)
    # dense attention (attention: dense): K and V of num_kv_heads x head_dim per token per layer
    num_kv_heads: int | None = Field(default=None, gt=0)
    head_dim: int | None = Field(default=None, gt=0)
    # weights
    n_routed_experts: int = Field(default=1, gt=0)
    num_experts_per_tok: int = Field(default=1, gt=0)
    shared_weight_gib: float = Field(gt=0)
    routed_weight_gib: float = Field(default=0.0, ge=0)
    lm_head_weight_gib: float = Field(default=0.0, ge=0, description="weights only the sampled positions "
                                      "multiply through (read once per step); 0 where shared_weight_gib holds them")
    weight_bytes_per_param: float = Field(gt=0)
    block_size_tokens: int = Field(gt=0)
    mtp_draft_acceptance: float = Field(default=0.8, gt=0, le=1)

    @model_validator(mode="after")
    def _complete(self) -> ModelProfile:
        needed = SPARSE_MLA_FIELDS if self.attention == "sparse_mla" else DENSE_FIELDS
        missing = [f for f in needed if getattr(self, f) is None]
        if missing:
            raise ValueError(f"attention {self.attention} needs {', '.join(missing)}")
        return self

    @property
    def active_params_per_token(self) -> float:
        """Parameters one token multiplies through: shared weights plus its share of the routed experts."""
        routed = self.routed_weight_gib * self.num_experts_per_tok / self.n_routed_experts
        return (self.shared_weight_gib + routed) * GIB / self.weight_bytes_per_param

    @property
    def lm_head_params(self) -> float:
        return self.lm_head_weight_gib * GIB / self.weight_bytes_per_param

    def dense_row_bytes(self, kv_cache_dtype: str | None) -> int:
        """K and V of one token in one layer (dense attention); fp8 caches store one byte per value."""
        assert self.num_kv_heads is not None and self.head_dim is not None
        return 2 * self.num_kv_heads * self.head_dim * (1 if _is_fp8(kv_cache_dtype) else 2)


class CoefficientFit(StrictModel):
    """One measured quantity at one point, against what the fitted simulator predicts for it."""

    point: str
    quantity: str
    measured: float
    predicted: float
    rel_error: float  # (predicted - measured) / measured
    weight: float = 1.0  # its weight in the fit; 0: shown, not fitted


class ValidationRow(StrictModel):
    """One point of a validation sweep: measured vs predicted (the calibrated simulator's run)."""

    point: str
    held_out: bool
    tpot_ms_measured: float | None = None
    tpot_ms_predicted: float | None = None
    total_tok_s_measured: float | None = None
    total_tok_s_predicted: float | None = None
    occupancy_measured: float | None = None
    occupancy_predicted: float | None = None
    # requests per engine step, from counters: known where the sampled occupancy missed every busy moment
    decode_batch_measured: float | None = None
    decode_batch_predicted: float | None = None
    preemptions_measured: float | None = None
    preemptions_predicted: float | None = None

    @staticmethod
    def rel(predicted: float | None, measured: float | None) -> float | None:
        if predicted is None or measured is None or measured == 0:
            return None
        return (predicted - measured) / measured


class Calibration(StrictModel):
    """Where a calibrated profile's coefficients came from: the run or table, the method, the fit."""

    source: str                      # the run folder or the measurement table, as given
    source_kind: Literal["run", "measurements"]
    run_id: str | None = None
    sweep: str | None = None
    points: list[str] = Field(default_factory=list)   # the points the fit used
    method: str
    fitted: list[str] = Field(default_factory=list)   # coefficient names the fit moved
    direct: dict[str, str] = Field(default_factory=dict)  # coefficients read straight off the data, and how
    cost: float | None = None
    fit: list[CoefficientFit] = Field(default_factory=list)
    validation: list[ValidationRow] = Field(default_factory=list)
    validation_run: str | None = None
    created_at: str | None = None


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
    # vLLM's scheduler defaults for an API server on this hardware, used where a launch profile sets none
    default_max_num_seqs: int | None = Field(default=None, gt=0)
    default_max_num_batched_tokens: int | None = Field(default=None, gt=0)
    # the step-time coefficients (harness calibrate fits these)
    hbm_efficiency: float = Field(gt=0, le=1)
    flops_efficiency: float = Field(gt=0, le=1)
    step_overhead_s: float = Field(ge=0)
    step_overhead_per_seq_s: float = Field(default=0.0, ge=0, description="host work per scheduled request "
                                           "(scheduler, sampler, output processing)")
    prefill_step_overhead_s: float = Field(default=0.0, ge=0, description="extra fixed cost of a step that "
                                           "carries a prompt chunk")
    # a deployment's measured behaviour, when a calibration read it; None: the model's or the sim's default
    mtp_draft_acceptance: float | None = Field(default=None, gt=0, le=1)
    hisparse_miss_rate: float | None = Field(default=None, ge=0, le=1)
    reply_history_ratio: float | None = Field(default=None, gt=0, le=4, description="tokens a reply takes when "
                                              "the client re-sends it in the next turn, per generated token "
                                              "(re-tokenized text); None: 1")
    sources: dict[str, str] = Field(default_factory=dict, description="coefficient -> where its value came from")
    calibration: Calibration | None = None


def _is_fp8(kv_cache_dtype: str | None) -> bool:
    return (kv_cache_dtype or "auto").startswith("fp8")


def _path_of(name: str) -> Path:
    """A profile name under harness/data/sim/, or a path to a YAML file (a calibrated profile)."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        return Path(name).expanduser()
    return PROFILES_DIR / f"{name}.yaml"


def _load(name: str, kind: type[StrictModel]) -> StrictModel:
    path = _path_of(name)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.yaml")))
        raise HarnessError(f"sim profile {name!r} not found (known under {PROFILES_DIR}: {known}; "
                           "or give a path to a .yaml file)")
    try:
        return kind.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (ValidationError, yaml.YAMLError) as exc:
        raise HarnessError(f"{path}: not a valid {kind.__name__}: {str(exc).splitlines()[0]}: "
                           f"{_first_detail(exc)}") from None


def _first_detail(exc: Exception) -> str:
    if isinstance(exc, ValidationError) and exc.errors():
        err = exc.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}"
    return str(exc).splitlines()[-1]


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
    """Bytes of one block in each place it can live, and the pool sizes in those units."""

    block_size_tokens: int
    sparse_row_bytes: int       # sparse MLA: one latent row; dense: K and V of one token in one layer
    full_block_bytes: int       # every layer's KV (+ every indexer layer): the baseline block
    hisparse_page_bytes: int    # one HMA page of the HiSparse pool (calculator's "HiSparse GPU" block); 0: dense
    host_block_bytes: int       # the sparse-MLA rows of all layers: what the HiSparse host pool stores
    indexer_block_bytes: int    # indexer rows of all indexer layers (0: dense)
    kv_bytes_per_gpu: int

    @property
    def pool_full_blocks(self) -> int:
        return self.kv_bytes_per_gpu // self.full_block_bytes

    @property
    def pool_hisparse_pages(self) -> int:
        return self.kv_bytes_per_gpu // self.hisparse_page_bytes if self.hisparse_page_bytes else 0

    @property
    def pages_per_full_block(self) -> int:
        return math.ceil(self.full_block_bytes / self.hisparse_page_bytes) if self.hisparse_page_bytes else 1


def weights_gib_per_gpu(model: ModelProfile, tensor_parallel_size: int) -> float:
    return (model.shared_weight_gib + model.routed_weight_gib + model.lm_head_weight_gib) / tensor_parallel_size


def kv_gib_per_gpu(model: ModelProfile, hardware: HardwareProfile, tensor_parallel_size: int,
                   gpu_memory_utilization: float | None = None) -> float:
    """The calculator's KV HBM per GPU, rounded to 0.1 GiB as the page does (docs/facts.md §4)."""
    util = hardware.gpu_memory_utilization if gpu_memory_utilization is None else gpu_memory_utilization
    raw = util * hardware.hbm_gib - weights_gib_per_gpu(model, tensor_parallel_size) - hardware.runtime_reserve_gib
    return round(raw, 1)


def kv_sizing(model: ModelProfile, hardware: HardwareProfile, *, tensor_parallel_size: int,
              kv_cache_dtype: str | None, gpu_memory_utilization: float | None = None,
              sparse_row_bytes: int | None = None, pool_tokens: int | None = None,
              block_size_tokens: int | None = None, kv_bytes: int | None = None) -> KVSizing:
    """Block sizes and the per-GPU pool. `pool_tokens` replaces the HBM-derived pool (scaled workloads,
    --num-gpu-blocks-override); `kv_bytes` gives the pool in bytes (vLLM CPU's fixed KV space)."""
    bs = block_size_tokens or model.block_size_tokens
    if model.attention == "dense":
        row = sparse_row_bytes or model.dense_row_bytes(kv_cache_dtype)
        full = bs * model.num_layers * row
        page = host = indexer = 0
    else:
        assert model.sparse_row_bytes_fp8 and model.sparse_row_bytes_bf16 and model.indexer_row_bytes
        assert model.num_indexer_layers
        row = sparse_row_bytes or (model.sparse_row_bytes_fp8 if _is_fp8(kv_cache_dtype) else model.sparse_row_bytes_bf16)
        indexer = bs * model.num_indexer_layers * model.indexer_row_bytes
        host = bs * model.num_layers * row
        full = host + indexer
        page = bs * model.rows_per_hisparse_page * row if model.rows_per_hisparse_page else 0
    if pool_tokens is not None:
        pool_bytes = math.ceil(pool_tokens / bs) * full
    elif kv_bytes is not None:
        pool_bytes = kv_bytes
    else:
        kv_gib = kv_gib_per_gpu(model, hardware, tensor_parallel_size, gpu_memory_utilization)
        if kv_gib <= 0:
            raise HarnessError(
                f"no room for KV: {model.name} at TP{tensor_parallel_size} on {hardware.name} leaves "
                f"{kv_gib} GiB per GPU after weights and the {hardware.runtime_reserve_gib} GiB reserve")
        pool_bytes = int(kv_gib * GIB)
    return KVSizing(block_size_tokens=bs, sparse_row_bytes=row, full_block_bytes=full, hisparse_page_bytes=page,
                    host_block_bytes=host, indexer_block_bytes=indexer, kv_bytes_per_gpu=pool_bytes)
