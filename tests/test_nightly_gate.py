"""The nightly gate on synthetic nights: what passes, what trips it and why, and what it cannot judge."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from synthetic_nights import HISPARSE, OFFLOAD, Change, synthetic_history, synthetic_night

from harness.nightly.gate import gate_history, gate_night
from harness.nightly.gate_markdown import regression_report, step_summary
from harness.nightly.thresholds import GateThresholds, NightlySettings


def _nights(count: int = 12, **kwargs) -> list:
    rng = np.random.default_rng(0)
    return [synthetic_night(i, rng=rng, **kwargs) for i in range(1, count + 1)]


def test_a_clean_history_passes_against_the_median_of_the_last_seven_nights() -> None:
    nights = synthetic_history(12)
    result = gate_night(nights[-1], nights[:-1])
    assert (result.outcome, result.exit_code, result.findings) == ("pass", 0, [])
    assert result.baseline_nights == [n.night_id for n in nights[4:11]]
    assert result.likely_causes == []


def test_fifteen_percent_slower_from_night_8_trips_the_gate_naming_the_point_and_metric() -> None:
    slow = Change("interactivity_tok_s_user", 8, factor=0.85, deployment=HISPARSE, concurrency=16)
    nights = synthetic_history(12, changes=[slow])
    results = gate_history(nights)
    assert [r.outcome for r in results[:7]] == ["pass"] * 7
    night8 = results[7]
    assert (night8.outcome, night8.exit_code) == ("regression", 1)
    [finding] = night8.findings
    assert (finding.deployment, finding.concurrency, finding.metric, finding.reason) == \
        (HISPARSE, 16, "interactivity_tok_s_user", "threshold")
    assert finding.threshold == ">= 0.90x baseline"
    assert finding.ratio == pytest.approx(finding.value / finding.baseline)
    assert 0.78 < finding.ratio < 0.90
    # the median keeps the old level while fewer than half the baseline nights are slow: nights 8-11
    # are flagged; night 12's baseline (nights 5-11) is mostly slow, so the step is the new normal
    flagged = [i + 1 for i, r in enumerate(results) if r.outcome == "regression"]
    assert flagged == [8, 9, 10, 11]
    text = step_summary(night8, nights[7])
    assert "REGRESSION" in text and f"| {HISPARSE} | 16 | interactivity_tok_s_user |" in text


def test_a_missing_arm_or_point_is_a_regression_with_its_reason() -> None:
    nights = _nights(8)
    tonight = synthetic_night(9, rng=np.random.default_rng(1), deployments=(HISPARSE,), parallels=(1, 16))
    result = gate_night(tonight, nights)
    assert result.exit_code == 1
    reasons = {(f.deployment, f.concurrency, f.reason) for f in result.findings}
    assert reasons == {(OFFLOAD, None, "deployment_missing"), (HISPARSE, 32, "point_missing")}


def test_a_different_gpu_is_not_comparable_and_exits_2() -> None:
    nights = _nights(8)
    tonight = synthetic_night(9, rng=np.random.default_rng(1), gpu_model="H100")
    result = gate_night(tonight, nights)
    assert (result.outcome, result.exit_code, result.baseline_nights) == ("not_comparable", 2, [])
    assert "gpu_model 'H100' vs 'H200'" in result.notes[-1]
    fewer = gate_night(synthetic_night(9, rng=np.random.default_rng(1), gpu_count=4), nights)
    assert fewer.exit_code == 2 and "gpu_count 4 vs 8" in fewer.notes[-1]


def test_simulated_nights_are_never_compared_with_measured_ones() -> None:
    nights = _nights(8)
    result = gate_night(synthetic_night(9, rng=np.random.default_rng(1), simulated=True), nights)
    assert result.exit_code == 2 and "simulated True vs False" in result.notes[-1]


def test_virtual_time_nights_are_never_compared_with_served_simulated_ones() -> None:
    served = [n.model_copy(update={"simulated": True}) for n in _nights(8)]
    virtual = synthetic_night(9, rng=np.random.default_rng(1), simulated=True).model_copy(
        update={"virtual_time": True})
    result = gate_night(virtual, served)
    assert result.exit_code == 2 and "virtual_time True vs False" in result.notes[-1]


def test_a_night_that_failed_for_its_infrastructure_is_not_comparable_and_never_a_baseline() -> None:
    nights = _nights(8)
    broken = synthetic_night(9, rng=np.random.default_rng(1), failed=[(OFFLOAD, 1), (OFFLOAD, 16), (OFFLOAD, 32)])
    broken = broken.model_copy(update={"infrastructure_failure": f"{OFFLOAD}: server failed to start: timeout"})
    result = gate_night(broken, nights)
    assert (result.outcome, result.exit_code) == ("not_comparable", 2)
    assert result.notes[0] == f"infrastructure failure: {OFFLOAD}: server failed to start: timeout"
    assert {f.reason for f in result.findings} == {"point_failed"}  # still listed, for the report
    tonight = synthetic_night(10, rng=np.random.default_rng(2))
    after = gate_night(tonight, [*nights, broken])
    assert broken.night_id not in after.baseline_nights and len(after.baseline_nights) == 7
    assert after.exit_code == 0
    only_broken = gate_night(tonight, [broken])
    assert only_broken.exit_code == 0 and only_broken.notes[0].startswith("first night")


def test_the_first_night_passes_with_a_note_and_a_new_sweep_starts_a_new_baseline() -> None:
    first = _nights(1)[0]
    result = gate_night(first, [])
    assert (result.outcome, result.exit_code) == ("pass", 0)
    assert result.notes[0].startswith("first night")
    changed = synthetic_night(9, rng=np.random.default_rng(1), sweep_sha256="6" * 64)
    result = gate_night(changed, _nights(8))
    assert result.exit_code == 0 and "sweep file changed" in result.notes[-1]


def test_failed_degraded_and_hisparse_off_need_no_baseline() -> None:
    rng = np.random.default_rng(3)
    failed = synthetic_night(1, rng=rng, failed=[(OFFLOAD, 32)])
    result = gate_night(failed, [])
    assert result.exit_code == 1
    assert [(f.deployment, f.concurrency, f.reason) for f in result.findings] == [(OFFLOAD, 32, "point_failed")]
    assert "server died" in result.findings[0].detail
    degraded = synthetic_night(2, rng=rng)
    row = degraded.row(HISPARSE, 16)
    rows = [r if r is not row else row.model_copy(update={"failed_requests": 3, "status": "degraded"})
            for r in degraded.rows]
    result = gate_night(degraded.model_copy(update={"rows": rows}), [])
    assert [(f.concurrency, f.reason, f.value) for f in result.findings] == [(16, "point_degraded", 3.0)]
    off = gate_night(synthetic_night(3, rng=rng, hisparse_active=False), [])
    assert [(f.deployment, f.reason) for f in off.findings] == [(HISPARSE, "hisparse_inactive")]
    unknown = gate_night(synthetic_night(4, rng=rng, hisparse_active=None), [])
    assert unknown.exit_code == 0 and any("no evidence" in n for n in unknown.notes)


def test_a_version_changed_since_the_last_good_night_is_named_as_the_likely_cause() -> None:
    rng = np.random.default_rng(0)
    nights = [synthetic_night(i, rng=rng) for i in range(1, 8)]
    slow = Change("total_tok_s_per_gpu", 8, factor=0.8)
    tonight = synthetic_night(8, rng=rng, changes=[slow], vllm_commit="f00dcafe12")
    result = gate_night(tonight, nights)
    assert result.exit_code == 1 and result.last_good_night == nights[-1].night_id
    causes = {(c.deployment, c.field, c.before, c.after) for c in result.likely_causes}
    assert causes == {(HISPARSE, "vllm_commit", "e8ef1e07bd", "f00dcafe12"),
                      (OFFLOAD, "vllm_commit", "e8ef1e07bd", "f00dcafe12")}
    report = regression_report(result, tonight)
    title, body = report.split("\n", 1)
    assert title.startswith("# Nightly regression: glm53-tp8-nightly") and "total_tok_s_per_gpu" in title
    assert "Likely cause" in body and "vllm_commit e8ef1e07bd -> f00dcafe12" in body


def test_thresholds_are_overridable_per_metric_and_checked() -> None:
    slow = Change("interactivity_tok_s_user", 8, factor=0.85, deployment=HISPARSE, concurrency=16)
    nights = synthetic_history(8, changes=[slow])
    looser = NightlySettings.model_validate({"thresholds": {"interactivity_tok_s_user": {"min_ratio": 0.8}}})
    assert gate_night(nights[-1], nights[:-1], looser).exit_code == 0
    off = NightlySettings(thresholds=GateThresholds(interactivity_tok_s_user=None))
    assert gate_night(nights[-1], nights[:-1], off).exit_code == 0
    shorter = gate_night(nights[-1], nights[:-1], NightlySettings(baseline_nights=3))
    assert len(shorter.baseline_nights) == 3 and shorter.exit_code == 1
    with pytest.raises(ValidationError, match="not a numeric summary.csv column"):
        GateThresholds.model_validate({"deployment": {"max_rise": 1}})
    with pytest.raises(ValidationError, match="exactly one of"):
        GateThresholds.model_validate({"mean_ttft_ms": {"max_ratio": 1.2, "max_rise": 5}})


def test_a_changed_lock_is_named_as_a_likely_cause_like_a_new_vllm_commit() -> None:
    """The environments' locks are provenance: a night whose server or client lock changed names it."""
    rng = np.random.default_rng(1)
    nights = [synthetic_night(i, rng=rng) for i in range(1, 8)]
    nights = [n.model_copy(update={
        "deployments": {d: f.model_copy(update={"lock_sha256": "a" * 64}) for d, f in n.deployments.items()},
        "provenance": n.provenance.model_copy(update={"client_lock_sha256": "c" * 64})}) for n in nights]
    slow = Change("total_tok_s_per_gpu", 8, factor=0.8)
    tonight = synthetic_night(8, rng=rng, changes=[slow])
    tonight = tonight.model_copy(update={
        "deployments": {d: f.model_copy(update={"lock_sha256": "b" * 64}) for d, f in tonight.deployments.items()},
        "provenance": tonight.provenance.model_copy(update={"client_lock_sha256": "d" * 64})})
    result = gate_night(tonight, nights)
    causes = {(c.deployment, c.field) for c in result.likely_causes}
    assert causes == {(HISPARSE, "lock_sha256"), (OFFLOAD, "lock_sha256"), (None, "client_lock_sha256")}
    assert f"lock_sha256 {'a' * 64} -> {'b' * 64}" in regression_report(result, tonight)
