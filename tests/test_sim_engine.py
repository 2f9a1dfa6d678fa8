"""The simulated engine's invariants, its capacity against the blog's concurrency calculator, and the
two arms separating for the right reasons (virtual time, no HTTP)."""

from __future__ import annotations

import dataclasses

import pytest
from sim_support import REPO

from harness.config import DatasetRecipe, LaunchProfile, load_launch
from harness.sim.engine import Engine, SimRequest
from harness.sim.engine_config import engine_config
from harness.sim.virtual import ConversationShape, run_point, shapes_from_recipe


def engine_for(policy: str, *, mtp: bool, row_bytes: int | None = 576, **serve) -> Engine:
    profile = {"engine": "sim",
               "serve": {"model": "m", "tensor_parallel_size": 8, "kv_cache_dtype": "fp8", "max_model_len": 200000,
                         "max_num_batched_tokens": 32768, "max_num_seqs": 1024, "enable_prefix_caching": False,
                         **serve},
               "sim": {"sparse_row_bytes": row_bytes} if row_bytes else {}}
    if policy == "hisparse":
        profile["kv"] = {"hisparse": {"host_pool_gib": 8192}}
    if mtp:
        profile["speculative"] = {"method": "mtp", "num_speculative_tokens": 3}
    return Engine(engine_config(LaunchProfile.model_validate(profile)))


def checked_step(engine: Engine, now: float):
    result = engine.step(now)
    assert engine.check_invariants() == []
    return result


# docs/facts.md §4 worked values (H200, TP8, fp8, the calculator's 576-byte rows, default host pool):
# (sequence length, MTP3?) -> (baseline, HiSparse). MTP3 sizes the hot buffer at 10,240 rows.
CALCULATOR = {(81920, False): (4, 39), (81920, True): (4, 22), (142000, False): (2, 29), (142000, True): (2, 18)}


