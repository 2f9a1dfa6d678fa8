"""Capacity across context lengths: the search (ramp, then bisection), what a probe counts as every request
running, the engine's refusal of a context it cannot fit (a result, not a failure), and the simulated
blog deployment's capacity against its own logged bounds and the calculator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.capacity import Bracket, CapacityReport, probe_verdict, read_capacity
from harness.config import load_launch
from harness.evidence import parse_does_not_fit, parse_kv_capacity
from harness.records import PointMetrics, PointRecord
from harness.report.capacity import capacity_section
from harness.results import iter_points, read_manifest
from harness.sim.capacity import kv_capacity, refusal
from harness.sim.engine_config import engine_config

ROOT = Path(__file__).resolve().parents[1]


def _harness(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _search(capacity: int, start: int = 1, maximum: int = 64) -> tuple[Bracket, list[int]]:
    bracket, probed = Bracket(start, maximum), []
    while (c := bracket.next()) is not None:
        probed.append(c)
        bracket.record(c, c <= capacity)
    return bracket, probed


def test_the_search_ramps_then_bisects_to_the_capacity():
    bracket, probed = _search(21)
    assert probed == [1, 2, 4, 8, 16, 32, 24, 20, 22, 21]
    assert (bracket.passed, bracket.failed, bracket.bracketed) == (21, 22, True)
    assert _search(0)[0].passed is None and _search(0)[1] == [1]
    top, probed = _search(100, maximum=16)
    assert (top.passed, top.bracketed) == (16, False) and probed == [1, 2, 4, 8, 16]
    late, probed = _search(5, start=8)
    assert late.passed == 5 and probed == [8, 4, 6, 5]


def _record(status: str = "ok", **metrics) -> PointRecord:
    return PointRecord(deployment="d", concurrency=8, conversations=8, dataset_offset=0, status=status,
                       gpus_per_server=1, metrics=PointMetrics(**metrics))


def test_a_probe_passes_only_when_every_request_ran_at_once_without_preemption():
    assert probe_verdict(_record(max_running=8, preemptions=0), 8, 1.0).passed
    assert probe_verdict(_record(max_running=7, preemptions=0), 8, 1.0).why == \
        "at most 7 of 8 running together (- requests per engine step)"
    # no scrape caught them together, the engine's counters did: 1.97 requests per step over the probe
    caught = probe_verdict(_record(max_running=1, preemptions=0, decode_batch_mean=1.97), 2, 1.0)
    assert caught.passed and caught.why.startswith("1.97 requests per engine step (the gauge saw 1)")
    one_by_one = probe_verdict(_record(max_running=1, preemptions=0, decode_batch_mean=1.2), 2, 1.0)
    assert not one_by_one.passed and one_by_one.why == "at most 1 of 2 running together (1.20 requests per engine step)"
    assert probe_verdict(_record(max_running=7, preemptions=0), 8, 0.85).passed
    assert probe_verdict(_record(max_running=8, preemptions=2), 8, 1.0).why == "2 preemption(s)"
    assert probe_verdict(_record("does_not_fit"), 8, 1.0).why == "does not fit"
    assert not probe_verdict(_record(max_running=None), 8, 1.0).passed


def test_the_simulated_engine_refuses_what_vllm_refuses_in_vllms_words():
    offload = load_launch(ROOT / "launch" / "glm53-offload.yaml").profile
    at = lambda n: offload.model_copy(update={"serve": offload.serve.model_copy(update={"max_model_len": n})})  # noqa: E731
    fits, too_long = engine_config(at(256_000)), engine_config(at(512_000))
    assert refusal(fits) is None
    text = refusal(too_long)
    assert text.startswith("To serve at least one request with the model's max seq len (512000)")
    refused = parse_does_not_fit([f"ERROR sim: ValueError: {text}"])
    assert refused.max_model_len == 512_000 and 0 < refused.estimated_max_len < 512_000
    line = kv_capacity(fits).line(256_000)
    logged = parse_kv_capacity([f"INFO sim: {line}"])
    assert line.startswith("GPU KV cache size: ") and logged.tokens_per_request == 256_000
    assert logged.max_concurrency == pytest.approx(kv_capacity(fits).max_concurrency, abs=0.005)


@pytest.mark.slow
def test_a_context_that_cannot_fit_is_a_result_and_the_sweep_goes_on(tmp_path):
    """A served sweep over two contexts on the simulated engine (real EvalScope, real HTTP): the server of the
    long one refuses at start-up, its points say `does not fit` with the engine's reason, the short one runs,
    and the sweep exits 0."""
    sweep = yaml.safe_load((ROOT / "sweeps" / "sim.yaml").read_text())
    sweep.update(name="ctx", dataset=str(ROOT / "datasets" / "sim-sample.yaml"), contexts=[1000, 20000])
    sweep["client"]["points"] = [{"concurrency": 1, "conversations": 1}, {"concurrency": 2, "conversations": 2}]
    sweep["deployments"] = [{"name": "offload", "launch": str(ROOT / "launch" / "sim-offload.yaml")}]
    path = tmp_path / "ctx.yaml"
    path.write_text(yaml.safe_dump(sweep))
    done = _harness("sweep", str(path), "--run-id", "ctx", "--results-dir", str(tmp_path / "results"),
                    "--launcher", "local", "--no-report", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    run = tmp_path / "results" / "ctx"
    points = {(p.deployment, p.concurrency): p for p in iter_points(run)}
    refused = [p for (dep, _), p in points.items() if dep == "offload-ctx20k"]
    assert [p.status for p in refused] == ["does_not_fit", "does_not_fit"]
    assert refused[0].reason.startswith("To serve at least one request with the model's max seq len")
    assert {p.status for (dep, _), p in points.items() if dep == "offload-ctx1k"} == {"ok"}
    manifest = read_manifest(run)
    assert manifest.deployments["offload-ctx1k"].context_tokens == 1000
    assert manifest.status == "ok"


@pytest.mark.slow
def test_the_simulated_blog_deployment_holds_its_logged_bound_at_every_context(tmp_path):
    """Both blog arms at three contexts in virtual time: the measured capacity is within one request of the
    engine's logged bound everywhere, the baseline does not fit at 1M with vLLM's reason and HiSparse does,
    and the calculator's crossover lies between the two shortest contexts, where the measurements cross."""
    sweep = yaml.safe_load((ROOT / "sweeps" / "tp8-capacity.yaml").read_text())
    sweep.update(dataset=str(ROOT / "datasets" / "openhands-glm53.yaml"), contexts=["8k", "64k", 998944])
    sweep["search"]["max_concurrency"] = 64
    for dep in sweep["deployments"]:
        dep["launch"] = str(ROOT / "launch" / Path(dep["launch"]).name)
    path = tmp_path / "cap.yaml"
    path.write_text(yaml.safe_dump(sweep))
    done = _harness("capacity", str(path), "--simulate", "--run-id", "cap", "--results-dir",
                    str(tmp_path / "results"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report: CapacityReport = read_capacity(tmp_path / "results" / "cap")
    by = {(r.arm, r.context_tokens): r for r in report.results}
    hisparse, offload = "tp8-hisparse384-native128", "tp8-offload512"
    for r in report.results:
        if r.status == "does_not_fit":
            continue
        assert r.status == "measured" and r.logged_bound is not None, r
        assert abs(r.capacity - r.logged_bound) <= 1, (r.deployment, r.capacity, r.logged_bound)
        assert r.calculator_estimate is not None and abs(r.capacity - r.calculator_estimate) <= 1
    assert by[(offload, 998944)].status == "does_not_fit"
    assert "To serve at least one request" in by[(offload, 998944)].does_not_fit_reason
    assert by[(hisparse, 998944)].status == "measured" and by[(hisparse, 998944)].capacity >= 1
    # plain residency holds more at 8k, HiSparse more at 64k: the crossover is between, as the calculator says
    assert by[(offload, 8000)].capacity >= by[(hisparse, 8000)].capacity - 1
    assert by[(hisparse, 64000)].capacity > by[(offload, 64000)].capacity
    section = "\n".join(capacity_section(tmp_path / "results" / "cap"))
    cross = next(line for line in section.splitlines() if "crossover" in line)
    crossover = int(cross.split(" at ")[1].split(" tokens")[0].replace(",", ""))
    assert by[(offload, 8000)].max_model_len < crossover < by[(hisparse, 64000)].max_model_len
    assert (tmp_path / "plots" / "cap" / "capacity.png").is_file()
    assert "does not fit" in done.stdout and f"{hisparse} at 998,944 tokens: capacity" in done.stdout


def test_the_1m_probe_plans_both_arms_at_the_1m_limit_and_the_calculator_agrees_on_which_fits():
    """`plan sweeps/tp8-1m.yaml`: both blog arms' commands at --max-model-len 1000000, the dataset it needs,
    the offload arm expected to be refused; `calc` for the same deployments at the same length agrees."""
    done = _harness("plan", "sweeps/tp8-1m.yaml", cwd=ROOT)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    servers = [line for line in out.splitlines() if line.strip().startswith("server:")]
    assert len(servers) == 2 and all("--max-model-len 1000000" in s for s in servers)
    assert "Dataset: datasets/openhands-glm53-1m.yaml" in out and "conversations needed" in out
    assert "Deployment tp8-hisparse384-native128-ctx999748" in out and "Deployment tp8-offload512-ctx999748" in out
    assert "tp8-offload512-ctx999748: baseline (no HiSparse) holds no request of 1,000,000 tokens" in out
    fits = {}
    for arm in ("hisparse", "offload"):
        calc = _harness("calc", "--from-launch", f"launch/glm53-{arm}.yaml", "--seq-len", "1000000", "--json",
                        cwd=ROOT)
        assert calc.returncode == 0, calc.stderr
        fits[arm] = json.loads(calc.stdout)["predicted_total"]
    assert fits["hisparse"] >= 1 and fits["offload"] == 0
