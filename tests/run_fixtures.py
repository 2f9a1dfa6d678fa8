"""Realistic run folders for the analysis tests: manifest.json, point.json and scrapes.jsonl.

The numbers follow the blog's shape (8x H200, TP8, MTP3, 13-turn 74,160-token
conversations, 220 output tokens): the offload baseline saturates at about four
running requests while Hybrid HiSparse keeps admitting. Scrapes are generated per
point on a 30 s grid with the vLLM metric names of docs/facts.md §2, and each point's
metrics are computed from the scrapes written for it, so the two agree.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from harness.records import (
    BuildRecord,
    DeploymentRecord,
    EvalScopeSummary,
    GpuRecord,
    PointMetrics,
    PointRecord,
    ProvenanceRecord,
    WorkloadRecord,
)
from harness.results import RunPaths, RunRecorder

HISPARSE = "tp8-hisparse384-native128"
OFFLOAD = "tp8-offload512"
DEPLOYMENTS = (HISPARSE, OFFLOAD)
POINTS = ((1, 4), (8, 16), (16, 32), (32, 64))  # (parallel, number)

TURNS = 13
OUTPUT_TOKENS = 220
FIRST_TURN_TOKENS = 74_160
LATER_TURN_TOKENS = 753
SCRAPE_INTERVAL_S = 30.0
LABELS = {"model_name": "glm-agentx", "engine": "0"}


@dataclass(frozen=True)
class ArmModel:
    """How one deployment behaves: admitted concurrency and per-user decode speed."""

    max_running: float
    interactivity_c1: float
    interactivity_floor: float
    acceptance_length: float
    hisparse: bool


ARMS = {
    HISPARSE: ArmModel(max_running=22.0, interactivity_c1=86.0, interactivity_floor=34.0,
                       acceptance_length=2.62, hisparse=True),
    OFFLOAD: ArmModel(max_running=3.8, interactivity_c1=88.0, interactivity_floor=52.0,
                      acceptance_length=2.58, hisparse=False),
}


def _mean_prompt_tokens() -> float:
    # request j of a conversation re-sends every earlier turn and reply
    lengths = [FIRST_TURN_TOKENS + j * (LATER_TURN_TOKENS + OUTPUT_TOKENS) for j in range(TURNS)]
    return sum(lengths) / TURNS


class _Counters:
    """Cumulative server counters, kept across the points of one deployment (one server)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def add(self, name: str, delta: float) -> None:
        self.values[name] = self.values.get(name, 0.0) + max(delta, 0.0)

    def reset(self) -> None:
        self.values = {name: 0.0 for name in self.values}


def _samples(t: float, scrape: int, gauges: dict[str, float], counters: _Counters) -> list[dict]:
    out = [{"t": t, "scrape": scrape, "name": name, "labels": LABELS, "value": value}
           for name, value in gauges.items()]
    out += [{"t": t, "scrape": scrape, "name": name, "labels": LABELS, "value": value}
            for name, value in sorted(counters.values.items())]
    return out


