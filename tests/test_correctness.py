"""The correctness gate: the greedy probe's prompts and how answers are judged (fast), the simulated engine
answering them and, with its fault, answering wrong under pressure (a real serve-sim over HTTP), and three
served nights through `harness nightly`: honest, honest, then a build that corrupts answers under pressure,
which passes the performance gate and fails the correctness gate with its reason."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests
import yaml
from sim_support import chat_body, profile, sim_server
from test_nightly_e2e import HISPARSE, OFFLOAD, Nights

from harness.catalogue import gated_by_default
from harness.config.nightly import AnswerThresholds
from harness.config.prompts import load_prompt_set
from harness.correctness import ProbeTarget, ask
from harness.errors import HarnessError
from harness.judge import answer_findings
from harness.nightly.store import NightStore
from harness.records import (
    Answer,
    AnswerScores,
    CorrectnessRecord,
    DeploymentRecord,
    HiSparseEvidence,
    answer_scores,
)
from harness.results import read_manifest

ROOT = Path(__file__).resolve().parents[1]


# ---- the prompts and the arithmetic of agreement (fast) --------------------------------------------------

def test_the_shipped_prompts_load_and_an_answer_is_a_whole_word():
    prompts = load_prompt_set()
    assert len(prompts.prompts) == 8 and all(p.answer for p in prompts.prompts)
    add = next(p for p in prompts.prompts if p.id == "add")
    assert add.is_right("The answer is 42.") and add.is_right("42")
    assert not add.is_right("142") and not add.is_right("4 2")
    letter = next(p for p in prompts.prompts if p.id == "letter")
    assert letter.is_right("d") and letter.is_right("The letter D.") and not letter.is_right("and")


def test_a_bad_prompt_file_is_one_line_naming_the_file_and_field(tmp_path):
    bad = tmp_path / "prompts.yaml"
    bad.write_text("prompts:\n  - {id: a, prompt: 'x'}\n  - {id: a, prompt: 'y'}\n")
    with pytest.raises(HarnessError) as raised:
        load_prompt_set(bad)
    assert str(raised.value).startswith(f"{bad}: prompts: ") and "unique" in str(raised.value)
    assert "\n" not in str(raised.value)
    bad.write_text("prompts:\n  - {id: a}\n")
    with pytest.raises(HarnessError, match=r"prompts\.0\.prompt: Field required"):
        load_prompt_set(bad)


def _answers(*texts: str, ids: list[list[int]] | None = None) -> list[Answer]:
    return [Answer(id=f"p{i}", text=t, generated_ids=ids[i] if ids else None) for i, t in enumerate(texts)]


def test_agreement_compares_token_ids_where_both_have_them_and_skips_failed_requests():
    alone = _answers("42", "Paris", "7", ids=[[1], [2], [3]])
    # the same text from other token ids is a different answer; the same ids are the same answer
    pressured = _answers("42", "Paris", "7", ids=[[1], [9], [3]])
    assert CorrectnessRecord.agreement(pressured, alone) == pytest.approx(2 / 3)
    no_ids = _answers("42", "Paris", "8")
    assert CorrectnessRecord.agreement(no_ids, alone) == pytest.approx(2 / 3)  # text, where one side lacks ids
    failed = [*_answers("42", "Paris")[:1], Answer(id="p1", text="", error="HTTP 500")]
    assert CorrectnessRecord.agreement(failed, alone) == 1.0  # only the answered prompts count
    assert CorrectnessRecord.agreement([], alone) is None


def _deployment(correctness: CorrectnessRecord, hisparse: bool) -> DeploymentRecord:
    evidence = HiSparseEvidence(hisparse_requested=True, hisparse_active=True) if hisparse else None
    return DeploymentRecord(launch="x.yaml", engine="sim", evidence=evidence, correctness=correctness)


def test_scores_judge_each_arm_against_itself_and_against_the_baseline_arm():
    right = [Answer(id="a", text="42", correct=True), Answer(id="b", text="Paris", correct=True)]
    wrong = [Answer(id="a", text="4242", correct=False), Answer(id="b", text="Paris", correct=True)]
    deployments = {
        "offload": _deployment(CorrectnessRecord(prompts="p.yaml", unpressured=right, pressured=right), False),
        "hisparse": _deployment(CorrectnessRecord(prompts="p.yaml", unpressured=right, pressured=wrong), True),
        "drifted": _deployment(CorrectnessRecord(prompts="p.yaml", unpressured=wrong, pressured=wrong), True),
    }
    scores = answer_scores(deployments)
    assert scores["offload"] == AnswerScores(agreement_under_pressure=1.0, baseline=None, score=1.0,
                                             asked_under_pressure=True)
    assert scores["hisparse"].agreement_under_pressure == 0.5 and scores["hisparse"].agreement_with_baseline == 1.0
    assert scores["hisparse"].baseline == "offload" and scores["hisparse"].score == 0.75
    assert scores["drifted"].agreement_under_pressure == 1.0 and scores["drifted"].agreement_with_baseline == 0.5

    findings = answer_findings(scores, AnswerThresholds())  # the default: 75% the same under pressure
    assert [(f.deployment, f.reason, f.metric) for f in findings] == [
        ("hisparse", "answers_changed", "answer_agreement")]
    assert findings[0].detail == "hisparse: answers changed under pressure: 50% equal to its unpressured answers, " \
                                 "limit 75%"
    strict = answer_findings(scores, AnswerThresholds(baseline_agreement_min=1.0, score_min=0.9))
    assert {(f.deployment, f.metric) for f in strict} == {
        ("hisparse", "answer_agreement"), ("hisparse", "answer_score"),
        ("drifted", "answer_baseline_agreement"), ("drifted", "answer_score")}


# ---- the simulated engine answers, and corrupts under pressure when told to (real serve-sim) ---------------

def test_serve_sim_answers_the_shipped_prompts_and_its_fault_answers_wrong_under_load(tmp_path):
    prompts = load_prompt_set()
    launch = profile(sim={"faults": {"corrupt_under_pressure": 1}, "time_scale": 1.0})
    with sim_server(tmp_path, launch) as server:
        target = ProbeTarget(server.url, "glm-agentx")
        alone = ask(target, prompts, max_tokens=24)
        assert [a.text for a in alone] == [p.answer for p in prompts.prompts]
        assert all(a.correct and a.generated_ids for a in alone)  # token ids, as vLLM's return_token_ids gives

        # one long request keeps the engine running while the prompts are asked again
        def load():
            requests.post(server.url + "/v1/chat/completions", timeout=120,
                          json=chat_body("x " * 200, 2000, ignore_eos=True))  # ~10 s of decode
        busy = threading.Thread(target=load)
        busy.start()
        try:
            deadline_answers = None
            for _ in range(100):
                metrics = requests.get(server.url + "/metrics", timeout=5).text
                if "vllm:num_requests_running{" in metrics and any(
                        line.startswith("vllm:num_requests_running{") and not line.endswith(" 0.0")
                        for line in metrics.splitlines()):
                    deadline_answers = ask(target, prompts, max_tokens=24)
                    break
                threading.Event().wait(0.1)
        finally:
            busy.join()
        assert deadline_answers is not None, server.log()
        assert [a.text for a in deadline_answers] == [p.answer * 2 for p in prompts.prompts]
        assert not any(a.correct for a in deadline_answers)
        assert CorrectnessRecord.agreement(deadline_answers, alone) == 0.0
        assert "sim.faults.corrupt_under_pressure" in server.log()


# ---- three served nights: honest, honest, corrupt ---------------------------------------------------------

def _night(nights: Nights, run_id: str, tmp_path: Path) -> subprocess.CompletedProcess:
    argv = nights.argv(run_id, "--launcher", "local", "--no-dashboard")
    return subprocess.run([sys.executable, "-m", "harness", *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"})


# The performance gate these nights pass is the catalogue's, widened: the three nights run beside other
# tests, and what this test holds is that the correctness gate fails a build whose numbers the performance
# gate takes. A neighbour's load moves a served sim night's throughput by tens of percent, and its latency
# ratios (max_ratio) by more: mean TTFT went from 89 ms to 431 ms (4.8x) between two honest nights when a
# real vLLM server started beside the second one on a 2-vCPU VM.
_WIDE = {"min_ratio": lambda v: v / 3, "max_ratio": lambda v: v * 10, "max_drop": lambda v: v * 3,
         "max_rise": lambda v: v * 3}


def _widened_gate(nights: Nights) -> None:
    sweep = yaml.safe_load(nights.sweep.read_text())
    sweep["nightly"] = {"thresholds": {m.name: {m.rule[0]: _WIDE[m.rule[0]](m.rule[1])} for m in gated_by_default()}}
    nights.sweep.write_text(yaml.safe_dump(sweep, sort_keys=False))


@pytest.mark.slow
def test_a_build_that_corrupts_answers_under_pressure_passes_the_perf_gate_and_fails_the_correctness_gate(tmp_path):
    nights = Nights(tmp_path, points=[{"concurrency": 4, "conversations": 8}])
    _widened_gate(nights)
    nights.profiles(run_seed=1)
    first = _night(nights, "honest-n01", tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    second = _night(nights, "honest-n02", tmp_path)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "Nightly gate: PASS" in second.stdout

    store = NightStore(nights.store)
    honest = store.get("honest-n02")
    for dep in (HISPARSE, OFFLOAD):
        answers = honest.deployments[dep].answers
        assert answers is not None and answers.asked_under_pressure, dep
        assert answers.agreement_under_pressure == 1.0 and answers.score == 1.0, dep
    assert honest.deployments[HISPARSE].answers.baseline == OFFLOAD
    assert honest.deployments[HISPARSE].answers.agreement_with_baseline == 1.0

    # the same build, except that greedy replies asked while 2 or more requests run come out wrong
    nights.profiles(run_seed=1, extra={HISPARSE: {"sim": {"run_jitter": 0.03, "step_time_scale": 1.0, "run_seed": 1,
                                                          "faults": {"corrupt_under_pressure": 2}}}})
    corrupt = _night(nights, "corrupt-n03", tmp_path)
    assert corrupt.returncode == 1, corrupt.stdout[-3000:] + corrupt.stderr[-3000:]
    assert "Nightly gate: REGRESSION" in corrupt.stdout
    night = store.get("corrupt-n03")
    scores = night.deployments[HISPARSE].answers
    assert scores.agreement_under_pressure is not None and scores.agreement_under_pressure < 0.75
    assert night.deployments[OFFLOAD].answers.agreement_under_pressure == 1.0
    assert "answers changed under pressure" in corrupt.stdout
    # the performance gate passes: every finding is the correctness gate's
    reasons = [line for line in corrupt.stdout.splitlines() if line.startswith("| sim-")]
    assert reasons and all("answers_changed" in line or "answer_" in line for line in reasons), corrupt.stdout
    manifest = read_manifest(nights.results / "corrupt-n03")
    assert manifest.deployments[HISPARSE].correctness.pressured_concurrency == 4
    report = (nights.results / "corrupt-n03" / "report.md").read_text()
    section = report[report.index("## Correctness"):]
    assert f"| {HISPARSE} | 16 of 16 |" in section and "**fails**" in section and "passes" in section
    print("\n" + corrupt.stdout[corrupt.stdout.index("## Nightly gate"):] + "\n" + section[:section.index("## Provenance")])


def test_every_reason_the_judge_gives_has_words_in_the_nightly_table():
    from typing import get_args

    from harness.judge import Reason
    from harness.nightly.gate_markdown import _REASONS

    assert set(get_args(Reason)) == set(_REASONS)
