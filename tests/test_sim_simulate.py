"""`harness simulate`: a sweep in virtual time written as a run folder the rest of the harness reads;
and the prompt measurer that gives a conversation's next turn the same prefix blocks."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from sim_support import REPO

from harness.dataset.tokenizer import default_tokenizer_path, load_tokenizer
from harness.metrics.prom import parse_exposition
from harness.results import iter_points, read_manifest
from harness.sim.prompt import PromptMeasurer


def write_sweep(tmp_path):
    recipe = {"name": "sim-sample-test", "tokenizer": str(default_tokenizer_path()),
              "source": {"kind": "sample", "path": str(REPO / "harness/data/samples/openhands-sample.jsonl")},
              "pad": {"kind": "synthetic"}, "first_turn_length": 3000, "subsequent_turn_length": 200,
              "num_turns": 4, "conversations": 64, "assumed_output_length": 32}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    sweep = {"name": "sim-test", "dataset": "recipe.yaml", "gpus_per_server": 8,
             "client": {"model": "glm-agentx", "max_tokens": 32, "extra_args": {"ignore_eos": True},
                        "points": [{"concurrency": 1, "conversations": 2}, {"concurrency": 8, "conversations": 16}]},
             "scrape": {"interval_s": 0.2},
             "deployments": [{"name": "hisparse", "launch": str(REPO / "launch/sim-hisparse.yaml")},
                             {"name": "offload", "launch": str(REPO / "launch/sim-offload.yaml")}]}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def test_simulate_writes_a_simulated_run_folder(tmp_path):
    sweep = write_sweep(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "harness", "simulate", str(sweep), "--results-dir",
                           str(tmp_path / "results"), "--run-id", "v1"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SIMULATED" in proc.stdout
    run = tmp_path / "results" / "v1"
    manifest = read_manifest(run)
    assert manifest.simulated and manifest.status == "ok"
    assert manifest.points == {"hisparse": {"c1": "ok", "c8": "ok"}, "offload": {"c1": "ok", "c8": "ok"}}
    points = iter_points(run)
    assert len(points) == 4 and all(p.simulated and p.status == "ok" for p in points)
    by = {(p.deployment, p.concurrency): p for p in points}
    assert by[("hisparse", 8)].summary.success_requests == 16 * 4
    assert by[("hisparse", 8)].metrics.occupancy_mean_running > by[("offload", 8)].metrics.occupancy_mean_running
    assert by[("hisparse", 8)].metrics.hisparse_hit_rate is not None
    assert by[("offload", 8)].metrics.mtp_acceptance_length > 1
    lines = (run / "points/hisparse/c8/scrapes.jsonl").read_text().splitlines()
    names = {json.loads(line)["name"] for line in lines}
    assert "vllm:num_requests_running" in names and "vllm:hisparse_cache_hits_total" in names
    assert (run / "summary.csv").read_text().count("\n") == 5
    # deterministic: the same sweep gives the same points
    again = subprocess.run([sys.executable, "-m", "harness", "simulate", str(sweep), "--results-dir",
                            str(tmp_path / "results"), "--run-id", "v2", "--no-report"], cwd=REPO, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0
    first = [(p.summary, p.metrics.occupancy_mean_running) for p in points]
    second = [(p.summary, p.metrics.occupancy_mean_running) for p in iter_points(tmp_path / "results" / "v2")]
    assert first == second


def test_simulate_refuses_a_measured_run_folder(tmp_path):
    sweep = write_sweep(tmp_path)
    run = tmp_path / "results" / "real"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"run_id": "real", "sweep_name": "sim-test", "sweep_path": "x",
                                                   "gpus_per_server": 8, "simulated": False}))
    proc = subprocess.run([sys.executable, "-m", "harness", "simulate", str(sweep), "--results-dir",
                           str(tmp_path / "results"), "--run-id", "real"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and "choose another --run-id" in proc.stderr
    assert json.loads((run / "manifest.json").read_text())["simulated"] is False


def test_next_turn_hits_the_previous_prompt_blocks():
    tokenizer = load_tokenizer(default_tokenizer_path())
    measurer = PromptMeasurer(tokenizer, 64)
    turn1 = [{"role": "system", "content": "pad text " * 300}, {"role": "user", "content": "fix the bug " * 100}]
    turn2 = [*turn1, {"role": "assistant", "content": "done " * 40}, {"role": "user", "content": "now test " * 50}]
    first, second = measurer.measure(turn1), measurer.measure(turn2)
    assert first.tokens == tokenizer.count_chat(turn1) and second.tokens == tokenizer.count_chat(turn2)
    assert len(first.block_hashes) == first.tokens // 64
    shared = sum(1 for a, b in zip(first.block_hashes, second.block_hashes, strict=False) if a == b)
    assert shared >= len(first.block_hashes) - 1  # all but the block the generation prompt ends
    other = measurer.measure([{"role": "user", "content": "another conversation " * 200}])
    assert not set(other.block_hashes) & set(first.block_hashes)


def test_exposition_parses_with_the_harness_parser():
    from harness.config import load_launch
    from harness.sim.engine import Engine
    from harness.sim.engine_config import engine_config
    from harness.sim.exposition import MetricsText

    profile = load_launch(REPO / "launch/sim-offload.yaml").profile
    samples = parse_exposition(MetricsText(Engine(engine_config(profile)), "glm-agentx").render().decode(),
                               ["vllm:"])
    names = {s.name for s in samples}
    assert "vllm:kv_offload_store_bytes_total" in names and "vllm:time_to_first_token_seconds_count" in names
    assert all(s.labels.get("model_name") == "glm-agentx" for s in samples)


def test_samples_read_from_the_families_equal_the_parsed_text_at_every_scrape():
    """A simulated run reads its scrapes from the collector, not the text: at every scrape of a pressured
    point, on both arms (offload pool; HiSparse and offload pools; MTP on both, spec-decode off on one),
    with every keep-prefix shape, the samples equal what parse_exposition makes of the rendered text."""
    from harness.config import load_launch
    from harness.sim.engine import Engine
    from harness.sim.engine_config import engine_config
    from harness.sim.exposition import MetricsText
    from harness.sim.virtual import ConversationShape, run_point

    shapes = [ConversationShape(key=i, turn_tokens=(3000, 200, 150)) for i in range(8)]
    compared = 0
    for launch, sim_update, update in (("sim-offload", {}, {}),
                                       ("sim-hisparse", {"kv_pool_tokens": 4096}, {}),
                                       ("sim-hisparse", {}, {"speculative": None})):
        profile = load_launch(REPO / f"launch/{launch}.yaml").profile
        profile = profile.model_copy(update={**update, "sim": profile.sim.model_copy(update=sim_update)})
        config = engine_config(profile)
        assert bool(config.num_speculative_tokens) == ("speculative" not in update)
        engine = Engine(config)
        text = MetricsText(engine, "glm-agentx")

        def scrape(_now: float, text: MetricsText = text, launch: str = launch) -> None:
            nonlocal compared
            rendered = text.render().decode()
            for prefixes in (["vllm:"], [], ["vllm:num_requests", "vllm:hisparse_"], ["nothing:"]):
                assert text.samples(prefixes) == parse_exposition(rendered, prefixes), (launch, prefixes)
            compared += 1

        run_point(engine, shapes, concurrency=8, conversations=8, max_tokens=64, start_s=0.0,
                  scrape_interval_s=0.05, on_scrape=scrape)
        assert "kv_pool_tokens" not in sim_update or engine.counters.hisparse_spills > 0  # pressured: mixed too
    assert compared > 30


def _c1_tpot_ms(tmp_path, run_id: str, sim_extra: dict) -> float:
    """Mean TPOT of the HiSparse arm's c1 point, simulated in-process with extra `sim:` settings."""
    from harness.config import load_sweep
    from harness.simulate import SimulateOptions, simulate_sweep

    profile = yaml.safe_load((REPO / "launch/sim-hisparse.yaml").read_text())
    profile["sim"] = {**profile.get("sim", {}), **sim_extra}
    (tmp_path / f"{run_id}.yaml").write_text(yaml.safe_dump(profile))
    sweep = yaml.safe_load(write_sweep(tmp_path).read_text())
    sweep["deployments"] = [{"name": "hisparse", "launch": f"{run_id}.yaml"}]
    sweep["client"]["points"] = [{"concurrency": 1, "conversations": 2}]
    (tmp_path / f"sweep-{run_id}.yaml").write_text(yaml.safe_dump(sweep))
    outcome = simulate_sweep(load_sweep(tmp_path / f"sweep-{run_id}.yaml"),
                             SimulateOptions(run_id=run_id, results_root=tmp_path / "results"), progress=lambda _m: None)
    return iter_points(outcome.run_dir)[0].metrics.mean_tpot_ms


def test_step_time_scale_and_seeded_run_jitter(tmp_path):
    base = _c1_tpot_ms(tmp_path, "base", {})
    slower = _c1_tpot_ms(tmp_path, "slower", {"step_time_scale": 1.15})
    assert abs(slower / base - 1.15) < 0.01
    # the jitter is one draw per run, seeded by the run id: the same night again is the same, another differs
    night_a = _c1_tpot_ms(tmp_path, "night-a", {"run_jitter": 0.03})
    again = _c1_tpot_ms(tmp_path, "night-a", {"run_jitter": 0.03})
    night_b = _c1_tpot_ms(tmp_path, "night-b", {"run_jitter": 0.03})
    assert night_a == again and night_a != night_b
    assert 0.85 < night_a / base < 1.15 and 0.85 < night_b / base < 1.15
