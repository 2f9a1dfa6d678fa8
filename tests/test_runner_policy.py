"""The runner's policy with in-process fakes of its launcher and load generator (tests/fakes.py):
retries, stop vs continue (serial and with arms in parallel), server start failures, preflight
failures, resume, interrupts, and the run status each ends with. Seconds, not minutes; the
end-to-end versions with real servers and EvalScope are in test_sweep.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import FakeLauncher, FakeLoadGenerator

from harness.config import load_sweep
from harness.results import iter_points, read_manifest
from harness.runner import SweepOptions, run_sweep

ROOT = Path(__file__).resolve().parents[1]

RECIPE = f"""
name: policy-recipe
source: {{kind: sample, path: {ROOT}/harness/data/samples/openhands-sample.jsonl}}
tokenizer: {ROOT}/harness/data/tokenizers/harness-bpe
first_turn_length: 120
subsequent_turn_length: 20
num_turns: 2
conversations: 12
"""


def sweep_file(tmp_path: Path, *, policy: str = "continue", retries: int = 0, arms: tuple[str, ...] = ("a", "b"),
               profile_extra: dict[str, str] | None = None, max_failed: int = 0,
               retry_cache: str = "restart") -> Path:
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    for arm in arms:
        extra = (profile_extra or {}).get(arm, "")
        (tmp_path / f"{arm}.yaml").write_text(f"extends: {ROOT}/launch/sim-offload.yaml\n{extra}")
    deployments = "\n".join(f"  - {{name: {arm}, launch: {arm}.yaml}}" for arm in arms)
    (tmp_path / "sweep.yaml").write_text(f"""
