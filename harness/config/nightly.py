"""The `nightly:` section of a sweep file: how much worse than its baseline a metric may get before the
nightly gate calls it a regression, and how many nights make the baseline.

Every field has the default below, and a metric set to null is not gated:

    nightly:
      baseline_nights: 7
      thresholds:
        mean_ttft_ms: {max_ratio: 1.25}          # looser than the default 1.15
        mtp_acceptance_length: null              # not gated
        preemptions: {max_rise: 2}               # any other measured number may be added

The schema lives here, beside the sweep file's, so a misspelt metric is refused when the sweep loads;
the gate itself (harness/nightly/) reads it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from harness.catalogue import gateable, gated_by_default

# What a rule may gate: the numbers a point measures (the catalogue's numeric metrics)
GATEABLE_METRICS = gateable()


class MetricRule(BaseModel):
    """Exactly one limit: a ratio to the baseline, or an absolute change in the metric's own unit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_ratio: float | None = Field(None, gt=0, description="fail when value < min_ratio x baseline")
    max_ratio: float | None = Field(None, gt=0, description="fail when value > max_ratio x baseline")
    max_drop: float | None = Field(None, ge=0, description="fail when baseline - value > max_drop")
    max_rise: float | None = Field(None, ge=0, description="fail when value - baseline > max_rise")

    @model_validator(mode="after")
    def _exactly_one(self) -> MetricRule:
        given = [name for name in ("min_ratio", "max_ratio", "max_drop", "max_rise")
                 if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of min_ratio, max_ratio, max_drop, max_rise "
                             f"(got {', '.join(given) or 'none'})")
        return self

    @property
    def text(self) -> str:
        """The limit as a report prints it."""
        if self.min_ratio is not None:
            return f">= {self.min_ratio:.2f}x baseline"
        if self.max_ratio is not None:
            return f"<= {self.max_ratio:.2f}x baseline"
        if self.max_drop is not None:
            return f"drop <= {self.max_drop:g}"
        return f"rise <= {self.max_rise:g}"

    def violated(self, baseline: float, value: float) -> bool:
        if self.min_ratio is not None:
            return baseline > 0 and value < self.min_ratio * baseline
        if self.max_ratio is not None:
            return baseline > 0 and value > self.max_ratio * baseline
        if self.max_drop is not None:
            return baseline - value > self.max_drop
        assert self.max_rise is not None
        return value - baseline > self.max_rise


class _Thresholds(BaseModel):
    """One rule per gated metric (None: not gated). Further measured numbers may be added."""

    model_config = ConfigDict(extra="allow", frozen=True)
    __pydantic_extra__: dict[str, MetricRule | None] = Field(init=False)  # validated like the fields

    @model_validator(mode="after")
    def _known_columns(self) -> _Thresholds:
        for name in self.__pydantic_extra__ or {}:
            if name not in GATEABLE_METRICS:
                raise ValueError(f"{name}: not a numeric summary.csv column that a point measures "
                                 "(the gate compares those, e.g. preemptions, mean_tpot_ms)")
        return self

    def rules(self) -> list[tuple[str, MetricRule]]:
        """(metric, rule) of every gated metric: the defaults first, then the added ones."""
        named = [(name, getattr(self, name)) for name in type(self).model_fields]
        extra = sorted((self.__pydantic_extra__ or {}).items())
        return [(name, rule) for name, rule in named + extra if rule is not None]


# The defaults are the catalogue's (harness/catalogue.py): one field per metric it gates by default.
GateThresholds = create_model(  # type: ignore[call-overload]
    "GateThresholds", __base__=_Thresholds,
    **{m.name: (MetricRule | None, MetricRule(**{m.rule[0]: m.rule[1]})) for m in gated_by_default()
       if m.rule is not None})


class AnswerThresholds(BaseModel):
    """The correctness gate: how many of the probe's greedy answers must stay the same under pressure (and
    match the baseline arm's), and how many must be right where the prompt set has answers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agreement_min: float | None = Field(0.75, ge=0, le=1, description="share of answers under pressure equal "
                                        "to the same arm's unpressured ones; below it: answers changed under "
                                        "pressure (a regression)")
    baseline_agreement_min: float | None = Field(None, ge=0, le=1, description="share of an arm's unpressured "
                                                 "answers equal to the baseline arm's")
    score_min: float | None = Field(None, ge=0, le=1, description="share of answers that are right, where the "
                                    "prompt set gives the answer")


class NightlySettings(BaseModel):
    """The `nightly:` section of a sweep file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    baseline_nights: int = Field(7, ge=1, description="the baseline is the median of this many comparable "
                                 "nights, the most recent ones")
    thresholds: GateThresholds = Field(default_factory=GateThresholds)  # type: ignore[valid-type]
    answers: AnswerThresholds = Field(default_factory=AnswerThresholds)