def _point(paths: RunPaths, dep: str, parallel: int, number: int, offset: int, start_s: float,
           counters: _Counters, rng: random.Random, *, gpus: int, simulated: bool,
           interactivity_factor: float, tpot_server_factor: float, restart: bool,
           scrape_error: bool) -> tuple[PointRecord, float]:
    arm = ARMS[dep]
    running = min(float(parallel), arm.max_running)
    # per-user speed falls as more requests share the batch, and with it rises TPOT
    share = (running - 1.0) / max(ARMS[HISPARSE].max_running - 1.0, 1.0)
    interactivity = (arm.interactivity_c1 - (arm.interactivity_c1 - arm.interactivity_floor) * share ** 0.7)
    # queued requests preempt and reload the running ones' KV: the baseline slows under pressure
    interactivity /= 1.0 + 0.04 * max(0.0, parallel - arm.max_running) / arm.max_running
    interactivity *= interactivity_factor
    tpot_ms = 1000.0 / interactivity
    output_rate = running * interactivity  # tokens/s for the whole server
    requests = number * TURNS
    wall_s = requests * OUTPUT_TOKENS / output_rate * 1.12 + 8.0
    prompt_tokens = _mean_prompt_tokens()
    total_rate = requests * (prompt_tokens + OUTPUT_TOKENS) / wall_s
    end_s = start_s + wall_s

    lines: list[dict] = []
    times = [start_s + k * SCRAPE_INTERVAL_S for k in range(int(wall_s // SCRAPE_INTERVAL_S) + 1)] + [end_s]
    reset_at = len(times) // 2 if restart else -1
    running_samples, waiting_samples, kv_samples = [], [], []
    prev_t = start_s
    for k, t in enumerate(times):
        if k == reset_at:
            counters.reset()
        dt = t - prev_t
        prev_t = t
        edge = k in (0, len(times) - 1)
        run_now = 0.0 if edge else min(float(parallel), max(1.0, round(running + rng.uniform(-0.6, 0.6) * min(running, 3))))
        wait_now = 0.0 if edge else max(0.0, round(parallel - run_now - rng.uniform(0, 1)))
        kv_now = 0.02 if edge else min(0.97, (0.04 + 0.041 * run_now) if arm.hisparse
                                       else 0.62 + 0.08 * run_now + rng.uniform(-0.02, 0.02))
        if scrape_error and k == 1:
            lines.append({"t": t, "scrape": k, "error": "GET /metrics: connection refused"})
            continue
        out_tokens = output_rate * dt * (run_now / running if running else 0.0)
        drafts = out_tokens / arm.acceptance_length
        counters.add("vllm:spec_decode_num_drafts_total", drafts)
        counters.add("vllm:spec_decode_num_accepted_tokens_total", drafts * (arm.acceptance_length - 1.0))
        counters.add("vllm:generation_tokens_total", out_tokens)
        counters.add("vllm:prompt_tokens_total", total_rate * dt - out_tokens)
        counters.add("vllm:prefix_cache_queries_total", total_rate * dt)
        counters.add("vllm:prefix_cache_hits_total", total_rate * dt * 0.93)
        done = out_tokens / OUTPUT_TOKENS
        counters.add("vllm:request_time_per_output_token_seconds_count", done)
        counters.add("vllm:request_time_per_output_token_seconds_sum", done * tpot_ms * tpot_server_factor / 1e3)
        pressure = max(0.0, parallel - arm.max_running)
        counters.add("vllm:num_preemptions_total", 0.0 if arm.hisparse else round(pressure * dt / 60.0))
        offload_gb_s = (0.4 + 0.05 * pressure) if not arm.hisparse else 0.15
        counters.add("vllm:kv_offload_load_bytes_total", offload_gb_s * 1e9 * dt)
        counters.add("vllm:kv_offload_store_bytes_total", 0.6 * offload_gb_s * 1e9 * dt)
        gauges = {"vllm:num_requests_running": run_now, "vllm:num_requests_waiting": wait_now,
                  "vllm:kv_cache_usage_perc": kv_now}
        if arm.hisparse:
            hit = 0.97 - 0.004 * run_now
            lookups = run_now * 2048 * 78 * dt * interactivity / arm.acceptance_length
            counters.add("vllm:hisparse_cache_hits_total", lookups * hit)
            counters.add("vllm:hisparse_cache_misses_total", lookups * (1 - hit))
            counters.add("vllm:hisparse_host_to_device_bytes_total", lookups * (1 - hit) * 656 / 78)
            gauges["vllm:hisparse_host_cache_usage_perc"] = min(0.9, 0.03 * run_now)
        lines += _samples(t, k, gauges, counters)
        running_samples.append(run_now)
        waiting_samples.append(wait_now)
        kv_samples.append(kv_now)

    point_dir = paths.point_dir(dep, parallel)
    point_dir.mkdir(parents=True, exist_ok=True)
    with open(paths.scrapes_jsonl(dep, parallel), "w") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in lines)

    nonzero = [r for r in running_samples if r > 0]
    server_tpot_ms = tpot_ms * tpot_server_factor
    summary = EvalScopeSummary(
        total_requests=requests, success_requests=requests, failed_requests=0,
        total_throughput_tok_s=total_rate, output_throughput_tok_s=output_rate / 1.12,
        request_throughput_req_s=requests / wall_s, mean_ttft_ms=900.0 + 160.0 * running,
        mean_tpot_ms=tpot_ms, mean_itl_ms=tpot_ms * arm.acceptance_length,
        mean_latency_s=OUTPUT_TOKENS * tpot_ms / 1e3 + 1.0, mean_input_tokens=prompt_tokens,
        mean_output_tokens=float(OUTPUT_TOKENS), time_taken_s=wall_s, key_set=">=1.10")
    hit = 0.97 - 0.004 * running
    metrics = PointMetrics(
        interactivity_tok_s_user=interactivity, total_tok_s_per_gpu=total_rate / gpus,
        output_tok_s_per_gpu=summary.output_throughput_tok_s / gpus, mean_ttft_ms=summary.mean_ttft_ms,
        mean_tpot_ms=tpot_ms, occupancy_mean_running=sum(nonzero) / len(nonzero) if nonzero else None,
        mean_waiting=sum(waiting_samples) / len(waiting_samples), max_running=max(running_samples),
        mtp_acceptance_length=arm.acceptance_length,
        preemptions=0.0 if arm.hisparse else round(max(0.0, parallel - arm.max_running) * wall_s / 60.0),
        kv_usage_mean=sum(kv_samples) / len(kv_samples), kv_usage_max=max(kv_samples),
        offload_load_bytes=None, offload_store_bytes=None,
        hisparse_hit_rate=hit if arm.hisparse else None,
        hisparse_h2d_bytes_per_s=(running * 2048 * (1 - hit) * 656 * interactivity / arm.acceptance_length)
        if arm.hisparse else None,
        prefix_cache_hit_rate=0.93, server_tpot_ms=server_tpot_ms,
        tpot_rel_diff=tpot_server_factor - 1.0, tpot_disagrees=abs(tpot_server_factor - 1.0) > 0.10,
        tpot_client_low=tpot_server_factor - 1.0 > 0.10, server_interactivity_tok_s_user=1000.0 / server_tpot_ms,
        counter_resets=1 if restart else 0, scrapes_ok=len(running_samples),
        scrapes_failed=1 if scrape_error else 0, window_s=wall_s)
    record = PointRecord(
        deployment=dep, concurrency=parallel, conversations=number, dataset_offset=offset, status="ok",
        started_unix_s=start_s, ended_unix_s=end_s, wall_s=wall_s, evalscope_wall_s=wall_s - 2.0,
        evalscope_command=["evalscope", "perf", "--parallel", str(parallel), "--number", str(number)],
        server_restarted=restart, simulated=simulated, gpus_per_server=gpus, summary=summary, metrics=metrics)
    return record, end_s


def _failed_point(paths: RunPaths, dep: str, parallel: int, number: int, offset: int, start_s: float,
                  *, gpus: int, simulated: bool) -> tuple[PointRecord, float]:
    end_s = start_s + 95.0
    paths.point_dir(dep, parallel).mkdir(parents=True, exist_ok=True)
    with open(paths.scrapes_jsonl(dep, parallel), "w") as fh:
        fh.write(json.dumps({"t": start_s, "scrape": 0, "error": "GET /metrics: connection refused"}) + "\n")
    record = PointRecord(
        deployment=dep, concurrency=parallel, conversations=number, dataset_offset=offset, status="failed",
        reason="server exited with code -9 during EvalScope (0 of 416 requests succeeded)",
        started_unix_s=start_s, ended_unix_s=end_s, wall_s=95.0, simulated=simulated, gpus_per_server=gpus,
        server_log_tail=["torch.OutOfMemoryError: CUDA out of memory", "Engine core proc died"],
        summary=EvalScopeSummary(total_requests=number * TURNS, success_requests=0,
                                 failed_requests=number * TURNS, key_set=">=1.10"))
    return record, end_s


def make_run(results_root: Path, run_id: str = "run-a", *, deployments: tuple[str, ...] = DEPLOYMENTS,
             points: tuple[tuple[int, int], ...] = POINTS, gpu_model: str = "NVIDIA H200",
             gpus_per_server: int = 8, simulated: bool = False,
             interactivity_drop: tuple[str, int, float] | None = None,
             failed_point: tuple[str, int] | None = None,
             tpot_disagree_at: tuple[str, int] | None = None,
             restart_at: tuple[str, int] | None = None,
             scrape_error_at: tuple[str, int] | None = None,
             conversations_built: int = 216, seed: int = 7, workload_hash: str = "sha256:5be1c0ffee") -> Path:
    """Write results_root/<run_id>/ and return it.

    interactivity_drop=(dep, parallel, 0.2) lowers that point's interactivity by 20%;
    failed_point, tpot_disagree_at, restart_at, scrape_error_at name a (dep, parallel).
    """
    needed = sum(n for _, n in points) + 52
    recorder = RunRecorder.open(
        Path(results_root) / run_id, sweep_name="glm53-tp8", sweep_path="sweeps/tp8.yaml", simulated=simulated,
        gpus_per_server=gpus_per_server, gpu_model=gpu_model,
        workload=WorkloadRecord(recipe="openhands-glm53", dataset_sha256=workload_hash, num_turns=TURNS,
                                first_turn_length=FIRST_TURN_TOKENS, subsequent_turn_length=LATER_TURN_TOKENS,
                                max_tokens=OUTPUT_TOKENS, conversations_built=conversations_built,
                                conversations_needed=needed),
        resolved_config={}, started_at="2026-05-28T02:13:20Z",
        deployments={dep: DeploymentRecord(launch=f"launch/{dep}.yaml", engine="vllm",
                                           build=BuildRecord(kind="pypi", spec="vllm==0.33.0",
                                                             vllm_version="0.33.0"))
                     for dep in deployments},
        points={dep: [f"c{parallel}" for parallel, _ in points] for dep in deployments})
    recorder.record_provenance(ProvenanceRecord(
        harness_commit="d9ea2f4", evalscope_version="1.14.1",
        gpu=GpuRecord(model=gpu_model, count=gpus_per_server, driver="580.82.07"), host_ram_gib=2015.6,
        config_files={"sweeps/tp8.yaml": "3f1a9c0e"}))
    paths = recorder.paths
    rng = random.Random(seed)
    t0 = 1_780_000_000.0
    for dep in deployments:
        counters = _Counters()
        start_s = t0
        offset = 52
        for parallel, number in points:
            key = (dep, parallel)
            if key == failed_point:
                record, end_s = _failed_point(paths, dep, parallel, number, offset, start_s,
                                              gpus=gpus_per_server, simulated=simulated)
            else:
                factor = 1.0
                if interactivity_drop and interactivity_drop[:2] == key:
                    factor = 1.0 - interactivity_drop[2]
                record, end_s = _point(
                    paths, dep, parallel, number, offset, start_s, counters, rng, gpus=gpus_per_server,
                    simulated=simulated, interactivity_factor=factor,
                    tpot_server_factor=1.25 if key == tpot_disagree_at else 1.02,
                    restart=key == restart_at, scrape_error=key == scrape_error_at)
            if record.server_restarted:
                recorder.count_restart(dep)
            recorder.record_point(record)
            offset += number
            start_s = end_s + 5.0  # EvalScope's --sleep-interval between points
    recorder.finish(ended_at="2026-05-28T05:40:02Z")
    return paths.root
