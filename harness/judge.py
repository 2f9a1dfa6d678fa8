"""The one judge: a measurement (a run, a night) against one or more earlier measurements of the same
experiment, under one set of rules.

`compare RUN --reference REF` is the judge with one reference; the nightly gate is the judge with the
median of its baseline nights. Both ask the same two questions in the same words:
- comparable? `Experiment.differences`: the same GPUs (model and count where both record them), the same
  GPUs per server, the same engine (measured, simulated served, simulated in virtual time) and the same
  workload (where both record it). Anything else is not the same experiment, and is refused, not judged.
- regressed? `judge`: findings that need no baseline (a point failed or degraded, HiSparse asked for and
  not on, answers that changed under pressure), a deployment or point of the baseline missing, and every
  gated metric against the baseline's median under its rule (the sweep's `nightly: thresholds:`, the
  catalogue's defaults where it says none; the correctness limits are the sweep's `nightly: answers:`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from harness.config.nightly import AnswerThresholds, GateThresholds
from harness.records import AnswerScores

Reason = Literal["threshold", "metric_missing", "deployment_missing", "point_missing", "point_failed",
                 "point_degraded", "hisparse_inactive", "answers_changed"]
PointKey = tuple[str, int]  # (deployment, concurrency)


@dataclass(frozen=True)
class Finding:
    """One regression: where, what, and against what."""

    deployment: str
    concurrency: int | None  # None: the whole deployment
    metric: str | None  # None: not a metric (a missing or failed point)
    baseline: float | None
    value: float | None
    ratio: float | None  # value / baseline
    threshold: str  # the limit as printed, e.g. ">= 0.90x baseline"; empty when none applies
    reason: Reason
    detail: str  # one line for people

    @property
    def where(self) -> str:
        return self.deployment + ("" if self.concurrency is None else f" c{self.concurrency}")


@dataclass(frozen=True)
class PointResult:
    """One point as the judge sees it: its outcome and its numbers."""

    status: str  # ok | degraded | failed
    reason: str | None = None
    failed_requests: int | None = None
    total_requests: int | None = None
    conversations: int | None = None
    values: Mapping[str, float | None] = field(default_factory=dict)

    def value(self, metric: str) -> float | None:
        """A metric of an ok point, or None (absent, failed, or not measured)."""
        if self.status != "ok":
            return None
        value = self.values.get(metric)
        return None if value is None else float(value)


@dataclass(frozen=True)
class Experiment:
    """What makes two measurements the same experiment. A field one side does not record is not compared."""

    gpu_model: str | None = None
    gpu_count: int | None = None  # GPUs the node showed (nights); None where unknown
    gpus_per_server: int | None = None
    simulated: bool = False
    virtual_time: bool = False  # simulated without a client: the same engine measured another way
    workload: Mapping[str, object] = field(default_factory=dict)

    def differences(self, other: Experiment) -> list[str]:
        """What differs, one 'name: this vs other' each; empty: comparable."""
        out = self.hardware_differences(other)
        if self.workload and other.workload:
            keys = sorted(set(self.workload) | set(other.workload))
            differing = [f"{k} {self.workload.get(k)!r} vs {other.workload.get(k)!r}" for k in keys
                         if self.workload.get(k) != other.workload.get(k)]
            if differing:
                out.append("workload differs: " + "; ".join(differing))
        return out

    def hardware_differences(self, other: Experiment) -> list[str]:
        """What differs in the machine and the engine (not the workload)."""
        out = []
        for name in ("gpu_model", "gpu_count", "gpus_per_server"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is not None and theirs is not None and mine != theirs:
                out.append(f"{name} {mine!r} vs {theirs!r}")
        for name in ("simulated", "virtual_time"):
            if getattr(self, name) != getattr(other, name):
                out.append(f"{name} {getattr(self, name)!r} vs {getattr(other, name)!r}")
        return out

    def unknown(self, other: Experiment) -> list[str]:
        """Notes for what could not be checked because a side does not record it."""
        return [f"{name} unknown on one side; not compared" for name in ("gpu_model",)
                if (getattr(self, name) is None) != (getattr(other, name) is None)]


@dataclass(frozen=True)
class Measurement:
    """One side of a judgement: a run or a night."""

    label: str  # run or night id
    experiment: Experiment
    points: Mapping[PointKey, PointResult]
    # per deployment: (HiSparse requested, HiSparse seen active); None where unknown
    hisparse: Mapping[str, tuple[bool | None, bool | None]] = field(default_factory=dict)
    answers: Mapping[str, AnswerScores] = field(default_factory=dict)  # per deployment: its correctness probe

    def point_keys(self) -> list[PointKey]:
        return sorted(self.points)


@dataclass(frozen=True)
class Judgement:
    findings: list[Finding]
    notes: list[str]


def _value_text(value: float) -> str:
    return f"{value:.4g}"


def _evidence_findings(measured: Measurement, answer_limits: AnswerThresholds | None = None) -> Judgement:
    """Findings that need no baseline: failed or degraded points, HiSparse not on when asked for, answers
    that changed under pressure (or differ from the baseline arm's, or are wrong) past the limits."""
    findings, notes = [], []
    for (dep, concurrency), point in sorted(measured.points.items()):
        if point.status == "does_not_fit":  # a result: a regression only where the baseline fitted (below)
            continue
        if point.status not in ("ok", "degraded"):
            findings.append(Finding(dep, concurrency, None, None, None, None, "", "point_failed",
                                    f"{dep} c{concurrency} failed: {point.reason or 'no reason recorded'}"))
        elif point.status == "degraded":  # more failed requests than the sweep's max_failed_requests
            findings.append(Finding(dep, concurrency, "failed_requests", None, float(point.failed_requests or 0), None,
                                    "= 0", "point_degraded",
                                    f"{dep} c{concurrency}: {point.failed_requests} of {point.total_requests} "
                                    "requests failed"))
    for dep, (requested, active) in sorted(measured.hisparse.items()):
        if requested and active is False:
            findings.append(Finding(dep, None, None, None, None, None, "", "hisparse_inactive",
                                    f"{dep}: HiSparse was requested but the server shows it was not active"))
        elif requested and active is None:
            notes.append(f"{dep}: HiSparse requested; no evidence either way that it was active")
    findings += answer_findings(measured.answers, answer_limits if answer_limits is not None else AnswerThresholds())
    return Judgement(findings, notes)


def answer_findings(answers: Mapping[str, AnswerScores], limits: AnswerThresholds) -> list[Finding]:
    """The correctness gate: each deployment's answer shares against their limits."""
    out = []
    for dep, scores in sorted(answers.items()):
        checks = (("answer_agreement", scores.agreement_under_pressure, limits.agreement_min,
                   "answers changed under pressure: {v:.0%} equal to its unpressured answers"),
                  ("answer_baseline_agreement", scores.agreement_with_baseline, limits.baseline_agreement_min,
                   f"answers differ from the baseline arm {scores.baseline}'s: {{v:.0%}} equal"),
                  ("answer_score", scores.score, limits.score_min, "answers wrong: {v:.0%} right"))
        for metric, value, limit, words in checks:
            if value is not None and limit is not None and value < limit:
                out.append(Finding(dep, None, metric, None, value, None, f">= {limit:g}", "answers_changed",
                                   f"{dep}: {words.format(v=value)}, limit {limit:.0%}"))
    return out


def _missing_findings(measured: Measurement, baseline: Sequence[Measurement]) -> list[Finding]:
    """A deployment or point the baseline measured that this measurement lacks, or that fitted in the
    baseline and does not fit here."""
    out = []
    for (dep, concurrency), point in sorted(measured.points.items()):
        fitted = [b for b in baseline if (p := b.points.get((dep, concurrency))) is not None
                  and p.status != "does_not_fit"]
        if point.status == "does_not_fit" and fitted:
            out.append(Finding(dep, concurrency, None, None, None, None, "", "point_failed",
                               f"{dep} c{concurrency}: does not fit, where it fitted in the baseline: "
                               f"{point.reason or 'no reason recorded'}"))
    have = set(measured.points)
    have_deps = {d for d, _ in have}
    wanted = {p for b in baseline for p in b.points}
    for dep in sorted({d for d, _ in wanted} - have_deps):
        out.append(Finding(dep, None, None, None, None, None, "", "deployment_missing",
                           f"{dep}: in the baseline, absent here"))
    for dep, concurrency in sorted(wanted - have):
        if dep in have_deps:
            out.append(Finding(dep, concurrency, None, None, None, None, "", "point_missing",
                               f"{dep} c{concurrency}: in the baseline, absent here"))
    return out


def _metric_findings(measured: Measurement, baseline: Sequence[Measurement],
                    thresholds: GateThresholds) -> list[Finding]:  # type: ignore[valid-type]
    """Every gated metric of every ok point against the median of the baseline's values, by its rule."""
    out = []
    for (dep, concurrency), point in sorted(measured.points.items()):
        if point.status != "ok":
            continue  # a failed point is already a finding
        for metric, rule in thresholds.rules():
            past = [v for b in baseline if (p := b.points.get((dep, concurrency))) is not None
                    and (v := p.value(metric)) is not None]
            if not past:
                continue
            base = statistics.median(past)
            value = point.value(metric)
            if value is None:
                out.append(Finding(dep, concurrency, metric, base, None, None, rule.text, "metric_missing",
                                   f"{dep} c{concurrency}: {metric} measured in the baseline, missing here"))
                continue
            if rule.violated(base, value):
                ratio = value / base if base else None
                change = f" ({ratio - 1:+.1%})" if ratio is not None else ""
                out.append(Finding(dep, concurrency, metric, base, value, ratio, rule.text, "threshold",
                                   f"{dep} c{concurrency}: {metric} {_value_text(base)} -> {_value_text(value)}"
                                   f"{change}, limit {rule.text}"))
    return out


def judge(measured: Measurement, baseline: Sequence[Measurement],
          thresholds: GateThresholds | None = None,  # type: ignore[valid-type]
          answer_limits: AnswerThresholds | None = None) -> Judgement:
    """Everything that regressed in `measured` against `baseline` (which may be empty: then only the
    findings that need no baseline)."""
    thresholds = thresholds if thresholds is not None else GateThresholds()
    evidence = _evidence_findings(measured, answer_limits)
    findings = list(evidence.findings)
    if baseline:
        findings += _missing_findings(measured, baseline) + _metric_findings(measured, baseline, thresholds)
    return Judgement(findings, list(evidence.notes))
