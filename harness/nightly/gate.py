"""The nightly gate: tonight against the median of the last N comparable nights.

Outcome and exit code: pass (0), regression (1), not comparable (2: no usable baseline because the
hardware or engine differs from every earlier night, nothing ran, or the night itself failed for its
infrastructure: no GPU, a build or a server start that failed). A first night with no history
passes with a note. Failed and degraded points, and HiSparse asked for but not on, are regressions
even without a baseline: they need none. Nights that failed for their infrastructure, or completed no
point, are never part of a baseline.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from harness.nightly.record import DEPLOYMENT_FIELDS, NIGHT_FIELDS, NightRecord
from harness.nightly.thresholds import NightlySettings

Outcome = Literal["pass", "regression", "not_comparable"]
EXIT_CODES: dict[Outcome, int] = {"pass": 0, "regression": 1, "not_comparable": 2}
Reason = Literal["threshold", "metric_missing", "deployment_missing", "point_missing", "point_failed",
                 "point_degraded", "hisparse_inactive"]


@dataclass(frozen=True)
class Finding:
    """One regression: where, what, and against what."""

    deployment: str
    parallel: int | None  # None: the whole deployment
    metric: str | None  # None: not a metric (a missing or failed point)
    baseline: float | None
    value: float | None
    ratio: float | None  # value / baseline
    threshold: str  # the limit as printed, e.g. ">= 0.90x baseline"; empty when none applies
    reason: Reason
    detail: str  # one line for people

    @property
    def where(self) -> str:
        return self.deployment + ("" if self.parallel is None else f" c{self.parallel}")


@dataclass(frozen=True)
class ProvenanceChange:
    """A version that differs from the last good night: a likely cause of what changed."""

    field: str
    deployment: str | None  # None: night-wide (harness commit, client version)
    before: str | None
    after: str | None
    since_night: str

    @property
    def text(self) -> str:
        where = f"{self.deployment}: " if self.deployment else ""
        return f"{where}{self.field} {self.before or '-'} -> {self.after or '-'} (since {self.since_night})"


@dataclass(frozen=True)
class GateResult:
    night_id: str
    outcome: Outcome
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    baseline_nights: list[str] = field(default_factory=list)
    last_good_night: str | None = None
    provenance_changes: list[ProvenanceChange] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    @property
    def likely_causes(self) -> list[ProvenanceChange]:
        """The provenance changes worth naming: all of them when something regressed."""
        return self.provenance_changes if self.outcome == "regression" else []


def gate_night(night: NightRecord, history: Sequence[NightRecord],
               settings: NightlySettings | None = None, *, explain: bool = True) -> GateResult:
    """Gate `night` against the nights that ran before it (later ones and itself are ignored)."""
    settings = settings or NightlySettings()
    earlier = sorted((n for n in history if n.order < night.order and n.night_id != night.night_id),
                     key=lambda n: n.order)
    notes: list[str] = []
    if night.infrastructure_failure:
        notes.append(f"infrastructure failure: {night.infrastructure_failure}")
    findings = _evidence_findings(night, notes)
    if not night.rows:
        return GateResult(night.night_id, "not_comparable", findings,
                          notes + ["no point recorded: the sweep did not run (infrastructure)"])
    measured = [n for n in earlier if n.measured]
    comparable = [n for n in measured if n.key == night.key]
    baseline = comparable[-settings.baseline_nights:]
    outcome: Outcome = "pass"
    if not baseline:
        outcome = _without_baseline(night, measured, notes)
    else:
        if len(baseline) < settings.baseline_nights:
            notes.append(f"baseline from {len(baseline)} comparable night(s), fewer than "
                         f"{settings.baseline_nights}")
        findings += _missing_findings(night, baseline) + _metric_findings(night, baseline, settings)
    if findings:
        outcome = "regression"
    if night.infrastructure_failure:
        outcome = "not_comparable"  # its findings are listed, but the night did not measure what it should
    result = GateResult(night.night_id, outcome, findings, notes, [n.night_id for n in baseline])
    if not explain or not comparable:
        return result
    good = _last_good(comparable, earlier, settings)
    return GateResult(result.night_id, result.outcome, result.findings, result.notes, result.baseline_nights,
                      good.night_id, provenance_changes(good, night))


def gate_history(nights: Sequence[NightRecord], settings: NightlySettings | None = None) -> list[GateResult]:
    """Every night gated against the nights before it, oldest first (what the dashboard marks)."""
    ordered = sorted(nights, key=lambda n: n.order)
    return [gate_night(n, ordered[:i], settings) for i, n in enumerate(ordered)]


def _without_baseline(night: NightRecord, earlier: list[NightRecord], notes: list[str]) -> Outcome:
    if not earlier:
        notes.append("first night: no history to compare with; it passes and starts the baseline")
        return "pass"
    latest = earlier[-1]
    if any(n.key.same_hardware(night.key) for n in earlier):
        notes.append(f"the sweep file changed (sha256 {str(night.sweep_sha256)[:12]} vs "
                     f"{str(latest.sweep_sha256)[:12]} last): this night starts a new baseline")
        return "pass"
    notes.append("not comparable with any earlier night (infrastructure): "
                 + "; ".join(night.key.differences(latest.key)) + f" (vs {latest.night_id})")
    return "not_comparable"


def _evidence_findings(night: NightRecord, notes: list[str]) -> list[Finding]:
    """Findings that need no baseline: failed or degraded points, HiSparse not on when asked for."""
    out = []
    for row in sorted(night.rows, key=lambda r: (str(r.deployment), r.parallel or 0)):
        dep, parallel = str(row.deployment), row.parallel
        if row.status not in ("ok", "degraded"):
            out.append(Finding(dep, parallel, None, None, None, None, "", "point_failed",
                               f"{dep} c{parallel} failed: {row.reason or 'no reason recorded'}"))
        elif row.status == "degraded":  # more failed requests than the sweep's max_failed_requests
            out.append(Finding(dep, parallel, "failed_requests", None, float(row.failed_requests), None,
                               "= 0", "point_degraded",
                               f"{dep} c{parallel}: {row.failed_requests} of {row.total_requests} requests failed"))
    for dep, facts in sorted(night.deployments.items()):
        if facts.hisparse_requested and facts.hisparse_active is False:
            out.append(Finding(dep, None, None, None, None, None, "", "hisparse_inactive",
                               f"{dep}: HiSparse was requested but the server shows it was not active"))
        elif facts.hisparse_requested and facts.hisparse_active is None:
            notes.append(f"{dep}: HiSparse requested; no evidence either way that it was active")
    return out


def _missing_findings(night: NightRecord, baseline: list[NightRecord]) -> list[Finding]:
    out = []
    deployments = {d for n in baseline for d, _ in n.points()}
    have = set(night.points())
    have_deps = {d for d, _ in have}
    for dep in sorted(deployments - have_deps):
        out.append(Finding(dep, None, None, None, None, None, "", "deployment_missing",
                           f"{dep}: in the baseline nights, absent tonight"))
    for dep, parallel in sorted({p for n in baseline for p in n.points()} - have):
        if dep in have_deps:
            out.append(Finding(dep, parallel, None, None, None, None, "", "point_missing",
                               f"{dep} c{parallel}: in the baseline nights, absent tonight"))
    return out


def _metric_findings(night: NightRecord, baseline: list[NightRecord], settings: NightlySettings) -> list[Finding]:
    out = []
    for dep, parallel in night.points():
        row = night.row(dep, parallel)
        if row is None or row.status != "ok":
            continue  # a failed point is already a finding
        for metric, rule in settings.thresholds.rules():
            past = [v for n in baseline if (v := n.value(dep, parallel, metric)) is not None]
            if not past:
                continue
            base = statistics.median(past)
            value = night.value(dep, parallel, metric)
            if value is None:
                out.append(Finding(dep, parallel, metric, base, None, None, rule.text, "metric_missing",
                                   f"{dep} c{parallel}: {metric} measured in the baseline, missing tonight"))
                continue
            if rule.violated(base, value):
                ratio = value / base if base else None
                change = f" ({ratio:.3f}x)" if ratio is not None else ""
                out.append(Finding(dep, parallel, metric, base, value, ratio, rule.text, "threshold",
                                   f"{dep} c{parallel}: {metric} {value:.4g} vs baseline {base:.4g}{change}, "
                                   f"limit {rule.text}"))
    return out


def _last_good(comparable: list[NightRecord], earlier: list[NightRecord],
               settings: NightlySettings) -> NightRecord:
    """The most recent comparable night that passed its own gate (else the most recent comparable)."""
    for candidate in reversed(comparable):
        before = [n for n in earlier if n.order < candidate.order]
        if gate_night(candidate, before, settings, explain=False).outcome == "pass":
            return candidate
    return comparable[-1]


def provenance_changes(before: NightRecord, after: NightRecord) -> list[ProvenanceChange]:
    """Versions that differ between two nights: per deployment (vLLM, kernels), then night-wide."""
    out = []
    for dep in sorted(set(before.deployments) & set(after.deployments)):
        old, new = before.deployments[dep], after.deployments[dep]
        out += [ProvenanceChange(name, dep, getattr(old, name), getattr(new, name), before.night_id)
                for name in DEPLOYMENT_FIELDS if getattr(old, name) != getattr(new, name)]
    out += [ProvenanceChange(name, None, getattr(before.provenance, name), getattr(after.provenance, name),
                             before.night_id)
            for name in NIGHT_FIELDS if getattr(before.provenance, name) != getattr(after.provenance, name)]
    return out
