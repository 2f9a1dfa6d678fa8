"""`simulate SWEEP.yaml`: every deployment of a sweep on the simulated engine in virtual time, written
as a run folder by the same run recorder as a sweep (harness/results.py), marked simulated, so plot, report and
compare read it unchanged. No EvalScope runs: the summary is computed as EvalScope computes it
(docs/facts.md §6), and the scrapes come from the engine's own /metrics text at virtual times."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import provenance
from harness.config import LoadedSweep
from harness.io import iso_from_unix
from harness.metrics.derive import derive_point_metrics
from harness.metrics.evalscope_requests import RequestRow
from harness.metrics.scrape import ScrapeRecord
from harness.plan import DeploymentPlan, Plan, PointPlan, make_plan
from harness.point import does_not_fit_record
from harness.records import EvalScopeSummary, FailureKind, PointRecord, PointStatus, point_status
from harness.results import new_run_id, run_dir_for
from harness.runner import open_recorder
from harness.sim.capacity import refusal
from harness.sim.engine import Engine
from harness.sim.engine_config import engine_config, stable_seed
from harness.sim.exposition import MetricsText
from harness.sim.virtual import ConversationShape, PointRun, run_point, shapes_from_recipe


@dataclass(frozen=True)
class SimulateOptions:
    run_id: str | None = None
    results_root: Path = Path("results")
    start_unix_s: float | None = None  # virtual time 0 as a Unix time; default: now


SIMULATED_NOTE = "virtual time (harness simulate); no GPU, no EvalScope"


@dataclass
class SimulateOutcome:
    run_dir: Path
    points: int
    wall_s: float
    simulated_s: float
    ok: int = 0
    degraded: int = 0
    failed: int = 0
    skipped: int = 0  # virtual time re-runs every point
    does_not_fit: int = 0
    status: str = "running"
    failures: list[str] = field(default_factory=list)


def evalscope_like_summary(run: PointRun) -> EvalScopeSummary:
    """The summary EvalScope would write for these requests (its definitions, docs/facts.md §6)."""
    ok = [r for r in run.requests if r.ok]
    duration = run.duration_s or 1e-9
    tpots = [(r.end_s - r.first_token_s) / (r.output_tokens - 1) for r in ok
             if r.first_token_s is not None and r.output_tokens > 1]
    itls = [(r.end_s - r.first_token_s) / (r.chunks - 1) for r in ok
            if r.first_token_s is not None and r.chunks > 1]
    prompt = sum(r.prompt_tokens for r in ok)
    output = sum(r.output_tokens for r in ok)

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    ttft = mean([r.first_token_s - r.start_s for r in ok if r.first_token_s is not None])
    tpot = mean(tpots)
    itl = mean(itls)
    return EvalScopeSummary(
        total_requests=len(run.requests), success_requests=len(ok), failed_requests=len(run.requests) - len(ok),
        total_throughput_tok_s=(prompt + output) / duration, output_throughput_tok_s=output / duration,
        request_throughput_req_s=len(ok) / duration,
        mean_ttft_ms=None if ttft is None else ttft * 1000, mean_tpot_ms=None if tpot is None else tpot * 1000,
        mean_itl_ms=None if itl is None else itl * 1000, mean_latency_s=mean([r.end_s - r.start_s for r in ok]),
        mean_input_tokens=prompt / len(ok) if ok else None, mean_output_tokens=output / len(ok) if ok else None,
        time_taken_s=run.duration_s, key_set=">=1.10")


def request_rows(run: PointRun) -> list[RequestRow]:
    """The point's requests as EvalScope's per-request rows would record them, for the percentiles and goodput
    (harness/metrics/derive.py, the same functions as a served point). The engine records no time per chunk,
    so a request's chunk gaps are its decode span split evenly over its chunks."""
    rows = []
    for r in run.requests:
        first = None if r.first_token_s is None else r.first_token_s - r.start_s
        span = None if r.first_token_s is None else r.end_s - r.first_token_s
        gaps = (span / (r.chunks - 1),) * (r.chunks - 1) if span is not None and r.chunks > 1 else ()
        rows.append(RequestRow(latency_s=r.end_s - r.start_s, first_chunk_s=first, prompt_tokens=r.prompt_tokens,
                               completion_tokens=r.output_tokens, success=r.ok, chunk_gaps_s=gaps))
    return rows


def _simulated_status(summary: EvalScopeSummary, max_failed_requests: int
                     ) -> tuple[PointStatus, str | None, FailureKind | None]:
    """A simulated point's status by the sweep's own rule (records.point_status): requests the engine could
    never place are failed requests; none served at all is a failed point, as a served sweep says."""
    failed = summary.failed_requests or 0
    if not summary.success_requests:
        return "failed", f"no request succeeded ({failed} failed: they never fit the KV pool)", "server"
    status = point_status(failed, max_failed_requests)
    if status == "ok":
        return "ok", None, None
    return status, f"{failed} of {summary.total_requests} requests failed (they never fit the KV pool)", "requests"


