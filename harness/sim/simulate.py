"""`simulate SWEEP.yaml`: every deployment of a sweep on the simulated engine in virtual time, written
as a run folder in the sweep runner's layout (harness/results.py), marked simulated, so plot, report and
compare read it unchanged. No EvalScope runs: the summary is computed as EvalScope computes it
(FACTS.md §6), and the scrapes come from the engine's own /metrics text at virtual times."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from harness.config import LoadedSweep, display_path, sha256_file
from harness.errors import HarnessError
from harness.metrics.derive import derive_point_metrics
from harness.metrics.prom import parse_exposition
from harness.metrics.scrape import ScrapeRecord
from harness.records import EvalScopeSummary, PointRecord
from harness.results import Manifest, RunPaths, atomic_write_text, read_manifest, write_manifest, write_point
from harness.sim.build import engine_config
from harness.sim.engine import Engine
from harness.sim.exposition import MetricsText
from harness.sim.virtual import PointRun, run_point, shapes_from_recipe


@dataclass(frozen=True)
class SimulateOptions:
    run_id: str | None = None
    results_root: Path = Path("results")
    start_unix_s: float | None = None  # virtual time 0 as a Unix time; default: now


@dataclass
class SimulateOutcome:
    run_dir: Path
    points: int
    wall_s: float
    simulated_s: float


def _iso(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def evalscope_like_summary(run: PointRun) -> EvalScopeSummary:
    """The summary EvalScope would write for these requests (its definitions, FACTS.md §6)."""
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


def _open_run(paths: RunPaths, loaded: LoadedSweep, started_iso: str) -> Manifest:
    if paths.manifest.exists():
        old = read_manifest(paths.root)
        if not old.simulated or old.sweep_name != loaded.sweep.name:
            raise HarnessError(f"{display_path(paths.root)} holds another run ({old.sweep_name}, "
                               f"{'simulated' if old.simulated else 'measured'}); choose another --run-id")
    recipe = loaded.recipe.recipe
    sweep = loaded.sweep
    return Manifest(
        run_id=paths.run_id, sweep_name=sweep.name, sweep_path=display_path(loaded.path), simulated=True,
        gpus_per_server=sweep.gpus_per_server,
        gpu_model=next((ld.profile.gpu for ld in loaded.launches.values() if ld.profile.gpu), None),
        workload={"recipe": recipe.name, "first_turn_length": recipe.first_turn_length,
                  "subsequent_turn_length": recipe.subsequent_turn_length, "num_turns": recipe.num_turns,
                  "max_tokens": sweep.client.max_tokens, "source": "recipe shape (virtual time, no text)"},
        provenance={"simulated": "virtual time (harness simulate); no GPU, no EvalScope",
                    "harness_commit": _harness_commit(),
                    "config_files": {display_path(p): sha256_file(p)
                                     for p in loaded.files}},
        resolved_config={"sweep": sweep.model_dump(mode="json"),
                         "launches": {n: ld.profile.model_dump(mode="json") for n, ld in loaded.launches.items()}},
        deployments={}, points={}, started_at=started_iso)


def simulate_sweep(loaded: LoadedSweep, options: SimulateOptions, progress=print) -> SimulateOutcome:
    from harness.plan import point_offsets

    wall_start = time.monotonic()
    sweep = loaded.sweep
    base_unix = options.start_unix_s if options.start_unix_s is not None else time.time()
    run_id = options.run_id or f"{sweep.name}-sim-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
    paths = RunPaths(Path(options.results_root) / run_id)
    manifest = _open_run(paths, loaded, _iso(base_unix))
    specs = sweep.client.point_list
    offsets = point_offsets(sweep.client.dataset_offset, [p.number for p in specs])
    recipe = loaded.recipe.recipe
    count = max(recipe.conversations, sweep.client.dataset_offset + sum(p.number for p in specs))
    shapes = shapes_from_recipe(recipe, count)
    max_tokens = sweep.client.max_tokens
    keep = sweep.scrape.keep_prefixes
    simulated_s = 0.0
    written = 0
    for dep in sweep.deployments:
        profile = loaded.launch_for(dep.name)
        engine = Engine(engine_config(profile))
        text = MetricsText(engine, profile.served_model_name)
        manifest.deployments[dep.name] = {"launch": display_path(loaded.launches[dep.name].path),
                                          "engine": "sim (virtual time)", "restarts": 0,
                                          "policy": engine.config.policy}
        now = 0.0
        for spec, offset in zip(specs, offsets, strict=True):
            records: list[ScrapeRecord] = []

            def scrape(at_s: float, records=records, text=text) -> None:
                index = len({r.scrape for r in records})
                for s in parse_exposition(text.render().decode(), keep):
                    records.append(ScrapeRecord(t=base_unix + at_s, scrape=index, name=s.name,
                                                labels=s.labels, value=s.value))

            rotated = shapes[offset % len(shapes):] + shapes[:offset % len(shapes)]
            run = run_point(engine, rotated, parallel=spec.parallel, number=spec.number, max_tokens=max_tokens,
                            start_s=now, scrape_interval_s=sweep.scrape.interval_s, on_scrape=scrape)
            summary = evalscope_like_summary(run)
            metrics = derive_point_metrics(records, summary, sweep.gpus_per_server)
            failed = summary.failed_requests or 0
            record = PointRecord(
                deployment=dep.name, parallel=spec.parallel, number=spec.number, dataset_offset=offset,
                status="ok" if not failed else "failed",
                reason=f"{failed} requests never fit the KV pool" if failed else None,
                started_at=_iso(base_unix + run.start_s), ended_at=_iso(base_unix + run.end_s),
                started_unix_s=base_unix + run.start_s, ended_unix_s=base_unix + run.end_s,
                wall_s=run.duration_s, simulated=True, gpus_per_server=sweep.gpus_per_server,
                summary=summary, metrics=metrics)
            scrapes_path = paths.scrapes_jsonl(dep.name, spec.parallel)
            atomic_write_text(scrapes_path, "".join(json.dumps(r.to_json()) + "\n" for r in records))
            write_point(paths.root, record)
            manifest.points.setdefault(dep.name, {})[record.point_id] = record.status
            write_manifest(paths.root, manifest)
            written += 1
            progress(f"simulate: {dep.name} c{spec.parallel}: {record.status}, {run.duration_s:.1f} s simulated, "
                     f"{_fmt(metrics.interactivity_tok_s_user)} tok/s/user, "
                     f"{_fmt(metrics.total_tok_s_per_gpu)} tok/s/GPU, occupancy {_fmt(metrics.occupancy_mean_running)}")
            now = run.end_s + 5.0  # EvalScope's default --sleep-interval between runs
        simulated_s += now
    manifest.ended_at = _iso(base_unix + simulated_s)
    manifest.status = "ok" if all(s == "ok" for d in manifest.points.values() for s in d.values()) else "failed"
    write_manifest(paths.root, manifest)
    from harness.summary import write_summary_csv

    write_summary_csv(paths.root)
    return SimulateOutcome(run_dir=paths.root, points=written, wall_s=time.monotonic() - wall_start,
                           simulated_s=simulated_s)


def _harness_commit() -> str | None:
    try:
        from harness.provenance import harness_commit
    except Exception:  # provenance is another module's concern: a simulated run does not depend on it
        return None
    return harness_commit()


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
