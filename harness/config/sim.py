"""The `sim:` section of a launch profile whose engine is the simulated engine."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationInfo

from harness.schema import RelPath, StrictModel, resolve_path


def _profile_ref(value: Any, info: ValidationInfo) -> Any:
    """A path-like profile reference (a .yaml file) resolves against the launch file's folder."""
    if isinstance(value, str) and (value.endswith((".yaml", ".yml")) or "/" in value):
        return str(resolve_path(value, info))
    return value


class FaultSettings(StrictModel):
    """Faults the simulated server can inject, so tests can exercise the runner's recovery."""

    exit_after_requests: int | None = Field(default=None, ge=1, description="hard exit after N requests")
    ready_delay_s: float = Field(default=0.0, ge=0, description="answer /health only after this long")
    never_ready: bool = Field(default=False, description="/health never answers 200")
    error_fraction: float = Field(default=0.0, ge=0, le=1, description="fraction of requests answered 500")
    stall_after_tokens: int | None = Field(default=None, ge=0, description="stall a stream after N tokens")
    stall_s: float = Field(default=3600.0, ge=0)
    malformed_metrics: bool = Field(default=False, description="serve unparseable /metrics text")
    ignore_hisparse: bool = Field(default=False, description="accept kv.hisparse and silently run without it, "
                                  "as a build that ignores the flags would: no start lines, no vllm:hisparse_ "
                                  "metrics (the harness must refuse the arm)")
    corrupt_under_pressure: int | None = Field(default=None, ge=1, description="greedy replies asked while "
                                               "this many requests run come out different (the correctness "
                                               "gate must catch it)")


class SimSettings(StrictModel):
    model_profile: str = Field(default="glm53", description="a model profile name under harness/data/sim/")
    hardware_profile: Annotated[str, BeforeValidator(_profile_ref)] = Field(
        default="h200", description="a profile name under harness/data/sim/, or a .yaml file (a calibrated "
        "profile from `harness calibrate`), relative to the launch file")
    time_scale: float = Field(default=1.0, gt=0,
                              description="simulated seconds per wall second; >1 runs faster than the GPU")
    tokenizer: RelPath | None = Field(default=None, description="tokenizer folder or tokenizer.json; "
                                      "default: the shipped harness/data/tokenizers/harness-bpe")
    seed: int = 0
    mtp_acceptance_mean: float | None = Field(default=None, ge=1,
                                              description="mean accepted length per step with MTP")
    # Scaling knobs: a small workload shows the pressure the blog's workload shows at full scale only if
    # the pool and the sparse-attention window shrink with it.
    kv_pool_tokens: int | None = Field(default=None, ge=64,
                                       description="GPU KV pool per GPU, in tokens at full residency; "
                                       "default: sized from HBM, weights and the 15 GiB reserve")
    index_topk: int | None = Field(default=None, gt=0, description="replaces the model profile's top-K")
    sparse_row_bytes: int | None = Field(default=None, gt=0,
                                         description="replaces the sparse-MLA row size (e.g. the "
                                         "calculator's 576 bytes)")
    hisparse_miss_rate: float | None = Field(default=None, ge=0, le=1,
                                             description="fraction of top-K rows from host-only pages that "
                                             "miss the hot buffer each decode step once it is warm; default: "
                                             "the hardware profile's calibrated value, else 0.05")
    # Run-to-run variation and injected regressions, so a nightly history with known changes can be made
    # in seconds: every step of a run takes step_time_scale x (one seeded draw of 1 + N(0, run_jitter)).
    step_time_scale: float = Field(default=1.0, gt=0, description="multiplies every step's duration "
                                   "(1.15: a 15% slower engine)")
    run_jitter: float = Field(default=0.0, ge=0, le=0.5, description="standard deviation of one run's speed "
                              "factor, drawn once per run (0.03: about 3% run-to-run noise)")
    run_seed: int | None = Field(default=None, description="seed of that draw; default: from the run id under "
                                 "`simulate`, fresh at every start of `serve-sim`")
    faults: FaultSettings = FaultSettings()