def simulate_sweep(loaded: LoadedSweep, options: SimulateOptions, progress=print) -> SimulateOutcome:
    wall_start = time.monotonic()
    plan = make_plan(loaded)
    sweep = loaded.sweep
    base_unix = options.start_unix_s if options.start_unix_s is not None else time.time()
    run_id = options.run_id or new_run_id(sweep.name, simulated=True)
    recorder = open_recorder(plan, run_dir_for(options.results_root, run_id), simulated=True,
                             engine_label="sim (virtual time)", started_at=iso_from_unix(base_unix))
    recorder.record_provenance(provenance.collect(loaded, None, None, simulated=SIMULATED_NOTE))
    recorder.update_workload(source="recipe shape (virtual time, no text)")
    simulated_s = 0.0
    written = 0
    counts = {"ok": 0, "degraded": 0, "failed": 0, "does_not_fit": 0}
    failures: list[str] = []
    for dep in plan.deployments:
        config = engine_config(dep.profile, run_seed=stable_seed(run_id, dep.name))
        recorder.update_deployment(dep.name, policy=config.policy)
        refused = refusal(config)
        if refused is not None:  # as vLLM refuses the max_model_len at start-up: a result, recorded per point
            progress(f"simulate: {dep.name}: does not fit: {refused[:160]}")
            for point in dep.points:
                recorder.record_point(does_not_fit_record(plan, point, refused, [f"ValueError: {refused}"]))
                written += 1
                counts["does_not_fit"] += 1
            continue
        engine = Engine(config)
        shapes = shapes_from_recipe((dep.recipe or loaded.recipe).recipe, plan.dataset.build_conversations)
        now = 0.0
        for point in dep.points:
            record, scrapes, run = simulate_point(plan, dep, point, engine, shapes, base_unix, now)
            recorder.write_scrapes(dep.name, point.concurrency, scrapes)
            recorder.record_point(record)
            written += 1
            counts[record.status] += 1
            if record.status != "ok":
                failures.append(f"{dep.name} c{point.concurrency}: {record.reason}")
            m = record.metrics
            progress(f"simulate: {dep.name} c{point.concurrency}: {record.status}, {run.duration_s:.1f} s simulated, "
                     f"{_fmt(m.interactivity_tok_s_user if m else None)} tok/s/user, "
                     f"{_fmt(m.total_tok_s_per_gpu if m else None)} tok/s/GPU, "
                     f"occupancy {_fmt(m.occupancy_mean_running if m else None)}")
            now = run.end_s + 5.0  # EvalScope's default --sleep-interval between runs
        simulated_s += now
    status = recorder.finish(ended_at=iso_from_unix(base_unix + simulated_s))
    return SimulateOutcome(run_dir=recorder.paths.root, points=written, wall_s=time.monotonic() - wall_start,
                           simulated_s=simulated_s, status=status, failures=failures, **counts)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def simulate_point(plan: Plan, dep: DeploymentPlan, point: PointPlan, engine: Engine,
                   shapes: list[ConversationShape], base_unix: float, start_s: float
                   ) -> tuple[PointRecord, list[str], PointRun]:
    """One point in virtual time on `engine`, from `start_s`: its record, its scrapes (JSON lines) and the
    run. The conversations are `shapes` rotated by the point's offset, as EvalScope rotates its list."""
    sweep = plan.config
    text = MetricsText(engine, dep.served_model_name)
    records: list[ScrapeRecord] = []
    scrapes = 0

    def scrape(at_s: float) -> None:
        nonlocal scrapes
        samples = text.samples(sweep.scrape.keep_prefixes)
        for s in samples:
            records.append(ScrapeRecord(t=base_unix + at_s, scrape=scrapes, name=s.name, labels=s.labels,
                                        value=s.value))
        scrapes += bool(samples)  # numbered as the scrapes that kept something, as a reader counts them

    offset = point.dataset_offset if point.dataset_offset < len(shapes) else 0
    rotated = shapes[offset:] + shapes[:offset]
    run = run_point(engine, rotated, concurrency=point.concurrency, conversations=point.conversations,
                    max_tokens=sweep.client.max_tokens, start_s=start_s,
                    scrape_interval_s=sweep.scrape.interval_s, on_scrape=scrape)
    summary = evalscope_like_summary(run)
    metrics = derive_point_metrics(records, summary, sweep.gpus_per_server, rows=request_rows(run), slo=sweep.slo)
    status, reason, failure = _simulated_status(summary, sweep.max_failed_requests)
    record = PointRecord(
        deployment=dep.name, concurrency=point.concurrency, conversations=point.conversations,
        dataset_offset=point.dataset_offset, status=status, reason=reason, failure=failure,
        started_at=iso_from_unix(base_unix + run.start_s), ended_at=iso_from_unix(base_unix + run.end_s),
        started_unix_s=base_unix + run.start_s, ended_unix_s=base_unix + run.end_s, wall_s=run.duration_s,
        simulated=True, gpus_per_server=sweep.gpus_per_server, summary=summary, metrics=metrics)
    return record, [json.dumps(r.to_json()) + "\n" for r in records], run
