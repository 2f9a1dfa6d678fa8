"""The blog's concurrency calculator as a pure function (formulas: docs/facts.md §4).

Two ways of holding GLM-5.3's sparse-MLA KV on a deployment are compared:
- baseline: every token of every running request stays in HBM;
- Hybrid HiSparse: HBM keeps each request's indexer history, its hot buffers and a few
  retained pages; the latent KV lives in a pinned host pool per DP replica.
Everything depends on the sequence length only through its number of 64-token blocks,
which lets the crossover search walk blocks instead of tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from harness.errors import HarnessError
from harness.schema import StrictModel, note_deprecated

GIB = 2**30
BLOCK_TOKENS = 64
INDEX_TOPK = 2048  # GLM-5.3's index_topk (docs/facts.md §3): one hot-buffer "row set" per decode query
DEFAULT_HOT_ROWS = 2 * INDEX_TOPK
MAX_HOT_ROWS = 32768  # vLLM refuses a larger hisparse_config.device_buffer_size (docs/facts.md §2)
HOST_POOL_DEFAULT_MIN_GIB = 16  # the page's host-pool slider range, used to clamp the default pool
HOST_POOL_DEFAULT_MAX_GIB = 4096
VLLM_PINNED_FRACTION_LIMIT = 0.95  # vLLM refuses a pinned pool above this share of RAM (docs/facts.md §2)

# GLM-5.3 weights in GiB (FP8), as the calculator page sizes them (docs/facts.md §3).
SHARED_WEIGHTS_GIB = 19.556
ROUTED_EXPERT_WEIGHTS_GIB = 684.167

# HBM per GPU in decimal GB, as the calculator page's presets give it and as NVIDIA's
# datasheets state it (H200 141 GB HBM3e; DGX B200 1,440 GB / 8 = 180 GB; B300 288 GB HBM3e).
# In GiB: H200 131.32, B200 167.64, B300 268.22.
GPU_HBM_GB: dict[str, float] = {"H200": 141.0, "B200": 180.0, "B300": 288.0}

KvDtype = Literal["fp8", "bf16"]
Layout = Literal["unscaled", "vllm"]
# the old name of "unscaled" (the calculator page the blog links), still read with a deprecation line
OLD_LAYOUT_NAMES = {"blog": "unscaled"}


@dataclass(frozen=True)
class BlockBytes:
    """Bytes of one 64-token block in each pool, summed over all layers of the model."""

    baseline: int  # sparse-MLA latent rows of all 78 layers + indexer keys of the 21 indexer layers
    hisparse_gpu: int  # what HiSparse keeps in HBM per block (indexer history, hot and retained pages)
    host: int  # latent rows of all 78 layers, in the pinned host pool


# `unscaled`: the calculator page's constants, built on 576-byte fp8 rows with no scale bytes (1,152-byte bf16
# rows).
# `vllm`: the 656-byte fp8_ds_mla rows vLLM stores (512 fp8 + 16 scale + 128 bf16 RoPE), docs/facts.md §3.
# A bf16 row is 512 + 64 bf16 values = 1,152 bytes in both, so the bf16 layouts coincide.
BLOCK_BYTES: dict[tuple[Layout, KvDtype], BlockBytes] = {
    ("unscaled", "fp8"): BlockBytes(baseline=3_052_800, hisparse_gpu=184_320, host=2_875_392),
    ("unscaled", "bf16"): BlockBytes(baseline=5_928_192, hisparse_gpu=294_912, host=5_750_784),
    ("vllm", "fp8"): BlockBytes(baseline=3_452_160, hisparse_gpu=209_920, host=3_274_752),
    ("vllm", "bf16"): BlockBytes(baseline=5_928_192, hisparse_gpu=294_912, host=5_750_784),
}
LAYOUT_DESCRIPTIONS: dict[Layout, str] = {
    "unscaled": "unscaled: the calculator page's constants (576-byte fp8 latent rows, no scale bytes)",
    "vllm": "vLLM's own rows (656-byte fp8_ds_mla latent rows)",
}


def _layout_name(value: object) -> object:
    if isinstance(value, str) and value in OLD_LAYOUT_NAMES:
        note_deprecated(f"layout `{value}` is now `{OLD_LAYOUT_NAMES[value]}`")
        return OLD_LAYOUT_NAMES[value]
    return value


class CalcError(HarnessError):
    """Calculator inputs that cannot be sized; the message is one line."""


def _upper_name(value: Any) -> Any:
    return value.strip().upper() if isinstance(value, str) else value


def _dtype_name(value: Any) -> Any:
    if isinstance(value, str):
        value = value.strip().lower()
        return {"bfloat16": "bf16"}.get(value, value)
    return value


class CalcInputs(StrictModel):
    """What the calculator page asks for; defaults are the page's (H200, TP8, EP, fp8)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    seq_len: int = Field(default=81_920, gt=0, description="tokens per request (prompt + output)")
    gpu: Annotated[str | None, BeforeValidator(_upper_name)] = Field(
        default=None, description="H200, B200 or B300; default H200 unless hbm_gib is given")
    hbm_gib: float | None = Field(default=None, gt=0, description="HBM per GPU in GiB instead of a preset")
    gpus: int | None = Field(default=None, gt=0, description="GPUs in the deployment; default tp x dp")
    tp: int = Field(default=8, gt=0, description="tensor parallel size")
    dp: int | None = Field(default=None, gt=0, description="data parallel size; default gpus / tp, or 1")
    expert_parallel: bool = True
    gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1)
    runtime_reserve_gib: float = Field(default=15.0, ge=0, description="vLLM runtime + headroom per GPU")
    kv_hbm_gib: float | None = Field(default=None, gt=0,
                                     description="KV HBM per GPU as vLLM reports it; default: estimated")
    max_num_seqs: int = Field(default=1024, gt=0, description="per DP replica")
    kv_dtype: Annotated[KvDtype, BeforeValidator(_dtype_name)] = "fp8"
    layout: Annotated[Layout, BeforeValidator(_layout_name)] = "unscaled"
    hot_rows: int | None = Field(default=None, gt=0, le=MAX_HOT_ROWS,
                                 description="hot-buffer rows per request (device_buffer_size)")
    speculative_tokens: int | None = Field(default=None, ge=0,
                                           description="MTP tokens n: hot rows default to (n+2) x 2048")
    hot_groups: int = Field(default=20, gt=0)
    retained_pages: int = Field(default=2, ge=0, description="retained resident pages per hot group")
    host_pool_gib: float | None = Field(default=None, gt=0,
                                        description="HiSparse pool per DP replica; default: the minimum")
    indexer_offload_gib: float = Field(default=128.0, ge=0, description="OffloadingConnector pool, total")
    host_ram_gib: float | None = Field(default=None, gt=0, description="host RAM; default: not limiting")
    tp_host_sharing: bool = Field(default=True, description="one host pool per DP replica, not per rank")
    hisparse_enabled: bool = Field(default=True, description="decides which mode predicted_total reports")

    @model_validator(mode="after")
    def _coherent(self) -> CalcInputs:
        if self.gpu is not None and self.gpu not in GPU_HBM_GB:
            raise ValueError(f"gpu: unknown GPU {self.gpu!r}; use one of {', '.join(GPU_HBM_GB)} "
                             "or give hbm_gib")
        if self.gpu is not None and self.hbm_gib is not None:
            raise ValueError("give gpu or hbm_gib, not both")
        if self.gpus is not None:
            if self.gpus % self.tp:
                raise ValueError(f"tp: tensor parallel size {self.tp} does not divide {self.gpus} GPUs")
            if self.dp is not None and self.dp * self.tp != self.gpus:
                raise ValueError(f"dp: {self.dp} x tp {self.tp} is {self.dp * self.tp}, "
                                 f"not the {self.gpus} GPUs given")
        return self

    @classmethod
    def build(cls, **fields: Any) -> CalcInputs:
        """Validated inputs, or a one-line CalcError naming the field."""
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise CalcError(_one_line(exc)) from None

    @property
    def gpu_name(self) -> str:
        return self.gpu or ("custom" if self.hbm_gib is not None else "H200")

    @property
    def hbm_per_gpu_gib(self) -> float:
        if self.hbm_gib is not None:
            return self.hbm_gib
        return GPU_HBM_GB[self.gpu_name] * 1e9 / GIB

    @property
    def dp_size(self) -> int:
        if self.dp is not None:
            return self.dp
        return self.gpus // self.tp if self.gpus is not None else 1

    @property
    def effective_hot_rows(self) -> int:
        if self.hot_rows is not None:
            return self.hot_rows
        if self.speculative_tokens:
            # released HiSparse sizes the buffer for every verified token at once (blog, docs/facts.md §2)
            return (self.speculative_tokens + 2) * INDEX_TOPK
        return DEFAULT_HOT_ROWS


