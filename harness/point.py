"""One point: scraper on, one EvalScope run, scraper off, summary parsed, metrics derived.

Returns the point's record whatever happened: a failure is data (reason, log tail),
never an exception, so the runner decides what comes next.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from harness import provenance
from harness.config import display_path
from harness.dataset import BuiltDataset
from harness.errors import HarnessError
from harness.launch.base import ServerHandle, read_log_tail
from harness.loadgen import LoadPoint, LoadRun, evalscope_argv, evalscope_program, run_evalscope, summary_dir
from harness.metrics.derive import derive_point_metrics
from harness.metrics.evalscope_summary import parse_summary
from harness.metrics.scrape import Scraper, read_scrapes
from harness.plan import DeploymentPlan, Plan, PointPlan, load_point
from harness.records import EvalScopeSummary, PointRecord
from harness.redact import redact_argv
from harness.results import RunPaths

Progress = Callable[[str], None]


def failed_record(plan: Plan, point: PointPlan, reason: str, tail: list[str]) -> PointRecord:
    return PointRecord(deployment=point.deployment, parallel=point.parallel, number=point.number,
                       dataset_offset=point.dataset_offset, status="failed", reason=reason,
                       server_log_tail=tail[-50:], simulated=plan.simulated,
                       gpus_per_server=plan.sweep.sweep.gpus_per_server,
                       started_at=provenance.utc_now_iso(), ended_at=provenance.utc_now_iso())


def _next_attempt(paths: RunPaths, point: PointPlan) -> int:
    root = paths.point_dir(point.deployment, point.parallel) / "evalscope"
    taken = [int(p.name.split("-", 1)[1]) for p in root.glob("attempt-*") if p.name.split("-", 1)[1].isdigit()]
    return max(taken, default=0) + 1


def run_point(plan: Plan, dep: DeploymentPlan, point: PointPlan, handle: ServerHandle, dataset: BuiltDataset,
               paths: RunPaths, progress: Progress) -> PointRecord:
    sweep = plan.sweep.sweep
    attempt = _next_attempt(paths, point)
    outputs_dir = paths.evalscope_dir(dep.name, point.parallel, attempt)
    load = load_point(plan, dep, point, base_url=handle.base_url, dataset_path=dataset.path,
                      outputs_dir=outputs_dir)
    argv = evalscope_argv(load, sweep.client, program=evalscope_program())
    scrapes_path = paths.scrapes_jsonl(dep.name, point.parallel)
    if scrapes_path.exists():  # a failed earlier attempt: keep its scrapes beside, not mixed in
        scrapes_path.rename(scrapes_path.with_name(f"scrapes.attempt-{attempt - 1}.jsonl"))
    progress(f"{dep.name}: c{point.parallel} ({point.number} conversations, offset {point.dataset_offset}), "
             f"attempt {attempt}")
    started_iso, started_unix = provenance.utc_now_iso(), time.time()
    t0 = time.monotonic()
    scraper = Scraper(handle.base_url + "/metrics", scrapes_path, interval_s=sweep.scrape.interval_s,
                      keep_prefixes=sweep.scrape.keep_prefixes, timeout_s=sweep.scrape.timeout_s)
    with scraper:
        run = run_evalscope(argv, outputs_dir / "evalscope.log", timeout_s=sweep.client.timeout_s,
                            should_stop=lambda: not handle.alive())
    ended_unix = time.time()
    record = PointRecord(
        deployment=dep.name, parallel=point.parallel, number=point.number, dataset_offset=point.dataset_offset,
        status="ok", attempt=attempt, started_at=started_iso, ended_at=provenance.utc_now_iso(),
        started_unix_s=started_unix, ended_unix_s=ended_unix, evalscope_wall_s=round(run.wall_s, 3),
        evalscope_command=redact_argv(argv), evalscope_output_dir=display_path(outputs_dir), simulated=plan.simulated,
        gpus_per_server=sweep.gpus_per_server)
    summary, reason = _summary_or_reason(run, load, handle)
    record.summary = summary
    if reason is not None:
        record.status, record.reason = "failed", reason
        record.server_log_tail = handle.log_tail(50)
        progress(f"{dep.name}: c{point.parallel} failed: {reason}")
    records = read_scrapes(scrapes_path)
    record.metrics = derive_point_metrics(records, summary, sweep.gpus_per_server,
                                          window=(started_unix, ended_unix))
    record.wall_s = round(time.monotonic() - t0, 3)
    if record.status == "ok":
        m = record.metrics
        progress(f"{dep.name}: c{point.parallel} ok in {record.wall_s:.1f}s: "
                 f"{_fmt(m.interactivity_tok_s_user)} tok/s/user, {_fmt(m.total_tok_s_per_gpu)} tok/s/GPU, "
                 f"occupancy {_fmt(m.occupancy_mean_running)}")
    return record


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _summary_or_reason(run: LoadRun, load: LoadPoint, handle: ServerHandle) -> tuple[EvalScopeSummary | None, str | None]:
    summary = None
    path = summary_dir(load) / "benchmark_summary.json"
    if path.exists():
        try:
            summary = parse_summary(path)
        except HarnessError as exc:
            return None, f"unreadable EvalScope summary: {exc}"
    if run.interrupted or not handle.alive():
        return summary, "server died during the point"
    if run.timed_out:
        return summary, f"EvalScope ran past the point timeout ({run.wall_s:.0f}s)"
    if run.returncode != 0:
        tail = " | ".join(read_log_tail(run.stdout_path, 3))
        return summary, f"EvalScope exited with code {run.returncode}: {tail[-300:]}"
    if summary is None:
        return None, f"EvalScope wrote no summary at {display_path(path)}"
    if not summary.success_requests:
        return summary, f"no request succeeded ({summary.failed_requests or 0} failed)"
    return summary, None
