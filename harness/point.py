"""One point: scraper on, one load-generator run, scraper off, summary read, metrics derived.

Returns the point's record whatever happened: a failure is data (reason, log tail), never an
exception, so the runner decides what comes next. The runner hands the record to the run
recorder, which redacts and writes it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from harness.dataset import BuiltDataset
from harness.errors import HarnessError
from harness.io import display_path, utc_now_iso
from harness.loadgen import LoadGenerator, LoadRun, fill_client_argv, summary_dir
from harness.metrics.derive import derive_point_metrics
from harness.metrics.evalscope_requests import DB_NAME, RequestRow, read_request_rows, summarise_requests
from harness.metrics.scrape import Scraper, read_scrapes
from harness.plan import DeploymentPlan, Plan, PointPlan
from harness.records import EvalScopeSummary, FailureKind, PointRecord, point_status
from harness.results import RunPaths
from harness.servers.base import ServerHandle, read_log_tail
from harness.telemetry import GPU_JSONL

Progress = Callable[[str], None]


def failed_record(plan: Plan, point: PointPlan, reason: str, tail: list[str], failure: FailureKind) -> PointRecord:
    now = utc_now_iso()
    return PointRecord(deployment=point.deployment, concurrency=point.concurrency, conversations=point.conversations,
                       dataset_offset=point.dataset_offset, status="failed", reason=reason, failure=failure,
                       server_log_tail=tail[-50:], simulated=plan.simulated,
                       gpus_per_server=plan.config.gpus_per_server, started_at=now, ended_at=now)


def does_not_fit_record(plan: Plan, point: PointPlan, reason: str, tail: list[str]) -> PointRecord:
    """A point whose server refused its max_model_len: status does_not_fit, vLLM's reason kept."""
    return failed_record(plan, point, reason, tail, "does_not_fit").model_copy(update={"status": "does_not_fit"})


def _next_attempt(paths: RunPaths, point: PointPlan) -> int:
    root = paths.point_dir(point.deployment, point.concurrency) / "evalscope"
    taken = [int(p.name.split("-", 1)[1]) for p in root.glob("attempt-*") if p.name.split("-", 1)[1].isdigit()]
    return max(taken, default=0) + 1


