"""Calibration machinery on the simulated engine (fast; the real-engine validation is
tests/test_calibrate_cpu_vllm.py): a fit recovers coefficients it was given, a simulated run is refused, the
validation figure sits beside the Pareto, and the modelling the calibration needs (dense profiles, prompt-only
offload, pending HiSparse page transfers)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.calibrate.observed import ClientRecords, ObservedPoint
from harness.calibrate.predict import predict
from harness.calibrate.table import load_table, setup_of, table_targets
from harness.calibrate.validate import VALIDATION_JSON, ValidationReport
from harness.config import LaunchProfile, load_launch
from harness.errors import HarnessError
from harness.records import PointMetrics, PointRecord
from harness.sim.engine import Engine, SimRequest
from harness.sim.engine_config import engine_config
from harness.sim.exposition import MetricsText
from harness.sim.profiles import ValidationRow, load_hardware_profile
from harness.sim.steptime import BatchItem, step_cost
from harness.sim.virtual import ConversationShape, run_point

ROOT = Path(__file__).resolve().parents[1]
TRUTH = {"step_overhead_s": 0.012, "flops_efficiency": 0.15}


def harness_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def measurement(id_: str, input_tokens: int, output_tokens: int, concurrency: int) -> dict:
    return {"id": id_, "model": "zai-org/GLM-5.3", "model_profile": "glm53", "engine": "sim", "hardware": "sim",
            "tensor_parallel_size": 8, "kv_cache_dtype": "fp8", "input_tokens": input_tokens,
            "output_tokens": output_tokens, "concurrency": concurrency, "requests": concurrency,
            "measured": {"tpot_ms": 1.0, "total_tok_s": 1.0}, "source": "synthetic (this test)"}


def test_a_fit_recovers_the_coefficients_that_made_the_measurements(tmp_path):
    """Measurements made by the simulator with known coefficients: calibrating the prior profile on them must
    find those coefficients again and reproduce every measured value."""
    rows = [measurement("decode-c1", 2000, 64, 1), measurement("prefill-c8", 8000, 8, 8)]
    table_path = tmp_path / "table.yaml"
    table_path.write_text(yaml.safe_dump({"hardware_profile": "h200", "measurements": rows}))
    truth = load_hardware_profile("h200").model_copy(update=TRUTH)
    for row, m in zip(rows, load_table(table_path).measurements, strict=True):
        made = predict(setup_of(m), truth)
        row["measured"] = {"tpot_ms": made.tpot_ms, "total_tok_s": made.total_tok_s}
    table_path.write_text(yaml.safe_dump({"hardware_profile": "h200", "measurements": rows}))

    out = tmp_path / "calibrated.yaml"
    done = harness_cli("calibrate", str(table_path), "--out", str(out), "--fit", ",".join(TRUTH))
    assert done.returncode == 0, done.stderr
    profile = load_hardware_profile(str(out))
    for name, value in TRUTH.items():
        assert getattr(profile, name) == pytest.approx(value, rel=0.05), name
        assert profile.sources[name].startswith("calibrated:"), profile.sources[name]
    calibration = profile.calibration
    assert calibration is not None and calibration.source_kind == "measurements"
    assert calibration.points == ["decode-c1", "prefill-c8"] and calibration.fitted == list(TRUTH)
    assert calibration.method.startswith("scipy.optimize.least_squares")
    assert {(f.point, f.quantity) for f in calibration.fit} == {(r["id"], q) for r in rows
                                                                  for q in ("tpot_ms", "total_tok_s")}
    assert all(abs(f.rel_error) < 0.02 for f in calibration.fit), calibration.fit
    assert "sources" in out.read_text() and "calibration" in out.read_text()


def test_the_blog_scale_profile_still_predicts_the_public_measurements_as_it_records():
    """harness/data/sim/h200-public.yaml (what sweeps/tp8.yaml simulates on) against the public measurements it was
    fitted to: the simulator today predicts every one of them as the profile's `calibration.fit` records, so a
    change to the engine that moves the blog-scale residuals shows here (docs/calibration.md)."""
    profile = load_hardware_profile("h200-public")
    assert profile.calibration is not None
    stored = {(r.point, r.quantity): r for r in profile.calibration.fit}
    table = load_table(ROOT / "harness/data/measurements/h200-public.yaml")
    predictions = {}
    for target in table_targets(table):
        if target.setup.name not in predictions:
            predictions[target.setup.name] = predict(target.setup, profile)
        now = predictions[target.setup.name].value(target.quantity)
        row = stored[(target.setup.name, target.quantity)]
        assert now == pytest.approx(row.predicted, rel=0.01), (target.setup.name, target.quantity, now, row)
        # unchanged or better against the measurement
        assert abs(now - target.measured) / target.measured <= abs(row.rel_error) + 0.005, (target.setup.name, now)


def test_a_point_whose_server_histograms_hold_the_probes_requests_takes_the_clients_tpot():
    """The correctness probe asks its prompts during a deployment's highest point: the server's TPOT histogram
    over that window holds them too (short, queued, preempted), the client's per-request TPOT only the point's
    own. On a quiet engine the client saw every reply stream (no burst) and is the point's TPOT; where a reply
    came in one burst the server's stays (docs/tpot.md)."""
    record = PointRecord(deployment="arm", concurrency=8, conversations=16, dataset_offset=0, status="ok",
                         gpus_per_server=1, metrics=PointMetrics(server_tpot_ms=6.9))
    client = ClientRecords(requests=48, mean_prompt_tokens=1000.0, completion_tokens=(512,) * 48, bursts=0,
                           mean_client_tpot_ms=4.9)
    assert ObservedPoint("arm:c8", record, 20.0, client).tpot_ms == 6.9  # no probe in the window
    probed = ObservedPoint("arm:c8", record, 20.0, client, other_requests=8)
    assert probed.tpot_from_client and probed.tpot_ms == 4.9
    bursty = ObservedPoint("arm:c8", record, 20.0, dataclasses.replace(client, bursts=3), other_requests=8)
    assert not bursty.tpot_from_client and bursty.tpot_ms == 6.9


