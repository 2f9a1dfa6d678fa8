"""One whole night, as `harness nightly` runs it: build, sweep, add the night to the history, gate it
against the nights before it, write the reports and the dashboard.

    build      the pinned EvalScope client (harness/builds/client.py) and every vLLM arm's server
               environment with its kernels (harness/builds/prepare.py), made and checked here before
               any server starts
    sweep      harness/runner.py (real servers, real EvalScope), or with `simulate` the simulated
               engine in virtual time (harness/simulate.py: seconds a night)
    history    the run folder as a night record, added to the store (with its report and figures)
    gate       against the median of recent comparable nights (the sweep file's `nightly:` section)
    reports    the step summary ($GITHUB_STEP_SUMMARY), the regression report (a file shaped as an
               issue), the dashboard

Exit code: 0 pass, 1 regression, 2 not comparable or an infrastructure failure. Infrastructure
failures (no GPU, a build that fails, a server that never starts, a sweep cut short) still record
what they can: the run folder, a night that says why (never part of a baseline), the reports.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.config import LoadedSweep
from harness.errors import HarnessError
from harness.io import atomic_write_text, display_path, sha256_file, utc_now_iso
from harness.nightly.changepoint import ChangePoint, history_change_points
from harness.nightly.dashboard import DashboardResult, build_dashboard
from harness.nightly.gate import GateResult, gate_night
from harness.nightly.gate_markdown import regression_report, step_summary
from harness.nightly.night import night_from_run
from harness.nightly.night_record import DeploymentFacts, GpuFacts, NightProvenance, NightRecord
from harness.nightly.overrides import Kernels, with_overrides
from harness.nightly.store import NightStore
from harness.provenance import gpu_info, harness_commit
from harness.records import INFRASTRUCTURE_KINDS
from harness.results import RunPaths, new_run_id
from harness.runner import LauncherKind
from harness.session import SessionOptions, run_session

Progress = Callable[[str], None]

REPORT_NAME = "nightly-report.md"


@dataclass(frozen=True)
class NightlyOptions:
    store: Path
    run_id: str | None = None
    results_root: Path = Path("results")
    simulate: bool = False  # the simulated engine in virtual time instead of servers and EvalScope
    launcher: LauncherKind = "ray"
    ray_gpus: int | None = None
    envs_dir: Path | None = None
    clients_dir: Path | None = None
    kernels: Kernels | None = None  # every vLLM arm's build.kernels
    vllm_ref: str | None = None  # every vLLM arm's build
    deployments: tuple[str, ...] = ()  # only these (a partial night: the others are reported missing)
    figures: bool = True  # the run's figures and report.md, kept with the night
    site_dir: Path | None = Path("site")  # the dashboard; None: not written
    report_path: Path | None = None  # the regression report; default <run folder>/nightly-report.md
    step_summary_path: Path | None = None  # appended to ($GITHUB_STEP_SUMMARY)


@dataclass(frozen=True)
class NightlyOutcome:
    night: NightRecord
    result: GateResult
    change_points: list[ChangePoint]
    run_dir: Path | None
    report_path: Path
    dashboard: DashboardResult | None
    wall_s: float
    warnings: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return self.result.exit_code  # an infrastructure failure is "not comparable": 2


def _gpu_problem(loaded: LoadedSweep, launcher: LauncherKind) -> str | None:
    """Why this host cannot run the sweep's GPU servers, said before anything is built."""
    needed = max((launch.profile.reserved_gpus(loaded.sweep.gpus_per_server)
                  for launch in loaded.launches.values()), default=0)
    if needed == 0 or (launcher == "ray" and os.environ.get("RAY_ADDRESS")):
        return None  # no GPU server, or a cluster whose nodes hold the GPUs
    gpus = gpu_info()
    if gpus.count == 0:
        return f"no GPU on this host (nvidia-smi shows none); the sweep's servers need {needed} each"
    if gpus.count < needed:
        return f"{gpus.count} GPU(s) on this host ({gpus.model}); the sweep's servers need {needed} each"
    return None


def infrastructure_reasons(night: NightRecord) -> str | None:
    """Points that never reached a running server (their failure kind says so, wherever the reason's
    words come from): the machine failed the night, not the code under test. One line per deployment
    and reason."""
    reasons = sorted({f"{r.deployment}: {r.reason}" for r in night.rows
                      if r.status != "ok" and r.failure in INFRASTRUCTURE_KINDS})
    return "; ".join(reasons)[:1000] if reasons else None


