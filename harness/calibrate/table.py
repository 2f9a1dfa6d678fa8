"""A table of public measurements (harness/data/measurements/*.yaml) as calibration targets: each row is a
published benchmark of one deployment with its exact setup, replayed on the simulated engine as
independent one-turn requests of the stated lengths at the stated concurrency."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field, ValidationError, model_validator

from harness.calibrate.fit import Target
from harness.calibrate.predict import PointSetup, single_turn_shapes
from harness.config import LaunchProfile
from harness.errors import HarnessError
from harness.schema import Slug, StrictModel
from harness.sim.profiles import load_model_profile


class Measured(StrictModel):
    tpot_ms: float | None = Field(default=None, gt=0, description="mean TPOT (client, excluding the first token)")
    total_tok_s: float | None = Field(default=None, gt=0, description="total (input + output) token throughput")
    output_tok_s: float | None = Field(default=None, gt=0)
    ttft_ms: float | None = Field(default=None, gt=0)


class Measurement(StrictModel):
    id: Slug
    model: str                          # the checkpoint, as the source names it
    model_profile: str                  # the simulator's model profile that describes it
    engine: str                         # engine and version, as the source states them
    hardware: str
    tensor_parallel_size: int = Field(ge=1)
    expert_parallel: bool = False
    kv_cache_dtype: str | None = None
    mtp_tokens: int = Field(default=0, ge=0)
    mtp_acceptance_length: float | None = Field(default=None, ge=1)
    input_tokens: int | None = Field(default=None, gt=0, description="None: the source does not say")
    assumed_input_tokens: int | None = Field(default=None, gt=0, description="what the replay uses without it")
    output_tokens: int = Field(gt=0)
    concurrency: int = Field(gt=0)
    requests: int = Field(gt=0)
    arrival: str = "closed loop at the stated concurrency"
    prefix_caching: bool = False
    max_num_seqs: int | None = Field(default=None, gt=0)
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    measured: Measured
    fit: list[str] = Field(default_factory=lambda: ["tpot_ms", "total_tok_s"],
                           description="the measured quantities the fit uses; the others are only compared")
    weight: float = Field(default=1.0, gt=0)
    source: str
    notes: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> Measurement:
        if self.input_tokens is None and self.assumed_input_tokens is None:
            raise ValueError("give input_tokens, or assumed_input_tokens where the source does not state it")
        if self.mtp_tokens and self.mtp_acceptance_length is None:
            raise ValueError("mtp_tokens needs the measured mtp_acceptance_length (the replay pins it)")
        for quantity in self.fit:
            if getattr(self.measured, quantity, None) is None:
                raise ValueError(f"fit names {quantity}, which measured does not give")
        return self

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens or self.assumed_input_tokens or 0


class MeasurementTable(StrictModel):
    description: str | None = None
    hardware_profile: str                # the profile these measurements calibrate
    measurements: list[Measurement] = Field(min_length=1)


def load_table(path: Path) -> MeasurementTable:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data, dict) or "measurements" not in data:
            raise HarnessError(f"{path}: not a measurement table (no `measurements:`); give a run folder or a "
                               "table like harness/data/measurements/h200-public.yaml")
        return MeasurementTable.model_validate(data)
    except FileNotFoundError:
        raise HarnessError(f"{path}: no such measurement table") from None
    except yaml.YAMLError as exc:
        raise HarnessError(f"{path}: not YAML: {str(exc).splitlines()[0]}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise HarnessError(f"{path}: {where}: {err['msg']}") from None


def setup_of(m: Measurement) -> PointSetup:
    """The measurement as a simulated arm: the stated parallelism and limits, prefix caching as stated."""
    serve = {"model": m.model, "tensor_parallel_size": m.tensor_parallel_size, "kv_cache_dtype": m.kv_cache_dtype,
             "max_num_seqs": m.max_num_seqs, "max_num_batched_tokens": m.max_num_batched_tokens,
             "gpu_memory_utilization": m.gpu_memory_utilization, "enable_prefix_caching": m.prefix_caching,
             "max_model_len": m.prompt_tokens + m.output_tokens + 64}
    profile: dict = {"engine": "sim", "serve": {k: v for k, v in serve.items() if v is not None},
                     "sim": {"model_profile": m.model_profile}}
    if m.mtp_tokens:
        profile["speculative"] = {"method": "mtp", "num_speculative_tokens": m.mtp_tokens}
        profile["sim"]["mtp_acceptance_mean"] = m.mtp_acceptance_length
    return PointSetup(name=m.id, profile=LaunchProfile.model_validate(profile), model=load_model_profile(m.model_profile),
                      shapes=single_turn_shapes(m.prompt_tokens, m.requests), concurrency=m.concurrency,
                      conversations=m.requests, max_tokens=m.output_tokens)


COMPARED = ("tpot_ms", "total_tok_s")  # what the replay predicts and a table can state


def table_targets(table: MeasurementTable) -> list[Target]:
    """Every stated TPOT and throughput; those a row's `fit` leaves out weigh 0 (compared, not fitted)."""
    targets = []
    for m in table.measurements:
        setup = setup_of(m)
        for quantity in COMPARED:
            value = getattr(m.measured, quantity)
            if value is not None:
                targets.append(Target(setup=setup, quantity=quantity, measured=value,
                                      weight=m.weight if quantity in m.fit else 0.0))
    return targets