@pytest.mark.parametrize("policy", ["none", "hisparse"])
@pytest.mark.parametrize("seq_len,mtp", list(CALCULATOR))
def test_steady_state_capacity_matches_the_calculator(policy, seq_len, mtp):
    engine = engine_for(policy, mtp=mtp)
    output = 1000
    prompt = seq_len - output
    for i in range(60):
        engine.add_request(SimRequest(f"r{i}", prompt, tuple(range(i * 10**6, i * 10**6 + prompt // 64)),
                                      output, output), 0.0)
    now, running = 0.0, []
    while True:
        result = checked_step(engine, now)
        now = result.end_s
        if result.finished:
            break
        # steady state: the queue is not empty and every running request is decoding near seq_len
        if engine.waiting and engine.running and all(s.num_computed >= prompt for s in engine.running):
            running.append(len(engine.running))
    expected = CALCULATOR[(seq_len, mtp)][0 if policy == "none" else 1]
    assert running, "never reached a steady state"
    assert abs(min(running) - expected) <= 1 and abs(max(running) - expected) <= 1, (running, expected)


def sample_recipe(**changes) -> DatasetRecipe:
    return DatasetRecipe.model_construct(**{
        "name": "t", "first_turn_length": 3000, "subsequent_turn_length": 200, "num_turns": 4,
        "conversations": 64, "assumed_output_length": 32, **changes})


def launch_engine(name: str, **sim) -> Engine:
    profile = load_launch(REPO / "launch" / name).profile
    if sim:
        profile = profile.model_copy(update={"sim": profile.sim.model_copy(update=sim)})
    return Engine(engine_config(profile))


class CheckedEngine:
    """Wraps step(): invariants, counter monotonicity and request accounting after every step."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.config = engine.config
        self.added: list[str] = []
        self.finished: list[str] = []
        self.last = dataclasses.asdict(engine.counters)

    def add_request(self, req: SimRequest, now: float) -> None:
        self.added.append(req.request_id)
        self.engine.add_request(req, now)

    def step(self, now: float):
        result = checked_step(self.engine, now)
        counters = dataclasses.asdict(self.engine.counters)
        assert all(counters[k] >= self.last[k] for k in counters), "a counter went down"
        self.last = counters
        self.finished += [f.request_id for f in result.finished]
        assert not result.aborted
        return result


@pytest.mark.parametrize("launch", ["sim-hisparse.yaml", "sim-offload.yaml"])
def test_invariants_every_step_and_no_request_lost(launch):
    checked = CheckedEngine(launch_engine(launch))
    shapes = shapes_from_recipe(sample_recipe(), 24)
    now = 0.0
    for parallel, number in ((1, 2), (4, 8), (8, 16)):
        run = run_point(checked, shapes, concurrency=parallel, conversations=number, max_tokens=32, start_s=now)
        assert len(run.requests) == number * 4 and all(r.ok for r in run.requests)
        assert all(r.output_tokens == 32 for r in run.requests)
        now = run.end_s
    assert sorted(checked.added) == sorted(checked.finished)
    assert len(set(checked.finished)) == len(checked.finished)
    engine = checked.engine
    assert not engine.running and not engine.waiting
    assert engine.gpu.held_pages == 0 and engine.gpu.hot_pages == 0


def test_same_seed_same_virtual_results():
    def once():
        engine = launch_engine("sim-hisparse.yaml")
        run = run_point(engine, shapes_from_recipe(sample_recipe(), 16), concurrency=8, conversations=16, max_tokens=32,
                        start_s=0.0)
        return run.requests, dataclasses.asdict(engine.counters)

    assert once() == once()
    other_seed = launch_engine("sim-hisparse.yaml", seed=1)
    run = run_point(other_seed, shapes_from_recipe(sample_recipe(), 16), concurrency=8, conversations=16, max_tokens=32,
                    start_s=0.0)
    assert run.requests != once()[0]


def point(launch: str, parallel: int, number: int, shapes: list[ConversationShape], max_tokens: int):
    engine = launch_engine(launch)
    samples: list[int] = []
    run = run_point(engine, shapes, concurrency=parallel, conversations=number, max_tokens=max_tokens, start_s=0.0,
                    scrape_interval_s=0.05, on_scrape=lambda _t: samples.append(len(engine.running)))
    from harness.simulate import evalscope_like_summary

    summary = evalscope_like_summary(run)
    busy = [s for s in samples if s > 0]
    return summary, sum(busy) / len(busy), engine.counters


def test_scaled_workload_arms_separate():
    shapes = shapes_from_recipe(sample_recipe(), 32)
    h1, _, _ = point("sim-hisparse.yaml", 1, 2, shapes, 32)
    o1, _, _ = point("sim-offload.yaml", 1, 2, shapes, 32)
    assert h1.mean_tpot_ms == pytest.approx(o1.mean_tpot_ms, rel=0.05)
    h8, h_running, h_counters = point("sim-hisparse.yaml", 8, 16, shapes, 32)
    o8, o_running, o_counters = point("sim-offload.yaml", 8, 16, shapes, 32)
    assert h_running > o_running + 2
    assert h8.total_throughput_tok_s > o8.total_throughput_tok_s
    # the reasons: the offload arm reloads or recomputes, HiSparse spills and pays host-to-device per step
    assert o_counters.preemptions > 0 or o_counters.kv_offload_load_bytes > 0
    assert h_counters.hisparse_spills > 0 and h_counters.hisparse_host_to_device_bytes > 0
    assert h_counters.preemptions <= o_counters.preemptions


@pytest.mark.slow
def test_blog_workload_arms_separate_in_virtual_time():
    """The blog's shape (74,160 + 12 x 753 tokens, 220 out) on the blog's two arms, c1 and c16."""
    shapes = shapes_from_recipe(sample_recipe(first_turn_length=74160, subsequent_turn_length=753,
                                              num_turns=13, conversations=32), 32)
    blog = ("glm53-hisparse.yaml", "glm53-offload.yaml")
    (h1, _, _), (o1, _, _) = (point(name, 1, 1, shapes, 220) for name in blog)
    assert 1000 / h1.mean_tpot_ms == pytest.approx(1000 / o1.mean_tpot_ms, rel=0.05)
    (h16, h_running, _), (o16, o_running, o_counters) = (point(name, 16, 16, shapes, 220) for name in blog)
    assert h_running > o_running
    assert h16.total_throughput_tok_s > o16.total_throughput_tok_s
    assert o_counters.preemptions > 0