def _night_without_run(loaded: LoadedSweep, run_id: str, reason: str) -> NightRecord:
    """A night that failed before its sweep began (no GPU, a build): what it would have run, and why not."""
    gpu = gpu_info()
    declared = {launch.profile.gpu for launch in loaded.launches.values()}
    return NightRecord(
        night_id=run_id, started_at=utc_now_iso(), sweep_name=loaded.sweep.name, sweep_sha256=sha256_file(loaded.path),
        gpu=GpuFacts(model=gpu.model or (declared.pop() if len(declared) == 1 else None), count=gpu.count or None,
                     driver=gpu.driver),
        gpus_per_server=loaded.sweep.gpus_per_server, provenance=NightProvenance(harness_commit=harness_commit()),
        deployments={name: DeploymentFacts(hisparse_requested=launch.profile.kv.hisparse is not None)
                     for name, launch in sorted(loaded.launches.items())},
        infrastructure_failure=reason)


def _recent(changes: list[ChangePoint], night: NightRecord, result: GateResult) -> list[ChangePoint]:
    """Change points that start tonight or within tonight's baseline window: the ones that explain it."""
    window = {night.night_id, *result.baseline_nights}
    return [c for c in changes if c.night_id in window]


def run_night(loaded: LoadedSweep, options: NightlyOptions, progress: Progress = print) -> NightlyOutcome:
    started = time.monotonic()
    loaded = with_overrides(loaded, kernels=options.kernels, vllm_ref=options.vllm_ref,
                            deployments=options.deployments)
    run_id = options.run_id or new_run_id(loaded.sweep.name, simulated=options.simulate)
    store = NightStore(options.store)
    warnings: list[str] = []

    failure = None if options.simulate else _gpu_problem(loaded, options.launcher)
    run_dir: Path | None = None
    report, figures = None, []
    if failure is None:
        session = SessionOptions(run_id=run_id, results_root=options.results_root, simulate=options.simulate,
                                 launcher=options.launcher, ray_gpus=options.ray_gpus, envs_dir=options.envs_dir,
                                 clients_dir=options.clients_dir, build_first=True, outputs=options.figures)
        try:
            ran = run_session(loaded, session, progress)
        except KeyboardInterrupt:
            _add_interrupted(store, Path(options.results_root) / run_id, progress)
            raise
        failure, run_dir = ran.infrastructure_failure, ran.run_dir
        report, figures = ran.outputs.report, ran.outputs.figures
        warnings += ran.outputs.warnings
        if report is not None:
            progress(f"report {display_path(report)}, figures in {display_path(ran.outputs.plots_dir)}/")
    if run_dir is not None:
        night = night_from_run(run_dir)
        failure = failure or infrastructure_reasons(night)
        night = night.model_copy(update={"infrastructure_failure": failure})
    else:
        night = _night_without_run(loaded, run_id, failure or "no run folder was written")
    if night.infrastructure_failure:
        progress(f"infrastructure failure: {night.infrastructure_failure}")
    replacing = store.path_for(night.night_id).is_file()
    night = store.add(night, report=report, figures=figures, replace=True)
    progress(f"night {night.night_id} {'replaced in' if replacing else 'added to'} {display_path(store.root)}: "
             f"{sum(r.status == 'ok' for r in night.rows)}/{len(night.rows)} point(s) ok")

    history = store.load()
    warnings += history.warnings
    settings = loaded.sweep.nightly
    result = gate_night(night, history.before(night), settings)
    changes = _recent(history_change_points(history.nights), night, result)

    report_path = options.report_path or Path(options.results_root) / run_id / REPORT_NAME
    links = [("run report", display_path(report))] if report is not None else []
    atomic_write_text(report_path, regression_report(result, night, changes, links))
    if options.step_summary_path is not None:
        with open(options.step_summary_path, "a", encoding="utf-8") as summary:
            summary.write(step_summary(result, night, changes) + "\n")
    dashboard = None
    if options.site_dir is not None:
        try:
            dashboard = build_dashboard(store, options.site_dir, settings)
            warnings += dashboard.warnings
        except (HarnessError, OSError) as exc:
            warnings.append(f"warning: dashboard {display_path(options.site_dir)} not written: {exc}")
    return NightlyOutcome(night, result, changes, run_dir, report_path, dashboard, time.monotonic() - started,
                          sorted(set(warnings), key=warnings.index))


def _add_interrupted(store: NightStore, run_dir: Path, progress: Progress) -> None:
    """An interrupted night (a cancelled or timed-out job) keeps what it measured, marked as cut short."""
    if not RunPaths(run_dir).manifest.is_file():
        return
    night = night_from_run(run_dir, infrastructure_failure="interrupted before the sweep finished")
    store.add(night, replace=True)
    progress(f"interrupted: night {night.night_id} kept in {display_path(store.root)} as cut short")