def _one_line(exc: ValidationError) -> str:
    """The first validation problem as `field: message (got X)`, plus a count of the others."""
    errors = exc.errors(include_url=False)
    err = errors[0]
    where = ".".join(str(p) for p in err.get("loc", ()) if not str(p).startswith("function-"))
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        msg = "unknown input"
    elif "input" in err and err.get("type") != "value_error":
        msg += f" (got {err['input']!r})"
    line = f"{where}: {msg}" if where else msg
    if len(errors) > 1:
        line += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return line.replace("\n", " ")


HiSparseLimiter = Literal["baseline", "gpu", "host", "max_num_seqs"]


class CalcResult(StrictModel):
    """One sequence length sized; per-DP values are per replica, totals are x DP."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inputs: CalcInputs
    layout: Layout
    layout_description: str
    gpu: str
    hbm_per_gpu_gib: float
    gpus: int
    tp: int
    dp: int
    weights_per_gpu_gib: float
    model_fits: bool
    kv_hbm_per_gpu_gib: float = Field(description="rounded to 0.1 GiB, as the page shows and uses")
    hot_rows: int
    block_bytes: dict[str, int]
    blocks_per_request: int
    baseline_per_dp: int
    baseline_total: int
    hisparse_gpu_limit_per_dp: int = Field(description="requests the HBM holds in HiSparse's offloaded state")
    host_limit_per_dp: int
    hisparse_per_dp: int
    hisparse_total: int
    hisparse_limiter: HiSparseLimiter
    multiplier: float | None = Field(description="HiSparse total / baseline total; None when baseline is 0")
    min_host_pool_per_dp_gib: int = Field(description="smallest pool that does not limit HiSparse")
    host_pool_gib: float = Field(description="HiSparse host pool per DP replica used here")
    host_pool_is_default: bool
    effective_host_pool_gib: float = Field(description="host pool after the host RAM budget")
    host_pool_copies: int
    physical_host_gib: float = Field(description="pinned host RAM asked for: HiSparse pools + offload pool")
    indexer_offload_coverage: int = Field(description="full indexer histories the offload pool holds")
    predicted_total: int = Field(description="hisparse_total, or baseline_total where HiSparse is off")
    notes: list[str]


def _round_like_page(value: float) -> float:
    # The page shows KV HBM with toFixed(1) and then computes with the shown value; toFixed rounds
    # the double's exact decimal value half up, which Decimal(float) reproduces.
    return float(Decimal(value).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def weights_per_gpu_gib(inputs: CalcInputs) -> float:
    expert_shards = inputs.dp_size * inputs.tp if inputs.expert_parallel else inputs.tp
    return SHARED_WEIGHTS_GIB / inputs.tp + ROUTED_EXPERT_WEIGHTS_GIB / expert_shards


@dataclass(frozen=True)
class _Pools:
    """Everything that does not depend on the sequence length."""

    block: BlockBytes
    kv_bytes: float
    baseline_pool_blocks: int
    hisparse_pool_blocks: int
    hot_blocks: int
    retained_blocks: int
    max_num_seqs: int


@dataclass(frozen=True)
class _Capacity:
    baseline: int
    gpu_limit: int
    host_limit: int
    hisparse: int
    min_host_pool_gib: int
    host_pool_gib: float
    effective_host_pool_gib: float


def _pools(inputs: CalcInputs, kv_hbm_gib: float) -> _Pools:
    block = BLOCK_BYTES[(inputs.layout, inputs.kv_dtype)]
    kv_bytes = kv_hbm_gib * GIB
    return _Pools(
        block=block, kv_bytes=kv_bytes,
        baseline_pool_blocks=math.floor(kv_bytes / block.baseline),
        hisparse_pool_blocks=math.floor(kv_bytes / block.hisparse_gpu),
        hot_blocks=inputs.hot_groups * math.ceil(inputs.effective_hot_rows / BLOCK_TOKENS),
        retained_blocks=inputs.hot_groups * inputs.retained_pages,
        max_num_seqs=inputs.max_num_seqs)


def _host_copies(inputs: CalcInputs) -> int:
    return inputs.dp_size * (1 if inputs.tp_host_sharing else inputs.tp)


def _capacity(inputs: CalcInputs, pools: _Pools, blocks: int) -> _Capacity:
    """Per-DP limits for requests of `blocks` 64-token blocks (docs/facts.md §4)."""
    baseline = min(pools.max_num_seqs, pools.baseline_pool_blocks // blocks)
    gpu_limit = pools.hisparse_pool_blocks // (blocks + pools.hot_blocks + pools.retained_blocks)
    non_limiting = min(pools.max_num_seqs, gpu_limit)
    host_bytes = non_limiting * blocks * pools.block.host if non_limiting > baseline else 0
    min_host_gib = math.ceil(host_bytes / GIB)
    if inputs.host_pool_gib is None:
        host_pool = float(min(HOST_POOL_DEFAULT_MAX_GIB, max(HOST_POOL_DEFAULT_MIN_GIB, min_host_gib)))
    else:
        host_pool = inputs.host_pool_gib
    effective = host_pool
    if inputs.host_ram_gib is not None:
        effective = min(host_pool, inputs.host_ram_gib / _host_copies(inputs))
    host_limit = math.floor(effective * GIB / pools.block.host) // blocks
    hisparse = max(baseline, min(pools.max_num_seqs, gpu_limit, host_limit))
    return _Capacity(baseline=baseline, gpu_limit=gpu_limit, host_limit=host_limit, hisparse=hisparse,
                     min_host_pool_gib=min_host_gib, host_pool_gib=host_pool,
                     effective_host_pool_gib=effective)


def _limiter(cap: _Capacity, max_num_seqs: int) -> HiSparseLimiter:
    if cap.baseline >= min(max_num_seqs, cap.gpu_limit, cap.host_limit):
        return "baseline"  # full residency holds at least as many requests as the offloaded state
    if max_num_seqs <= cap.gpu_limit and max_num_seqs <= cap.host_limit:
        return "max_num_seqs"
    return "host" if cap.host_limit < cap.gpu_limit else "gpu"


def kv_hbm_per_gpu_gib(inputs: CalcInputs) -> tuple[float, bool]:
    """(KV HBM per GPU, whether the model fits at all), estimated as the page does unless given."""
    budget = inputs.hbm_per_gpu_gib * inputs.gpu_memory_utilization
    needed = weights_per_gpu_gib(inputs) + inputs.runtime_reserve_gib
    fits = needed <= budget
    if inputs.kv_hbm_gib is not None:
        return inputs.kv_hbm_gib, fits
    return _round_like_page(max(0.0, budget - needed)), fits


def calculate(inputs: CalcInputs) -> CalcResult:
    """Size one sequence length. Pure: the same inputs give the same result."""
    kv_gib, fits = kv_hbm_per_gpu_gib(inputs)
    pools = _pools(inputs, kv_gib)
    blocks = math.ceil(inputs.seq_len / BLOCK_TOKENS)
    cap = _capacity(inputs, pools, blocks)
    dp = inputs.dp_size
    copies = _host_copies(inputs)
    baseline_total, hisparse_total = cap.baseline * dp, cap.hisparse * dp
    notes: list[str] = []
    weights = weights_per_gpu_gib(inputs)
    if not fits:
        budget = inputs.hbm_per_gpu_gib * inputs.gpu_memory_utilization
        notes.append(f"the model does not fit: weights {weights:.1f} GiB + reserve "
                     f"{inputs.runtime_reserve_gib:g} GiB per GPU exceed the {budget:.1f} GiB budget; "
                     "raise TP, enable expert parallelism or pick a larger GPU")
    if baseline_total == 0 and hisparse_total > 0:
        notes.append(f"HiSparse enables this length: plain GPU-resident KV fits no {inputs.seq_len}-token "
                     "request")
    if cap.effective_host_pool_gib < cap.host_pool_gib:
        notes.append(f"host RAM {inputs.host_ram_gib:g} GiB caps the HiSparse pool at "
                     f"{cap.effective_host_pool_gib:.1f} GiB per DP replica")
    hisparse_pool_gib = cap.host_pool_gib * copies if inputs.hisparse_enabled else 0.0
    physical = hisparse_pool_gib + inputs.indexer_offload_gib
    if inputs.host_ram_gib is not None and physical > VLLM_PINNED_FRACTION_LIMIT * inputs.host_ram_gib:
        notes.append(f"pinned pools ask {physical:g} GiB, above {VLLM_PINNED_FRACTION_LIMIT:.0%} of the "
                     f"{inputs.host_ram_gib:g} GiB host RAM: vLLM refuses to start")
    indexer_bytes_per_request = blocks * pools.block.hisparse_gpu * inputs.tp
    return CalcResult(
        inputs=inputs, layout=inputs.layout, layout_description=LAYOUT_DESCRIPTIONS[inputs.layout],
        gpu=inputs.gpu_name, hbm_per_gpu_gib=round(inputs.hbm_per_gpu_gib, 2), gpus=dp * inputs.tp,
        tp=inputs.tp, dp=dp, weights_per_gpu_gib=round(weights, 3), model_fits=fits,
        kv_hbm_per_gpu_gib=kv_gib, hot_rows=inputs.effective_hot_rows,
        block_bytes={"baseline": pools.block.baseline, "hisparse_gpu": pools.block.hisparse_gpu,
                     "host": pools.block.host},
        blocks_per_request=blocks,
        baseline_per_dp=cap.baseline, baseline_total=baseline_total,
        hisparse_gpu_limit_per_dp=cap.gpu_limit, host_limit_per_dp=cap.host_limit,
        hisparse_per_dp=cap.hisparse, hisparse_total=hisparse_total,
        hisparse_limiter=_limiter(cap, inputs.max_num_seqs),
        multiplier=hisparse_total / baseline_total if baseline_total else None,
        min_host_pool_per_dp_gib=cap.min_host_pool_gib, host_pool_gib=cap.host_pool_gib,
        host_pool_is_default=inputs.host_pool_gib is None,
        effective_host_pool_gib=cap.effective_host_pool_gib, host_pool_copies=copies,
        physical_host_gib=physical,
        indexer_offload_coverage=math.floor(inputs.indexer_offload_gib * GIB / indexer_bytes_per_request),
        predicted_total=hisparse_total if inputs.hisparse_enabled else baseline_total,
        notes=notes)


def _checked_seq_lens(seq_lens: list[int]) -> list[int]:
    for value in seq_lens:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise CalcError(f"seq_lens: every sequence length must be a positive whole number (got {value!r})")
    return list(seq_lens)


def calculate_range(inputs: CalcInputs, seq_lens: list[int]) -> list[CalcResult]:
    """`calculate` at each length; the other inputs stay as given (a default host pool is per length)."""
    return [calculate(inputs.model_copy(update={"seq_len": s})) for s in _checked_seq_lens(seq_lens)]


def find_crossover(inputs: CalcInputs, min_seq_len: int, max_seq_len: int) -> int | None:
    """Smallest length in [min, max] where the HiSparse total beats the baseline total, or None.

    Exact: every limit depends on the length only through ceil(len / 64), so the search walks
    blocks and returns the first token count of the first winning block.
    """
    lo, hi = _checked_seq_lens([min_seq_len, max_seq_len])
    if lo > hi:
        raise CalcError(f"seq range {lo}:{hi} is empty: the start is above the end")
    kv_gib, _ = kv_hbm_per_gpu_gib(inputs)
    pools = _pools(inputs, kv_gib)
    for blocks in range(math.ceil(lo / BLOCK_TOKENS), math.ceil(hi / BLOCK_TOKENS) + 1):
        cap = _capacity(inputs, pools, blocks)
        if cap.hisparse > cap.baseline:
            return max(lo, (blocks - 1) * BLOCK_TOKENS + 1)
    return None