def run_point(plan: Plan, dep: DeploymentPlan, point: PointPlan, handle: ServerHandle, dataset: BuiltDataset,
              paths: RunPaths, load_generator: LoadGenerator, progress: Progress,
              stop: threading.Event | None = None) -> PointRecord:
    sweep = plan.config
    attempt = _next_attempt(paths, point)
    outputs_dir = paths.evalscope_dir(dep.name, point.concurrency, attempt)
    argv = fill_client_argv(point.client_argv, base_url=handle.base_url, dataset_path=dataset.path,
                            outputs_dir=outputs_dir)
    scrapes_path = paths.scrapes_jsonl(dep.name, point.concurrency)
    if scrapes_path.exists():  # a failed earlier attempt: keep its scrapes beside, not mixed in
        scrapes_path.rename(scrapes_path.with_name(f"scrapes.attempt-{attempt - 1}.jsonl"))
    gpu_path = paths.point_dir(dep.name, point.concurrency) / GPU_JSONL
    if gpu_path.exists():
        gpu_path.rename(gpu_path.with_name(f"gpu.attempt-{attempt - 1}.jsonl"))
    progress(f"{dep.name}: c{point.concurrency} ({point.conversations} conversations, offset {point.dataset_offset}), "
             f"attempt {attempt}")
    started_iso, started_unix = utc_now_iso(), time.time()
    t0 = time.monotonic()
    scraper = Scraper(handle.base_url + "/metrics", scrapes_path, interval_s=sweep.scrape.interval_s,
                      keep_prefixes=sweep.scrape.keep_prefixes, timeout_s=sweep.scrape.timeout_s,
                      api_key=handle.api_key)

    def should_stop() -> bool:
        return (stop is not None and stop.is_set()) or not handle.alive()

    handle.start_gpu_telemetry(gpu_path, sweep.scrape.interval_s)  # NVML where the server runs, if any
    try:
        with scraper:
            run = load_generator.run(argv, outputs_dir / "evalscope.log", timeout_s=sweep.client.timeout_s,
                                     should_stop=should_stop)
    finally:
        gpu = handle.stop_gpu_telemetry()
    ended_unix = time.time()
    load_generator.scrub(outputs_dir)
    record = PointRecord(
        deployment=dep.name, concurrency=point.concurrency, conversations=point.conversations, dataset_offset=point.dataset_offset,
        status="ok", attempt=attempt, started_at=started_iso, ended_at=utc_now_iso(),
        started_unix_s=started_unix, ended_unix_s=ended_unix, evalscope_wall_s=round(run.wall_s, 3),
        evalscope_command=argv, evalscope_output_dir=display_path(outputs_dir), simulated=plan.simulated,
        gpus_per_server=sweep.gpus_per_server)
    run_summary = summary_dir(outputs_dir, point.evalscope_name, point.concurrency, point.conversations)
    summary, reason, failure = _summary_or_reason(run, run_summary, handle, load_generator, stop)
    record.summary = summary
    record.gpu = gpu
    rows: list[RequestRow] | None = None
    try:  # the per-request rows explain the client's numbers and give its percentiles; unreadable, only those go
        found = read_request_rows(run_summary / DB_NAME)
    except HarnessError as exc:
        record.warnings.append(f"per-request output unreadable: {exc}")
    else:
        if found is not None:
            rows = found[0]
            record.requests = summarise_requests(*found)
    if reason is not None:
        record.status, record.reason, record.failure = "failed", reason, failure
        record.server_log_tail = handle.log_tail(50)
        progress(f"{dep.name}: c{point.concurrency} failed: {reason}")
    records = read_scrapes(scrapes_path)
    record.metrics = derive_point_metrics(records, summary, sweep.gpus_per_server,
                                          window=(started_unix, ended_unix), rows=rows, slo=sweep.slo)
    record.warnings += _point_warnings(record)
    failed = (summary.failed_requests or 0) if summary is not None else 0
    if record.status == "ok" and point_status(failed, sweep.max_failed_requests) == "degraded":
        record.status, record.failure = "degraded", "requests"
        record.reason = f"{failed} of {summary.total_requests or '?'} requests failed"
        progress(f"{dep.name}: c{point.concurrency} degraded: {record.reason}")
    record.wall_s = round(time.monotonic() - t0, 3)
    if record.status == "ok":
        m = record.metrics
        progress(f"{dep.name}: c{point.concurrency} ok in {record.wall_s:.1f}s: "
                 f"{_fmt(m.interactivity_tok_s_user)} tok/s/user, {_fmt(m.total_tok_s_per_gpu)} tok/s/GPU, "
                 f"occupancy {_fmt(m.occupancy_mean_running)}")
    return record


def _point_warnings(record: PointRecord) -> list[str]:
    """Why a point's numbers are in doubt even though it ran (shown in summary.csv and the report)."""
    warnings = []
    m = record.metrics
    if m is not None and m.scrapes_ok == 0:
        warnings.append(f"every /metrics scrape failed ({m.scrapes_failed}): no server-side metrics")
    return warnings


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _summary_or_reason(run: LoadRun, run_summary: Path, handle: ServerHandle, load_generator: LoadGenerator,
                       stop: threading.Event | None
                       ) -> tuple[EvalScopeSummary | None, str | None, FailureKind | None]:
    """The summary, and why the point failed with the kind of failure (None, None when it did not)."""
    try:
        summary = load_generator.read_summary(run_summary)
    except HarnessError as exc:
        return None, f"unreadable EvalScope summary: {exc}", "client"
    if stop is not None and stop.is_set():
        return summary, "interrupted: the sweep is stopping", "interrupted"
    if run.interrupted or not handle.alive():
        return summary, "server died during the point", "server"
    if run.timed_out:
        return summary, f"EvalScope ran past the point timeout ({run.wall_s:.0f}s)", "client"
    if run.returncode != 0:
        tail = " | ".join(read_log_tail(run.stdout_path, 3))
        return summary, f"EvalScope exited with code {run.returncode}: {tail[-300:]}", "client"
    if summary is None:
        return None, f"EvalScope wrote no summary at {display_path(run_summary / 'benchmark_summary.json')}", "client"
    if not summary.success_requests:
        return summary, f"no request succeeded ({summary.failed_requests or 0} failed)", "server"
    return summary, None, None