def test_a_calibrated_profile_is_a_hardware_profile_a_launch_file_names_by_path(tmp_path):
    """The output loads where a profile name goes: sim.hardware_profile, relative to the launch file."""
    calibrated = load_hardware_profile("h200").model_copy(update={"name": "mine", "step_overhead_s": 0.02})
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles/mine.yaml").write_text(yaml.safe_dump(calibrated.model_dump(mode="json")))
    launch = tmp_path / "arm.yaml"
    launch.write_text(f"extends: {ROOT}/launch/sim-offload.yaml\nsim: {{hardware_profile: profiles/mine.yaml}}\n")
    config = engine_config(load_launch(launch).profile)
    assert config.hardware.name == "mine" and config.hardware.step_overhead_s == 0.02


def test_calibrate_refuses_a_simulated_run(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "refuse", "dataset": str(ROOT / "datasets/sim-sample.yaml"), "gpus_per_server": 8,
        "client": {"model": "glm-agentx", "max_tokens": 8, "points": [{"concurrency": 1, "conversations": 1}]},
        "deployments": [{"name": "offload", "launch": str(ROOT / "launch/sim-offload.yaml")}]}))
    done = harness_cli("simulate", str(sweep), "--results-dir", str(tmp_path / "results"), "--run-id", "sim",
                       "--no-report")
    assert done.returncode == 0, done.stderr
    refused = harness_cli("calibrate", str(tmp_path / "results/sim"), "--out", str(tmp_path / "x.yaml"))
    assert refused.returncode == HarnessError.exit_code
    lines = [line for line in refused.stderr.splitlines() if "Warning" not in line and "class " not in line]
    assert len(lines) == 1 and "a simulated run" in lines[0], refused.stderr
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.slow  # simulates a sweep and draws its report (8 s)
def test_validation_figure_sits_beside_the_pareto_in_the_report(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "fig", "dataset": str(ROOT / "datasets/sim-sample.yaml"), "gpus_per_server": 8,
        "client": {"model": "glm-agentx", "max_tokens": 8, "points": [{"concurrency": 1, "conversations": 1},
                                                                       {"concurrency": 2, "conversations": 2}]},
        "deployments": [{"name": "offload", "launch": str(ROOT / "launch/sim-offload.yaml")}]}))
    assert harness_cli("simulate", str(sweep), "--results-dir", str(tmp_path / "results"), "--run-id", "v",
                       "--no-report").returncode == 0
    run_dir = tmp_path / "results/v"
    report = ValidationReport(measured_run="measured", calibrated_profile="cal.yaml", calibration_points=["offload:c1"],
                              rows=[ValidationRow(point="offload:c1", held_out=False, tpot_ms_measured=5.0,
                                                  tpot_ms_predicted=5.1, total_tok_s_measured=900,
                                                  total_tok_s_predicted=880),
                                    ValidationRow(point="offload:c2", held_out=True, tpot_ms_measured=6.0,
                                                  tpot_ms_predicted=6.6, total_tok_s_measured=1600,
                                                  total_tok_s_predicted=1500)])
    (run_dir / VALIDATION_JSON).write_text(json.dumps(report.model_dump(mode="json")))
    done = harness_cli("report", str(run_dir), "--out", str(tmp_path / "plots"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "plots/validation.png").stat().st_size > 10_000
    text = (run_dir / "report.md").read_text()
    figures = [line for line in text.splitlines() if line.startswith("![")]
    assert figures[0].endswith("pareto.png)") and figures[1].endswith("validation.png)"), figures


def tiny_profile(**serve) -> LaunchProfile:
    profile = load_launch(ROOT / "launch/tiny-cpu.yaml").profile
    return profile.model_copy(update={"serve": profile.serve.model_copy(update=serve)})


def test_dense_tiny_llama_sizes_its_kv_as_vllm_cpu_does():
    config = engine_config(tiny_profile())
    # 2 layers x K and V x 2 KV heads x 32 x 2 bytes (bf16) = 512 bytes per token; vLLM CPU's 128-token
    # blocks; the pool is VLLM_CPU_KVCACHE_SPACE = 1 GiB
    assert config.sizing.sparse_row_bytes * config.model.num_layers == 512
    assert config.block_size == 128 and config.sizing.full_block_bytes == 128 * 512
    assert config.pool_pages == 2**30 // (128 * 512)
    assert config.max_num_batched_tokens == 2048 and config.max_num_seqs == 8  # vLLM CPU's default, the profile's
    pressured = engine_config(load_launch(ROOT / "launch/tiny-cpu-pressured.yaml").profile)
    assert pressured.block_size == 32 and pressured.pool_pages == 96  # --num-gpu-blocks-override 96 blocks of 32
    # dense attention reads the whole context every step: twice the context, twice the KV bytes
    near = step_cost([BatchItem(1, 1000)], model=config.model, hardware=config.hardware, tensor_parallel_size=1,
                     index_topk=0, sparse_row_bytes=config.sizing.sparse_row_bytes)
    far = step_cost([BatchItem(1, 2000)], model=config.model, hardware=config.hardware, tensor_parallel_size=1,
                    index_topk=0, sparse_row_bytes=config.sizing.sparse_row_bytes)
    assert far.kv_bytes == 2 * near.kv_bytes == 2 * 1000 * 512


def test_hisparse_on_a_dense_model_is_one_clear_error():
    profile = tiny_profile().model_copy(update={"kv": load_launch(ROOT / "launch/sim-hisparse.yaml").profile.kv})
    with pytest.raises(HarnessError, match="HiSparse needs a sparse-MLA model profile"):
        engine_config(profile)


def offload_engine(prompt_only: bool) -> Engine:
    profile = load_launch(ROOT / "launch/sim-offload.yaml").profile
    offload = profile.kv.offload.model_copy(update={"offload_prompt_only": prompt_only})
    return Engine(engine_config(profile.model_copy(update={"kv": profile.kv.model_copy(update={"offload": offload})})))


def finish_one(engine: Engine, prompt: int, output: int) -> SimRequest:
    bs = engine.config.block_size
    req = SimRequest("r", prompt, tuple(range(1000, 1000 + (prompt + output) // bs)), output, output)
    engine.add_request(req, 0.0)
    now = 0.0
    while engine.has_work():
        now = engine.step(now).end_s
    return req


def test_offload_prompt_only_leaves_decode_blocks_on_the_gpu():
    """vLLM's default (offload_prompt_only true): only the prompt's blocks go to the CPU pool; the blocks a
    request generates stay on the GPU (prefix-cached there). With false they are stored too."""
    bs, prompt, output = 64, 640, 256
    default = offload_engine(prompt_only=True)
    req = finish_one(default, prompt, output)
    block = default.cpu_block_bytes
    # the last token is sampled, never computed (as in vLLM): full blocks end at prompt + output - 1 tokens
    computed_blocks = (prompt + output - 1) // bs
    prompt_blocks, decode_blocks = req.block_hashes[:prompt // bs], req.block_hashes[prompt // bs:computed_blocks]
    assert len(decode_blocks) == 3
    assert default.counters.kv_offload_store_bytes == len(prompt_blocks) * block
    assert all(default.cpu.lookup(h) is not None for h in prompt_blocks)
    assert all(default.cpu.lookup(h) is None for h in decode_blocks)
    assert all(default.gpu.lookup(h) is not None for h in decode_blocks)  # still cached on the GPU
    everything = offload_engine(prompt_only=False)
    finish_one(everything, prompt, output)
    assert everything.counters.kv_offload_store_bytes == (len(prompt_blocks) + len(decode_blocks)) * block
    assert all(everything.cpu.lookup(h) is not None for h in decode_blocks)


def test_pending_page_transfers_follow_the_hot_buffer_misses():
    """Under pressure HiSparse serves requests from the host: the gauge shows the host pages the step in
    flight copies (not a constant 0), in the exposition too, and drops to 0 when the engine is idle."""
    profile = load_launch(ROOT / "launch/sim-hisparse.yaml").profile
    profile = profile.model_copy(update={"sim": profile.sim.model_copy(update={"kv_pool_tokens": 4096})})
    engine = Engine(engine_config(profile))
    text = MetricsText(engine, "m")
    seen: list[float] = []

    def scrape(_now: float) -> None:
        seen.append(engine.gauges().hisparse_pending_page_transfers)
        assert f"vllm:hisparse_pending_page_transfers{{engine=\"0\",model_name=\"m\"}} {float(seen[-1])}" in \
            text.render().decode()

    shapes = [ConversationShape(key=i, turn_tokens=(3000, 200)) for i in range(6)]
    run_point(engine, shapes, concurrency=6, conversations=6, max_tokens=64, start_s=0.0, scrape_interval_s=0.01,
              on_scrape=scrape)
    assert engine.counters.hisparse_spills > 0  # the pool was too small: some requests went mixed
    assert max(seen) > 0
    assert engine.gauges().hisparse_pending_page_transfers == 0 and seen[-1] == 0