name: policy
dataset: recipe.yaml
gpus_per_server: 8
on_point_failure: {policy}
max_point_retries: {retries}
retry_cache: {retry_cache}
max_failed_requests: {max_failed}
client: {{max_tokens: 8, points: [{{concurrency: 1, conversations: 1}}, {{concurrency: 2, conversations: 2}}, {{concurrency: 4, conversations: 2}}]}}
scrape: {{interval_s: 0.2}}
deployments:
{deployments}
""")
    return tmp_path / "sweep.yaml"


def sweep(tmp_path: Path, launcher: FakeLauncher, loadgen: FakeLoadGenerator, run_id: str = "r", **kw):
    options = SweepOptions(run_id=run_id, results_root=tmp_path / "results", pid_dir=tmp_path / "pids")
    return run_sweep(load_sweep(sweep_file(tmp_path, **kw)), options, progress=lambda _m: None,
                     launcher=launcher, load_generator=loadgen)


def statuses(run_dir: Path) -> dict[str, dict[str, str]]:
    return read_manifest(run_dir).points


def test_everything_ok_is_status_ok(tmp_path):
    outcome = sweep(tmp_path, FakeLauncher(), FakeLoadGenerator())
    assert (outcome.ok, outcome.failed, outcome.status) == (6, 0, "ok")
    manifest = read_manifest(outcome.run_dir)
    assert manifest.schema_version == 3 and manifest.status == "ok"
    assert all(s == "ok" for by_point in manifest.points.values() for s in by_point.values())


def test_a_failed_attempt_is_retried_and_the_retry_recorded(tmp_path):
    loadgen = FakeLoadGenerator(outcome=lambda name, attempt: "fail" if name == "a-c2" and attempt == 1 else "ok")
    outcome = sweep(tmp_path, FakeLauncher(), loadgen, retries=1)
    assert outcome.status == "ok" and loadgen.calls.count("a-c2") == 2
    point = next(p for p in iter_points(outcome.run_dir) if (p.deployment, p.concurrency) == ("a", 2))
    assert point.status == "ok" and point.attempt == 2
    assert (outcome.run_dir / "points/a/c2/evalscope/attempt-1/evalscope.log").exists()


def test_a_retry_restarts_the_server_so_its_prefix_cache_is_cold(tmp_path):
    loadgen = FakeLoadGenerator(outcome=lambda name, attempt: "fail" if name == "a-c2" and attempt == 1 else "ok")
    launcher = FakeLauncher()
    outcome = sweep(tmp_path, launcher, loadgen, retries=1, arms=("a",))
    assert outcome.status == "ok" and launcher.started == ["a", "a"]  # the retry got a fresh server
    points = {p.concurrency: p for p in iter_points(outcome.run_dir)}
    assert points[2].retry == "restart" and points[2].server_restarted and points[2].dataset_offset == 1
    assert points[1].retry is None and not points[1].server_restarted
    assert not points[4].server_restarted  # ran on the server the retry started, but not after a restart


def test_a_retry_can_shift_to_conversations_no_attempt_sent(tmp_path):
    loadgen = FakeLoadGenerator(outcome=lambda name, attempt: "fail" if name == "a-c2" and attempt == 1 else "ok")
    launcher = FakeLauncher()
    outcome = sweep(tmp_path, launcher, loadgen, retries=1, arms=("a",), retry_cache="shift")
    assert outcome.status == "ok" and launcher.started == ["a"]  # same server, other conversations
    point = next(p for p in iter_points(outcome.run_dir) if p.concurrency == 2)
    # the points read 0, 1..2, 3..4 of 1 + 2 + 2 planned; the retry starts after them
    assert point.retry == "shift" and point.dataset_offset == 5
    assert point.evalscope_command[point.evalscope_command.index("--dataset-offset") + 1] == "5"
    assert read_manifest(outcome.run_dir).workload.conversations_built >= 5 + 5  # one retry's reserve


def test_continue_records_the_failure_and_runs_the_rest(tmp_path):
    loadgen = FakeLoadGenerator(outcome=lambda name, attempt: "fail" if name == "a-c2" else "ok")
    outcome = sweep(tmp_path, FakeLauncher(), loadgen)
    assert (outcome.ok, outcome.failed, outcome.status) == (5, 1, "failed")
    failed = [p for p in iter_points(outcome.run_dir) if p.status == "failed"]
    assert [(p.deployment, p.concurrency) for p in failed] == [("a", 2)]
    assert "EvalScope exited with code 1" in failed[0].reason and failed[0].server_log_tail


def test_stop_ends_the_sweep_at_the_first_failure(tmp_path):
    loadgen = FakeLoadGenerator(outcome=lambda name, attempt: "fail" if name == "a-c2" else "ok")
    outcome = sweep(tmp_path, FakeLauncher(), loadgen, policy="stop")
    assert outcome.status == "stopped" and outcome.stopped_by_policy
    assert statuses(outcome.run_dir) == {"a": {"c1": "ok", "c2": "failed", "c4": "pending"},
                                         "b": {"c1": "pending", "c2": "pending", "c4": "pending"}}


def test_stop_with_arms_in_parallel_stops_the_other_arm(tmp_path):
    # arm a fails at once; arm b's later points must not run (the stop reaches the other thread)
    def outcome_of(name: str, attempt: int) -> str:
        if name == "a-c1":
            return "fail"
        if name.startswith("b-"):
            import time
            time.sleep(0.5)  # b is still running its first point when a fails
        return "ok"
    launcher = FakeLauncher(nodes=2)
    outcome = sweep(tmp_path, launcher, FakeLoadGenerator(outcome=outcome_of), policy="stop")
    assert outcome.status == "stopped"
    points = statuses(outcome.run_dir)
    assert points["a"] == {"c1": "failed", "c2": "pending", "c4": "pending"}
    assert points["b"]["c4"] == "pending"


def test_a_server_that_never_starts_fails_its_points_and_the_sweep_goes_on(tmp_path):
    outcome = sweep(tmp_path, FakeLauncher(fail_start={"a"}), FakeLoadGenerator())
    assert (outcome.ok, outcome.failed, outcome.status) == (3, 3, "failed")
    reasons = {p.reason for p in iter_points(outcome.run_dir) if p.deployment == "a"}
    assert reasons == {"server failed to start: exited with code 1 before it was ready"}


def test_a_preflight_failure_under_stop_ends_as_stopped(tmp_path):
    # a vLLM arm whose pinned pools can never fit this host: preflight refuses before any server starts
    (tmp_path / "model").mkdir()  # a local model: nothing to fetch from a hub
    huge = ("engine: vllm\nbuild: vllm==0.33.0\nreserve_gpus: 0\nsim: null\n"
            f"serve: {{model: {tmp_path / 'model'}}}\n"
            "kv: {hisparse: null, offload: {spec: CPUOffloadingSpec, cpu_bytes: 1000TiB}}\n")
    launcher = FakeLauncher()
    outcome = sweep(tmp_path, launcher, FakeLoadGenerator(), policy="stop", profile_extra={"a": huge})
    assert outcome.status == "stopped" and launcher.started == []
    preflight = json.loads((outcome.run_dir / "deployments/a/preflight.json").read_text())
    assert "exceed 95%" in preflight["problems"][0]


def test_resume_skips_ok_points_and_reruns_the_rest(tmp_path):
    first = sweep(tmp_path, FakeLauncher(), FakeLoadGenerator(outcome=lambda n, a: "fail" if n == "b-c4" else "ok"))
    assert first.status == "failed"
    before = (first.run_dir / "points/a/c1/point.json").read_bytes()
    loadgen = FakeLoadGenerator()
    again = sweep(tmp_path, FakeLauncher(), loadgen)
    assert (again.skipped, again.ok, again.status) == (5, 1, "ok") and loadgen.calls == ["b-c4"]
    assert (again.run_dir / "points/a/c1/point.json").read_bytes() == before


def test_an_interrupt_leaves_the_point_pending_and_the_run_resumable(tmp_path):
    loadgen = FakeLoadGenerator(outcome=lambda name, attempt: "interrupt" if name == "a-c2" else "ok")
    launcher = FakeLauncher()
    with pytest.raises(KeyboardInterrupt):
        sweep(tmp_path, launcher, loadgen)
    run_dir = tmp_path / "results/r"
    manifest = read_manifest(run_dir)
    assert manifest.status == "interrupted" and manifest.points["a"] == {"c1": "ok", "c2": "pending",
                                                                          "c4": "pending"}
    assert launcher.running() == []  # every server stopped on the way out
    again = sweep(tmp_path, FakeLauncher(), FakeLoadGenerator())
    assert again.status == "ok" and again.skipped == 1


def test_failed_requests_mark_a_point_degraded_with_the_count(tmp_path):
    loadgen = FakeLoadGenerator(outcome=lambda name, attempt: "partial" if name == "b-c4" else "ok")
    outcome = sweep(tmp_path, FakeLauncher(), loadgen, retries=2)
    assert (outcome.ok, outcome.degraded, outcome.status) == (5, 1, "degraded")
    assert loadgen.calls.count("b-c4") == 1  # degraded is a result, not a failure to retry
    point = next(p for p in iter_points(outcome.run_dir) if p.concurrency == 4 and p.deployment == "b")
    assert point.status == "degraded" and point.reason == "1 of 2 requests failed"
    again = sweep(tmp_path, FakeLauncher(), FakeLoadGenerator())
    assert again.skipped == 6  # a degraded point ran to its end: a resume keeps it
    # a sweep that tolerates one failed request keeps the point ok
    (tmp_path / "t").mkdir()
    tolerant = sweep(tmp_path / "t", FakeLauncher(), FakeLoadGenerator(outcome=lambda n, a: "ok" if n.endswith("c1") else "partial"),
                     max_failed=1)
    assert tolerant.status == "ok" and tolerant.degraded == 0


def test_a_point_whose_scrapes_all_failed_carries_a_warning(tmp_path):
    outcome = sweep(tmp_path, FakeLauncher(), FakeLoadGenerator())  # the fake server answers no /metrics
    point = iter_points(outcome.run_dir)[0]
    assert point.status == "ok" and point.warnings and "every /metrics scrape failed" in point.warnings[0]


def test_rewording_a_failure_changes_no_nightly_verdict(tmp_path, monkeypatch):
    """Whether a night failed for its infrastructure comes from the failure's kind, set where the reason is
    made; the words can change freely (they once decided the nightly's exit code by their prefix)."""
    from harness.nightly.gate import gate_night
    from harness.nightly.night import night_from_run
    from harness.nightly.run import infrastructure_reasons

    verdicts = []
    for i, words in enumerate(("server failed to start: {}", "the machine said no ({})")):
        (tmp_path / str(i)).mkdir()
        monkeypatch.setattr("harness.runner.start_failure_reason", lambda exc, w=words: w.format(exc.reason))
        outcome = sweep(tmp_path / str(i), FakeLauncher(fail_start={"a"}), FakeLoadGenerator())
        night = night_from_run(outcome.run_dir)
        failed = [r for r in night.rows if r.deployment == "a"]
        assert {r.failure for r in failed} == {"infrastructure"} and failed[0].reason.startswith(words[:10])
        night = night.model_copy(update={"infrastructure_failure": infrastructure_reasons(night)})
        verdicts.append((night.infrastructure_failure is not None, gate_night(night, []).exit_code))
    assert verdicts == [(True, 2), (True, 2)]
