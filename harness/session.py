"""One sweep session, the work around a sweep that `sweep`, `simulate` and `nightly` share:

    reap       servers an earlier harness left behind (served sweeps only)
    build      the pinned EvalScope client and every vLLM arm's environment with its kernels, made and
               checked here before any server starts (`build_first`; otherwise local builds are made
               by the runner and Ray nodes make their own)
    run        the runner (real servers, real EvalScope) or the simulated engine in virtual time
    summary    summary.csv from the run's point records
    outputs    the figures and report.md (a figure that cannot be drawn costs the run its figures, never
               the run)

The result says what happened in typed fields: the counts, the run's status, the exit code the sweep
commands use (1 when a point failed or is degraded), and, when the session could not run the sweep at
all (a build, the dataset, the launcher), why, as an infrastructure failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.builds.client import ensure_client
from harness.builds.prepare import prepare_build
from harness.capacity import CapacityReport, run_capacity, simulate_capacity
from harness.config import LoadedSweep
from harness.errors import HarnessError
from harness.io import display_path
from harness.plan import make_plan
from harness.report.markdown import write_report
from harness.report.plots import default_plots_dir, plot_runs
from harness.results import RunPaths, new_run_id
from harness.runner import LauncherKind, SweepOptions, SweepOutcome, run_sweep
from harness.servers.reaper import reap_stale_servers
from harness.simulate import SimulateOptions, SimulateOutcome, simulate_sweep
from harness.summary import write_summary_csv

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SessionOptions:
    run_id: str | None = None
    results_root: Path = Path("results")
    simulate: bool = False  # the simulated engine in virtual time instead of servers and EvalScope
    launcher: LauncherKind = "ray"
    dialect: str | None = None
    ray_gpus: int | None = None  # GPUs a locally started Ray declares (fake ones on a CPU host)
    envs_dir: Path | None = None  # server environments (default ~/.cache/hisparse-harness/envs)
    clients_dir: Path | None = None  # pinned EvalScope clients (default ~/.cache/hisparse-harness/clients)
    build_first: bool = False  # every build made and checked here before the run (a failed one is reported)
    outputs: bool = True  # the figures and report.md at the end
    capacity: bool = False  # a capacity search per (arm, context) instead of the planned points


@dataclass
class RunOutputs:
    """What closing a run folder wrote: its report and figures, or why not."""

    report: Path | None = None
    plots_dir: Path | None = None
    figures: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        if self.report is None:
            return []
        return [f"report:  {display_path(self.report)}", f"figures: {display_path(self.plots_dir)}/"]


@dataclass
class SessionResult:
    run_id: str
    run_dir: Path | None  # None: nothing was written (the session failed before the run began)
    simulated: bool
    ok: int = 0
    degraded: int = 0
    failed: int = 0
    does_not_fit: int = 0  # points whose server refused their max_model_len: a result, not a failure
    skipped: int = 0
    status: str = "not run"
    wall_s: float = 0.0
    simulated_s: float = 0.0  # virtual time covered (simulate)
    failures: list[str] = field(default_factory=list)  # one line per failed or degraded point
    infrastructure_failure: str | None = None  # why the sweep could not run (a build, the dataset, the launcher)
    capacity: CapacityReport | None = None  # the searches' results (harness capacity)
    error: HarnessError | None = None  # the error behind it, for a command that reports it as its own
    outputs: RunOutputs = field(default_factory=RunOutputs)

    @property
    def exit_code(self) -> int:
        """The sweep commands' exit code: 2 when the sweep could not run, 1 when a point failed or is
        degraded, else 0."""
        if self.infrastructure_failure is not None:
            return 2
        return 1 if self.failed or self.degraded else 0


def close_run(run_dir: Path, *, outputs: bool, progress: Progress) -> RunOutputs:
    """summary.csv, then (when asked) the figures and report.md of a run folder."""
    write_summary_csv(run_dir)
    if not outputs:
        return RunOutputs()
    plots_dir = default_plots_dir([run_dir])
    try:
        figures = plot_runs([run_dir], plots_dir)
        report = write_report(run_dir, plots_dir)
    except (HarnessError, OSError, ValueError) as exc:
        return RunOutputs(warnings=[f"warning: {display_path(run_dir)}: figures and report.md not written: {exc}"])
    return RunOutputs(report=report, plots_dir=plots_dir, figures=[f for f in figures if f.suffix in (".svg", ".png")])


def _build_all(loaded: LoadedSweep, options: SessionOptions, progress: Progress) -> str | None:
    """Make the pinned client and make and check every vLLM arm's build (with its kernels), here, before
    any server starts; why one failed, or None. The run reuses what is made here."""
    plan = make_plan(loaded, envs_dir=options.envs_dir, clients_dir=options.clients_dir)
    if plan.client.spec is not None:
        try:
            client = ensure_client(plan.client.spec, options.clients_dir, progress)
        except HarnessError as exc:
            return f"client build failed (evalscope {plan.client.spec}): {exc}"
        progress(f"client: EvalScope {client.evalscope_version} in {display_path(client.env_dir)}")
    for dep in plan.deployments:
        if dep.build is None:
            continue
        try:
            prepared = prepare_build(dep.profile, dep.dialect, dep.build.python, options.envs_dir, progress)
        except HarnessError as exc:
            return f"{dep.name}: build {dep.build.spec} (kernels {dep.build.kernels}) failed: {exc}"
        progress(f"{dep.name}: build {prepared.env.spec}: {prepared.env.describe()}")
    return None


def run_session(loaded: LoadedSweep, options: SessionOptions, progress: Progress = print) -> SessionResult:
    """Reap, build, run or simulate, summary, outputs: one sweep, whichever command asked for it."""
    started = time.monotonic()
    run_id = options.run_id or new_run_id(loaded.sweep.name, simulated=options.simulate)
    result = SessionResult(run_id=run_id, run_dir=None, simulated=options.simulate)
    if not options.simulate:
        for killed in reap_stale_servers():
            progress(f"stopped a server left behind by an earlier harness: {killed}")
        if options.build_first:
            result.infrastructure_failure = _build_all(loaded, options, progress)
            if result.infrastructure_failure is not None:
                result.wall_s = time.monotonic() - started
                return result
    run_dir = Path(options.results_root) / run_id
    simulated = SimulateOptions(run_id=run_id, results_root=options.results_root)
    served = SweepOptions(run_id=run_id, results_root=options.results_root, launcher=options.launcher,
                          dialect=options.dialect, ray_gpus=options.ray_gpus, envs_dir=options.envs_dir,
                          clients_dir=options.clients_dir)
    try:
        outcome: SweepOutcome | SimulateOutcome
        if options.capacity:
            searched = (simulate_capacity(loaded, simulated, progress) if options.simulate else
                        run_capacity(loaded, served, progress))
            outcome, result.capacity = searched.sweep, searched.report
        elif options.simulate:
            outcome = simulate_sweep(loaded, simulated, progress=progress)
        else:
            outcome = run_sweep(loaded, served, progress=progress)
        if isinstance(outcome, SimulateOutcome):
            result.simulated_s = outcome.simulated_s
        result.ok, result.degraded, result.failed = outcome.ok, outcome.degraded, outcome.failed
        result.does_not_fit = outcome.does_not_fit
        result.skipped, result.status, result.failures = outcome.skipped, outcome.status, list(outcome.failures)
    except HarnessError as exc:  # a build on this host, the dataset, the launcher: the sweep could not run
        result.infrastructure_failure, result.error = f"the sweep stopped: {exc}", exc
    except BaseException:  # an interrupt: what was measured is kept in summary.csv, then it goes on up
        if RunPaths(run_dir).manifest.is_file():
            write_summary_csv(run_dir)
        raise
    if RunPaths(run_dir).manifest.is_file():
        result.run_dir = run_dir
        result.outputs = close_run(run_dir, outputs=options.outputs, progress=progress)
    result.wall_s = time.monotonic() - started
    return result
