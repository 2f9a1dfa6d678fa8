"""results/<run>/report.md: provenance, warnings, the points table and the figures of one run."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from harness.config.sweep import SloSettings
from harness.io import atomic_write_text
from harness.metrics.derive import LATENCIES, PERCENTILE_METHOD, PERCENTILES, percentile_name, slo_checks
from harness.records import PointRecord, RunManifest
from harness.report import evidence_section
from harness.report.capacity import capacity_section
from harness.report.correctness import correctness_section
from harness.report.plots import BATCH, GAUGE, OCCUPANCY_MARGIN_REQ, occupancy_reading
from harness.results import RunPaths, iter_points, read_manifest

TPOT_TOLERANCE = 0.10
FIGURE_ORDER = ("pareto", "validation", "occupancy", "acceptance")
FIGURE_TITLES = {"pareto": "Interactivity vs throughput (Pareto)", "occupancy": "Occupancy",
                 "acceptance": "MTP acceptance length",
                 "validation": "Predicted vs measured (calibrated simulator, harness calibrate --validate)"}


@dataclass(frozen=True)
class ReportWarning:
    kind: str
    text: str


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _count(value: float | int | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def reused_points(manifest: RunManifest, points: list[PointRecord]) -> list[int]:
    """Concurrencies that re-send conversations an earlier point already sent (EvalScope rotates the
    list by --dataset-offset, docs/facts.md §6; harness/report/evidence_section.py counts them)."""
    return list(evidence_section.reused_points(manifest, points))


def collect_warnings(manifest: RunManifest, points: list[PointRecord]) -> list[ReportWarning]:
    """Everything a reader must know before trusting the numbers of this run."""
    warnings: list[ReportWarning] = []
    recorded = {(p.deployment, p.point_id) for p in points}
    for p in points:
        if p.status == "failed":
            warnings.append(ReportWarning("failed point", f"`{p.deployment}` c{p.concurrency} failed: {p.reason or 'no reason'}"))
        elif p.status == "degraded":
            warnings.append(ReportWarning("degraded point", f"`{p.deployment}` c{p.concurrency}: {p.reason}"))
        warnings += [ReportWarning("doubtful point", f"`{p.deployment}` c{p.concurrency}: {w}") for w in p.warnings]
    for dep, statuses in manifest.points.items():
        for point_id, status in statuses.items():
            if (dep, point_id) not in recorded:
                warnings.append(ReportWarning("missing point", f"`{dep}` {point_id} has no point.json "
                                        f"(manifest says {status})"))
    built, needed = manifest.workload.conversations_built, manifest.workload.conversations_needed
    if built is not None and needed is not None and built < needed:
        reused = evidence_section.reused_points(manifest, points)
        who = (", ".join(f"c{c} re-sends {n}" for c, n in reused.items()) if reused
               else "no point re-sends")
        mode = " (reuse: shared, on request)" if manifest.workload.conversation_reuse == "shared" else ""
        warnings.append(ReportWarning("conversation reuse", (
            f"the dataset has {built} conversations but the sweep needs {needed}{mode}: {who} "
            "conversations an earlier point already sent, which the prefix cache has warmed; their "
            "TTFT and throughput look better than fresh traffic would")))
    warnings += [ReportWarning(kind, text) for kind, text in
                 evidence_section.client_warnings(manifest) + evidence_section.evidence_warnings(manifest)]
    for p in points:
        m = p.metrics
        if m is not None and m.tpot_disagrees:
            why = (f"the client got the stream late and in bursts, so its interactivity is overstated "
                   f"(the engine's own: {_num(m.server_interactivity_tok_s_user)} tok/s/user; docs/tpot.md)"
                   if m.tpot_client_low else
                   "delivery added time the engine did not spend: what users saw, not the engine's speed")
            if p.requests is not None and p.requests.burst_replies:
                why += (f"; {p.requests.burst_replies} of {p.requests.succeeded} replies arrived in one burst "
                        "(decode span under 5 ms)")
            warnings.append(ReportWarning("TPOT disagreement", (
                f"`{p.deployment}` c{p.concurrency}: client TPOT {_num(m.mean_tpot_ms, 2)} ms vs server "
                f"{_num(m.server_tpot_ms, 2)} ms ({(m.tpot_rel_diff or 0.0):+.0%}, more than "
                f"{TPOT_TOLERANCE:.0%}): {why}")))
    warnings += _occupancy_warnings(points)
    for p in points:
        resets = p.metrics.counter_resets if p.metrics is not None else 0
        if p.server_restarted or resets:
            what = ("its retry ran on a server restarted for it (cold prefix cache)" if p.retry == "restart"
                    else "the server restarted during the point")
            warnings.append(ReportWarning("server restarted", (
                f"`{p.deployment}` c{p.concurrency}: {what}"
                + (f" ({resets} counter reset{'s' if resets > 1 else ''} seen)" if resets else ""))))
    flagged = {p.deployment for p in points if p.server_restarted}
    for dep, entry in manifest.deployments.items():
        restarts = entry.restarts
        if restarts and dep not in flagged:
            warnings.append(ReportWarning("server restarted",
                                    f"`{dep}`: the server was restarted {restarts} time(s) during the run"))
    for p in points:
        s = p.summary
        if p.status == "ok" and s is not None and s.failed_requests:
            warnings.append(ReportWarning("failed requests",
                                    f"`{p.deployment}` c{p.concurrency}: {s.failed_requests} of {s.total_requests} "
                                    "requests failed"))
        if p.metrics is not None and p.metrics.scrapes_failed:
            warnings.append(ReportWarning("failed scrapes", (
                f"`{p.deployment}` c{p.concurrency}: {p.metrics.scrapes_failed} /metrics scrape(s) failed "
                f"({p.metrics.scrapes_ok} succeeded)")))
    return warnings


def _occupancy_warnings(points: list[PointRecord]) -> list[ReportWarning]:
    """Points whose two occupancy measures contradict each other, or where only the counters saw the load
    (docs/metrics.md, "Occupancy two ways"); the occupancy figure shows both at each of them."""
    out: list[ReportWarning] = []
    for p in points:
        m = p.metrics
        if m is None or p.status == "failed":
            continue
        reading = occupancy_reading(m.occupancy_mean_running, m.decode_batch_mean)
        scrapes = (f"{m.scrapes_ok} scrapes over {_num(m.window_s)} s" if m.window_s is not None
                   else f"{m.scrapes_ok} scrapes")
        if reading.disagree:
            assert reading.gauge is not None and reading.batch is not None
            out.append(ReportWarning("occupancy measures differ", (
                f"`{p.deployment}` c{p.concurrency}: running gauge mean {reading.gauge:.2f} ({scrapes}, largest "
                f"sample {_count(m.max_running)}) vs decode batch {reading.batch:.2f} from the engine counters: "
                f"{abs(reading.gauge - reading.batch):.2f} requests apart, more than {OCCUPANCY_MARGIN_REQ:g}; the "
                "figure shows both. The gauge averages over time, the decode batch over engine steps; a short "
                "point or a server that answers /metrics late moves only the gauge.")))
        elif reading.source == BATCH:
            assert reading.batch is not None
            out.append(ReportWarning("occupancy from counters", (
                f"`{p.deployment}` c{p.concurrency}: no scrape saw a request running ({scrapes}), so the running "
                f"gauge gives no occupancy; the figure and the table show the decode batch {reading.batch:.2f} "
                "from the engine counters instead.")))
    return out


def _occupancy_cell(gauge: float | None, batch: float | None) -> str:
    """"gauge / decode batch"; "(differ)" where they contradict, "(batch)" where only the counters saw the load."""
    reading = occupancy_reading(gauge, batch)
    cell = f"{_num(reading.gauge)} / {_num(reading.batch, 2)}"
    if reading.disagree:
        return f"**{cell}** (differ)"
    return cell + (" (batch)" if reading.source == BATCH else "")


def _points_table(points: list[PointRecord]) -> list[str]:
    lines = ["| deployment | c | conv. | offset | status | interactivity (tok/s/user) | total (tok/s/GPU) "
             "| output (tok/s/GPU) | TTFT (ms) | TPOT client / server (ms) | occupancy gauge / decode batch (req) "
             "| accept len | preemptions | KV max | requests ok / sent |",
             "|---|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for p in points:
        m, s = p.metrics, p.summary
        ttft = m.mean_ttft_ms if m and m.mean_ttft_ms is not None else (s.mean_ttft_ms if s else None)
        tpot = m.mean_tpot_ms if m and m.mean_tpot_ms is not None else (s.mean_tpot_ms if s else None)
        kv_max = f"{m.kv_usage_max:.0%}" if m and m.kv_usage_max is not None else "-"
        requests = f"{_count(s.success_requests)} / {_count(s.total_requests)}" if s else "-"
        status = p.status if p.status == "ok" else f"**{p.status}**"
        lines.append(
            f"| {p.deployment} | {p.concurrency} | {p.conversations} | {p.dataset_offset} | {status} "
            f"| {_num(m.interactivity_tok_s_user if m else None)} | {_count(m.total_tok_s_per_gpu if m else None)} "
            f"| {_num(m.output_tok_s_per_gpu if m else None)} | {_count(ttft)} "
            f"| {_num(tpot, 2)} / {_num(m.server_tpot_ms if m else None, 2)} "
            f"| {_occupancy_cell(m.occupancy_mean_running, m.decode_batch_mean) if m else '-'} "
            f"| {_num(m.mtp_acceptance_length if m else None, 2)} "
            f"| {_count(m.preemptions if m else None)} | {kv_max} | {requests} |")
    return lines


_LATENCY_TITLES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "latency"}


def _latency_table(points: list[PointRecord]) -> list[str]:
    """p50 / p90 / p99 of TTFT, TPOT, ITL and end-to-end latency per point (docs/metrics.md)."""
    names = [percentile_name(base, q, unit) for base, unit in LATENCIES for q in PERCENTILES]
    measured = [p for p in points if p.metrics is not None and any(getattr(p.metrics, n) is not None for n in names)]
    if not measured:
        return ["No per-request latencies recorded (EvalScope wrote no per-request rows, or the run predates them)."]
    qs = " / ".join(f"p{q}" for q in PERCENTILES)
    lines = ["| deployment | c | " + " | ".join(f"{_LATENCY_TITLES[base]} {qs} ({unit})" for base, unit in LATENCIES)
             + " |", "|---|--:|" + "--:|" * len(LATENCIES)]
    for p in measured:
        cells = [" / ".join(_num(getattr(p.metrics, percentile_name(base, q, unit)), 3 if unit == "s" else 1)
                            for q in PERCENTILES) for base, unit in LATENCIES]
        lines.append(f"| {p.deployment} | {p.concurrency} | " + " | ".join(cells) + " |")
    return lines + ["", f"Over the requests that succeeded; percentiles by numpy's {PERCENTILE_METHOD} interpolation "
                    "(EvalScope's own benchmark_percentile.json takes the nearest rank). TPOT per request = "
                    "(latency - TTFT) / (output tokens - 1); ITL: every gap between streamed chunks, pooled."]


def _run_slo(manifest: RunManifest) -> SloSettings | None:
    """The SLO the run's sweep declared (manifest.json's resolved sweep), or None."""
    raw = manifest.resolved.sweep.get("slo")
    if not isinstance(raw, dict):
        return None
    try:
        return SloSettings.model_validate(raw)
    except ValueError:
        return None


def _slo_section(manifest: RunManifest, points: list[PointRecord]) -> list[str]:
    """The sweep's SLO, and per point: met or missed (which limit, with the value), and its goodput."""
    slo = _run_slo(manifest)
    if slo is None:
        return []
    limits = "; ".join(f"{c.what} {'>=' if c.at_least else '<='} {c.bound:g} {c.unit} (`{c.limit}`)"
                       for c in slo_checks(slo, {}))
    lines = ["", "## SLO", "", f"Limits: {limits}. A point meets the SLO when its p90s and its mean interactivity are "
             "within every limit; goodput counts the succeeded requests that met every limit on their own (their "
             "TTFT, TPOT, 1000 / TPOT and latency) over the EvalScope duration.", "",
             "| deployment | c | SLO | goodput (req/s) | goodput (tok/s/GPU) | requests within | missed |",
             "|---|--:|---|--:|--:|--:|---|"]
    for p in points:
        m = p.metrics
        if m is None:
            lines.append(f"| {p.deployment} | {p.concurrency} | unknown | - | - | - | - |")
            continue
        checks = slo_checks(slo, m.model_dump())
        verdict = {True: "met", False: "**missed**", None: "unknown"}[m.slo_met]
        missed = "; ".join(c.text() for c in checks if c.met is False) or \
            "; ".join(c.text() for c in checks if c.met is None) or "-"
        duration = p.summary.time_taken_s if p.summary is not None else None
        within = "-"
        if m.goodput_req_s is not None and duration:
            within = f"{round(m.goodput_req_s * duration):,} of {_count(p.summary.success_requests)}"
        lines.append(f"| {p.deployment} | {p.concurrency} | {verdict} | {_num(m.goodput_req_s, 2)} "
                     f"| {_count(m.goodput_tok_s_per_gpu)} | {within} | {_cell(missed)} |")
    return lines


