"""The nightly gate: tonight against the median of the last N comparable nights.

Outcome and exit code: pass (0), regression (1), not comparable (2: no usable baseline because the
hardware or engine differs from every earlier night, nothing ran, or the night itself failed for its
infrastructure: no GPU, a build or a server start that failed). A first night with no history
passes with a note. Failed and degraded points, and HiSparse asked for but not on, are regressions
even without a baseline: they need none. Nights that failed for their infrastructure, or completed no
point, are never part of a baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from harness.judge import Finding, judge
from harness.nightly.night_record import DEPLOYMENT_FIELDS, NIGHT_FIELDS, NightRecord
from harness.nightly.thresholds import NightlySettings

Outcome = Literal["pass", "regression", "not_comparable"]
EXIT_CODES: dict[Outcome, int] = {"pass": 0, "regression": 1, "not_comparable": 2}
__all__ = ["EXIT_CODES", "Finding", "GateResult", "Outcome", "ProvenanceChange", "gate_history", "gate_night"]
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
    """Gate `night` against the nights that ran before it (later ones and itself are ignored), with the
    judge (harness/judge.py) and the settings given, else the ones the night was recorded with."""
    settings = settings or night.settings or NightlySettings()
    earlier = sorted((n for n in history if n.order < night.order and n.night_id != night.night_id),
                     key=lambda n: n.order)
    notes: list[str] = []
    if night.infrastructure_failure:
        notes.append(f"infrastructure failure: {night.infrastructure_failure}")
    tonight = night.measurement()
    if not night.rows:
        evidence = judge(tonight, [], answer_limits=settings.answers)
        return GateResult(night.night_id, "not_comparable", evidence.findings,
                          notes + evidence.notes + ["no point recorded: the sweep did not run (infrastructure)"])
    measured = [n for n in earlier if n.measured]
    comparable = [n for n in measured if n.comparable_with(night)]
    baseline = comparable[-settings.baseline_nights:]
    judged = judge(tonight, [n.measurement() for n in baseline], settings.thresholds, settings.answers)
    notes += judged.notes
    outcome: Outcome = "pass"
    if not baseline:
        outcome = _without_baseline(night, measured, notes)
    elif len(baseline) < settings.baseline_nights:
        notes.append(f"baseline from {len(baseline)} comparable night(s), fewer than {settings.baseline_nights}")
    if judged.findings:
        outcome = "regression"
    if night.infrastructure_failure:
        outcome = "not_comparable"  # its findings are listed, but the night did not measure what it should
    result = GateResult(night.night_id, outcome, judged.findings, notes, [n.night_id for n in baseline])
    if not explain or not comparable:
        return result
    good = _last_good(comparable, earlier, settings)
    return GateResult(result.night_id, result.outcome, result.findings, result.notes, result.baseline_nights,
                      good.night_id, _provenance_changes(good, night))


def gate_history(nights: Sequence[NightRecord], settings: NightlySettings | None = None) -> list[GateResult]:
    """Every night gated against the nights before it, oldest first (what the dashboard marks), each with
    the settings given, else its own recorded ones."""
    ordered = sorted(nights, key=lambda n: n.order)
    return [gate_night(n, ordered[:i], settings) for i, n in enumerate(ordered)]


def _without_baseline(night: NightRecord, earlier: list[NightRecord], notes: list[str]) -> Outcome:
    if not earlier:
        notes.append("first night: no history to compare with; it passes and starts the baseline")
        return "pass"
    latest = earlier[-1]
    if any(not n.experiment.hardware_differences(night.experiment) for n in earlier):
        notes.append(f"the sweep file changed (sha256 {str(night.sweep_sha256)[:12]} vs "
                     f"{str(latest.sweep_sha256)[:12]} last): this night starts a new baseline")
        return "pass"
    notes.append("not comparable with any earlier night (infrastructure): "
                 + "; ".join(night.experiment.hardware_differences(latest.experiment)) + f" (vs {latest.night_id})")
    return "not_comparable"


def _last_good(comparable: list[NightRecord], earlier: list[NightRecord],
               settings: NightlySettings) -> NightRecord:
    """The most recent comparable night that passed its own gate (else the most recent comparable)."""
    for candidate in reversed(comparable):
        before = [n for n in earlier if n.order < candidate.order]
        if gate_night(candidate, before, settings, explain=False).outcome == "pass":
            return candidate
    return comparable[-1]


def _provenance_changes(before: NightRecord, after: NightRecord) -> list[ProvenanceChange]:
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