def _flatten(prefix: str, value: object) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        out: list[tuple[str, str]] = []
        for key, inner in value.items():
            out += _flatten(f"{prefix}.{key}" if prefix else str(key), inner)
        return out
    text = value if isinstance(value, str) else json.dumps(value)
    return [(prefix, text)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _provenance(manifest: RunManifest) -> list[str]:
    rows = [("run id", manifest.run_id), ("sweep", f"{manifest.sweep_name} ({manifest.sweep_path})"),
            ("status", manifest.status), ("started", manifest.started_at or "-"),
            ("ended", manifest.ended_at or "-"),
            ("hardware", f"{manifest.gpu_model or 'unknown GPU'} x {manifest.gpus_per_server} per server"),
            ("simulated", "yes" if manifest.simulated else "no")]
    rows += _flatten("", manifest.provenance.model_dump(mode="json", exclude_none=True))
    rows += [(f"workload.{k}", v) for k, v in _flatten("", manifest.workload.model_dump(mode="json",
                                                                                        exclude_none=True))]
    lines = ["| item | value |", "|---|---|"]
    lines += [f"| {k} | {_cell(str(v))} |" for k, v in rows]
    return lines


def _kernels(manifest: RunManifest) -> list[str]:
    """Which HiSparse kernels each vLLM server ran: an A/B of kernels reads here which arm was which."""
    parts = []
    for dep, entry in manifest.deployments.items():
        build = entry.build
        if build is None:
            continue
        kernel = build.kernel
        if kernel is None or kernel.source_sha256 is None:
            parts.append(f"`{dep}` vLLM's own" if build.kernels == "vllm"
                         else f"`{dep}` bundled (identity not recorded)")
            continue
        arch = f" sm {kernel.cuda_arch}" if kernel.cuda_arch else ""
        parts.append(f"`{dep}` bundled hisparse_kernels {kernel.version} "
                     f"(sha256 `{kernel.source_sha256[:12]}`, {kernel.built_for}{arch})")
    return ["", "HiSparse kernels: " + "; ".join(parts) + "."] if parts else []


def _deployments(run_dir: Path, manifest: RunManifest) -> list[str]:
    lines: list[str] = []
    for dep, entry in manifest.deployments.items():
        lines.append(f"### {dep}")
        # the probe's answers have their own section
        for key, value in entry.model_dump(mode="json", exclude_none=True, exclude={"correctness"}).items():
            if value in ({}, []):
                continue
            lines.append(f"- {key}: {value if isinstance(value, str) else json.dumps(value)}")
        command_txt = RunPaths(run_dir).command_txt(dep)
        if command_txt.is_file():
            lines += ["", "```", command_txt.read_text(errors="replace").strip(), "```"]
        lines.append("")
    return lines


def _figures(run_dir: Path, plots_dir: Path) -> list[str]:
    if not plots_dir.is_dir():
        return ["No figures: run `harness plot` on this run."]
    pngs = {p.stem: p for p in plots_dir.glob("*.png")}
    ordered = [s for s in FIGURE_ORDER if s in pngs] + sorted(s for s in pngs if s.startswith("timeseries-"))
    lines: list[str] = []
    for stem in ordered:
        rel = Path(os.path.relpath(pngs[stem].resolve(), run_dir.resolve())).as_posix()
        title = FIGURE_TITLES.get(stem, stem.replace("timeseries-", "Time series: "))
        lines += [f"### {title}", "", f"![{title}]({rel})", ""]
    return lines or ["No figures found in " + str(plots_dir)]


def render_report(run_dir: Path, plots_dir: Path) -> str:
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    points = iter_points(run_dir)
    warnings = collect_warnings(manifest, points)
    out = [f"# Run {manifest.run_id}: {manifest.sweep_name}", ""]
    if manifest.simulated or any(p.simulated for p in points):
        out += ["> **SIMULATED**: these numbers come from the harness's simulated engine, not from GPU "
                "servers. They check the harness, not vLLM.", ""]
    out += [f"{manifest.gpu_model or 'unknown GPU'} x {manifest.gpus_per_server} per server; "
            f"{len(points)} points over {len(manifest.deployments) or len({p.deployment for p in points})} "
            f"deployment(s); status {manifest.status}."] + _kernels(manifest) + ["", "## Warnings", ""]
    out += [f"- **{w.kind}**: {w.text}" for w in warnings] or ["None."]
    out += ["", evidence_section.client_line(manifest) + " " + evidence_section.reuse_line(manifest)]
    out += ["", "## Points", ""] + _points_table(points)
    out += ["", "Interactivity = 1000 / mean TPOT; per-GPU throughput = EvalScope throughput / "
            f"{manifest.gpus_per_server} GPUs per server; occupancy: the {GAUGE}, mean of the non-zero "
            "`vllm:num_requests_running` samples, and the decode batch, requests per engine step from the counters "
            "(Δ`vllm:generation_tokens_total` / Δ`vllm:iteration_tokens_total_count` / MTP acceptance length). "
            f"The occupancy figure plots the {GAUGE} (filled) and the decode batch (hollow) where the {GAUGE} is "
            f"empty or more than {OCCUPANCY_MARGIN_REQ:g} requests away from it; those points are listed under "
            "Warnings (docs/metrics.md, \"Occupancy two ways\").", "", "## Latency", ""]
    out += _latency_table(points) + _slo_section(manifest, points) + [""] + capacity_section(run_dir)
    out += ["", "## Figures", ""]
    out += _figures(run_dir, Path(plots_dir))
    out += ["", "## HiSparse evidence", ""] + evidence_section.evidence_section(manifest, points)
    out += ["", "## Correctness", ""] + correctness_section(manifest)
    out += ["", "## Provenance", ""] + _provenance(manifest) + ["", "## Deployments", ""] + _deployments(run_dir, manifest)
    return "\n".join(out).rstrip() + "\n"


def write_report(run_dir: Path, plots_dir: Path) -> Path:
    """Write results/<run>/report.md atomically; figures are linked relative to it."""
    path = RunPaths(Path(run_dir)).report_md
    atomic_write_text(path, render_report(Path(run_dir), Path(plots_dir)))
    return path
