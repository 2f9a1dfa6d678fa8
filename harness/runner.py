"""The sweep loop: per deployment, standup -> points -> teardown; resume; failure policy.

A failure is data: a point that failed still gets a point.json with the reason and the server log
tail, and the sweep goes on (or stops, by policy). A point already ok in the run folder is skipped
and its files are never touched. The launcher and the load generator are parameters, so the
policy (retries, stop/continue, status) can be exercised with in-process fakes.

Interrupts: SIGINT/SIGTERM stop every server first (a running point's client sees its server gone
and ends within a second), cancel deployments not started yet, then wait for the threads; the run
folder stays resumable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Literal, Protocol

from harness import provenance
from harness.builds.client import ensure_client
from harness.builds.prepare import PreparedBuild, prepare_build
from harness.config import LoadedSweep
from harness.config.prompts import DEFAULT_PROMPTS, PromptSet, load_prompt_set
from harness.correctness import PressuredProbe, ProbeTarget, ask
from harness.dataset import BuiltDataset, ensure_built
from harness.errors import HarnessError
from harness.evidence import check_hisparse, parse_does_not_fit
from harness.io import display_path, utc_now_iso
from harness.loadgen import LoadGenerator, with_offset
from harness.plan import DeploymentPlan, Plan, PointPlan, make_plan
from harness.point import does_not_fit_record, failed_record, run_point
from harness.records import (
    Answer,
    BuildRecord,
    CorrectnessRecord,
    DeploymentRecord,
    PointRecord,
    StopRecord,
    WorkloadRecord,
)
from harness.results import RunRecorder, new_run_id, run_dir_for
from harness.servers.base import (
    LOCAL_NODE,
    START_LOG_LINES,
    Launcher,
    PreparedServer,
    ServerHandle,
    ServerSpec,
    ServerStartError,
    read_log_tail,
    stop_servers_on_signal,
)
from harness.servers.preflight import run_preflight
from harness.weights import WeightsOutcome, prefetch

Progress = Callable[[str], None]
LauncherKind = Literal["ray", "local"]
# After an interrupt has stopped the servers, how long deployment threads get to notice.
INTERRUPT_JOIN_S = 20.0


@dataclass(frozen=True)
class SweepOptions:
    run_id: str | None = None
    results_root: Path = Path("results")
    launcher: LauncherKind = "ray"
    dialect: str | None = None
    pid_dir: Path | None = None
    ray_gpus: int | None = None  # GPUs a locally started Ray declares (fake ones on a CPU host)
    envs_dir: Path | None = None  # where builds live (default ~/.cache/hisparse-harness/envs)
    clients_dir: Path | None = None  # where pinned EvalScope clients live (default ~/.cache/hisparse-harness/clients)


@dataclass
class SweepOutcome:
    run_dir: Path
    ok: int = 0
    degraded: int = 0
    failed: int = 0
    skipped: int = 0
    does_not_fit: int = 0
    wall_s: float = 0.0
    status: str = "running"
    stopped_by_policy: bool = False
    failures: list[str] = field(default_factory=list)


def make_launcher(options: SweepOptions) -> Launcher:
    # each launcher imports its own heavy dependencies (ray); only the chosen one is loaded
    if options.launcher == "local":
        from harness.servers.local import LocalLauncher
        return LocalLauncher()
    from harness.servers.ray_launcher import RayLauncher
    return RayLauncher(num_gpus=options.ray_gpus)


def open_recorder(plan: Plan, root: Path, *, simulated: bool | None = None, engine_label: str | None = None,
                  started_at: str | None = None, planned_points: bool = True) -> RunRecorder:
    """Open (or resume) the run folder for a plan: `sweep` and `simulate` both start here."""
    sweep, recipe = plan.loaded, plan.loaded.dataset_recipe
    return RunRecorder.open(
        root, sweep_name=sweep.sweep.name, sweep_path=display_path(sweep.path),
        simulated=plan.simulated if simulated is None else simulated, started_at=started_at,
        gpus_per_server=sweep.sweep.gpus_per_server, gpu_model=_declared_gpu(plan),
        workload=WorkloadRecord(recipe=recipe.name, first_turn_length=recipe.first_turn_length,
                                subsequent_turn_length=recipe.subsequent_turn_length, num_turns=recipe.num_turns,
                                max_tokens=sweep.sweep.client.max_tokens,
                                conversations_needed=plan.dataset.conversations_needed,
                                conversation_reuse=plan.dataset.mode if plan.dataset.mode != "fresh" else None),
        resolved_config={"sweep": sweep.sweep.model_dump(mode="json"),
                         "launches": {name: ld.profile.model_dump(mode="json") for name, ld in sweep.launches.items()}},
        deployments={d.name: DeploymentRecord(launch=display_path(d.launch_path), engine=engine_label or d.engine,
                                              dialect=d.dialect, arm=d.arm or d.name, context_tokens=d.context_tokens,
                                              max_model_len=d.profile.serve.max_model_len)
                     for d in plan.deployments},
        # a search's points are known only as it runs: none are pending before it starts
        points={d.name: [p.point_id for p in d.points] if planned_points else [] for d in plan.deployments})


def _build_datasets(plan: Plan, deployments: list[str], progress: Progress) -> dict[str, BuiltDataset]:
    """Each deployment's dataset (a sweep with contexts has one per context), built once each, cached."""
    built: dict[str, BuiltDataset] = {}
    by_recipe: dict[int, BuiltDataset] = {}
    for name in deployments:
        dep = plan.deployment(name)
        recipe = dep.recipe or plan.loaded.recipe
        key = recipe.recipe.first_turn_length
        if key not in by_recipe:
            dataset = ensure_built(recipe, plan.dataset.build_conversations)
            progress(f"dataset {display_path(dataset.path)}: {dataset.conversations} conversations"
                     f"{f' of {key:,}-token first turns' if dep.context_tokens else ''}"
                     f"{' (cached)' if dataset.cached else ''}")
            by_recipe[key] = dataset
        built[name] = by_recipe[key]
    return built


def _declared_gpu(plan: Plan) -> str | None:
    gpus = {d.profile.gpu for d in plan.deployments}
    return gpus.pop() if len(gpus) == 1 else None


class _Run:
    """What every deployment thread shares: the plan, the recorder, the counts and the stop flag."""

    def __init__(self, plan: Plan, recorder: RunRecorder, outcome: SweepOutcome, datasets: dict[str, BuiltDataset],
                 launcher: Launcher, load_generator: LoadGenerator, options: SweepOptions, progress: Progress):
        self.plan, self.recorder, self.outcome, self.datasets = plan, recorder, outcome, datasets
        self.launcher, self.load_generator, self.options, self.progress = launcher, load_generator, options, progress
        self.stop = threading.Event()  # set by the failure policy or an interrupt: start nothing new
        self._shifted = 0  # conversations taken by retries that shifted (retry_cache: shift)
        self.interrupted = False
        self.weights: dict[str, WeightsOutcome] = {}  # by deployment: its hub model, fetched onto the nodes
        # by deployment: what a build made here adds to its server's environment (the local launcher;
        # under Ray the node's own preparation returns it)
        self.server_env: dict[str, dict[str, str]] = {}
        self.prompts: PromptSet | None = None  # the correctness probe's prompts; None: no probe
        self.correctness: dict[str, CorrectnessRecord] = {}  # by deployment: its probe's answers so far
        self._lock = threading.Lock()

    def record_point(self, record: PointRecord) -> None:
        self.recorder.record_point(record)
        with self._lock:
            if record.status == "ok":
                self.outcome.ok += 1
            elif record.status == "does_not_fit":
                self.outcome.does_not_fit += 1
            elif record.status == "degraded":
                self.outcome.degraded += 1
                self.outcome.failures.append(f"{record.deployment} c{record.concurrency}: degraded: {record.reason}")
            else:
                self.outcome.failed += 1
                self.outcome.failures.append(f"{record.deployment} c{record.concurrency}: {record.reason}")

    def shifted(self, point: PointPlan) -> PointPlan:
        """The point on conversations past every planned one and every earlier shift (retry_cache: shift)."""
        with self._lock:
            offset = self.plan.dataset.conversations_needed + self._shifted
            self._shifted += point.conversations
        return replace(point, dataset_offset=offset, client_argv=tuple(with_offset(point.client_argv, offset)))

    def stop_by_policy(self) -> None:
        with self._lock:
            self.outcome.stopped_by_policy = True
        self.stop.set()


class PointSource(Protocol):
    """Which point a deployment runs next: a sweep's planned list, or a search that decides from the last
    point's record (harness/capacity.py)."""

    def next(self, last: PointRecord | None) -> PointPlan | None:
        """The point to run after `last` (None: the first); None: the deployment is done."""

    def remaining(self) -> list[PointPlan]:
        """The points it would still run (recorded as failed when the server cannot start)."""


class PlannedPoints:
    """A sweep's points, in order."""

    def __init__(self, points: list[PointPlan]):
        self._points = list(points)

    def next(self, last: PointRecord | None) -> PointPlan | None:
        return self._points.pop(0) if self._points else None

    def remaining(self) -> list[PointPlan]:
        return list(self._points)


SourceFactory = Callable[[Plan, DeploymentPlan, RunRecorder], PointSource]


def run_sweep(loaded: LoadedSweep, options: SweepOptions, progress: Progress = print, *,
              launcher: Launcher | None = None, load_generator: LoadGenerator | None = None,
              sources: SourceFactory | None = None) -> SweepOutcome:
    """Run every deployment's points: the planned ones not already ok, or, with `sources`, the points each
    deployment's source gives (a capacity search decides each from the last)."""
    started = time.monotonic()
    plan = make_plan(loaded, dialect=options.dialect, envs_dir=options.envs_dir, clients_dir=options.clients_dir)
    run_id = options.run_id or new_run_id(loaded.sweep.name)
    recorder = open_recorder(plan, run_dir_for(options.results_root, run_id), planned_points=sources is None)
    outcome = SweepOutcome(run_dir=recorder.paths.root)

    # a search's points are its own probes, each sized to the question it asks; only sweeps ask the prompts
    probing = sources is None and plan.config.correctness.enabled
    prompts = load_prompt_set(plan.config.correctness.prompts) if probing else None
    pending = {d.name: [p for p in d.points if not recorder.point_ok(d.name, p.concurrency)] for d in plan.deployments}
    point_sources: dict[str, PointSource] = (
        {d.name: PlannedPoints(pending[d.name]) for d in plan.deployments} if sources is None
        else {d.name: sources(plan, d, recorder) for d in plan.deployments})
    if sources is None:
        outcome.skipped = sum(len(d.points) - len(pending[d.name]) for d in plan.deployments)
        if outcome.skipped:
            progress(f"resuming {run_id}: {outcome.skipped} point(s) already ok, skipped")
    todo = [d for d in plan.deployments if sources is not None or pending[d.name]]
    if not todo:
        progress(f"nothing to run: every point of {run_id} is ok")
        outcome.status = recorder.finish()
        outcome.wall_s = time.monotonic() - started
        return outcome

    # local servers run from builds made here, before any server starts; under Ray each node makes its own
    builds: dict[str, PreparedBuild] = {}
    if options.launcher == "local":
        builds = _prepare_builds_here(todo, options, progress)
    client_version, client_lock = plan.client.version, None
    if plan.client.spec is not None:  # EvalScope runs beside the harness: the pinned one is built here, once
        client = ensure_client(plan.client.spec, options.clients_dir, progress)
        client_version, client_lock = client.evalscope_version, (client.lock or {}).get("sha256")
    datasets = _build_datasets(plan, [d.name for d in todo] or [d.name for d in plan.deployments], progress)
    dataset = datasets[todo[0].name if todo else plan.deployments[0].name]
    recorder.record_provenance(provenance.collect(loaded, dataset.path, dataset.sha256,
                                                  evalscope_version=client_version,
                                                  client_source=plan.client.source,
                                                  client_lock_sha256=client_lock,
                                                  hub_inputs={i.role: i.record() for i in dataset.inputs}))
    recorder.update_workload(dataset_sha256=dataset.sha256, conversations_built=dataset.conversations)
    for name, prepared in builds.items():
        recorder.update_deployment(name, build=_build_record(plan.deployment(name), prepared.provenance()))

    launcher = launcher or make_launcher(options)
    run = _Run(plan, recorder, outcome, datasets, launcher, load_generator or LoadGenerator(options.pid_dir),
               options, progress)
    run.prompts = prompts
    sources_by_dep = point_sources
    run.server_env = {name: prepared.server_env for name, prepared in builds.items()}
    try:
        with stop_servers_on_signal(launcher):
            # hub models onto every node that can run their servers, before any server starts; a failed
            # fetch fails the preflight of the deployments that load it
            run.weights = prefetch([(d.name, d.weights, d.reserve_gpus) for d in todo],
                                   use_ray=options.launcher == "ray", progress=progress)
            for name, fetched in run.weights.items():
                if fetched.problem is None:
                    recorder.update_deployment(name, weights=fetched.record())
            slots = max(1, min(len(todo), launcher.nodes_for(max(d.reserve_gpus for d in todo))))
            if slots > 1:
                progress(f"running {len(todo)} deployments on {slots} nodes at once")
                _run_parallel(run, todo, sources_by_dep, slots)
            else:
                for dep in todo:
                    if run.stop.is_set():
                        break
                    _run_deployment(run, dep, sources_by_dep[dep.name])
    except KeyboardInterrupt:
        run.interrupted = True
        raise
    finally:
        run.load_generator.close()
        launcher.close()
        outcome.status = recorder.finish(interrupted=run.interrupted, stopped_by_policy=outcome.stopped_by_policy)
        outcome.wall_s = time.monotonic() - started
    return outcome


def _run_parallel(run: _Run, todo: list[DeploymentPlan], sources: dict[str, PointSource], slots: int) -> None:
    pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="deployment")
    futures: list[Future] = [pool.submit(_run_deployment, run, d, sources[d.name]) for d in todo]
    try:
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for future in done:
            future.result()  # a harness bug in one thread: re-raise it here
        wait(futures)
    except BaseException:
        # interrupt (or a crash): stop every server now, so running points end at once, start nothing new
        run.interrupted = True
        run.stop.set()
        run.launcher.stop_accepting()
        try:
            run.launcher.stop_all()
        except HarnessError as exc:
            run.progress(f"teardown: {exc}")
        pool.shutdown(wait=False, cancel_futures=True)
        wait(futures, timeout=INTERRUPT_JOIN_S)
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _prepare_builds_here(todo: list[DeploymentPlan], options: SweepOptions,
                         progress: Progress) -> dict[str, PreparedBuild]:
    builds = {}
    for dep in todo:
        if dep.build is None:
            continue
        prepared = prepare_build(dep.profile, dep.dialect, dep.build.python, options.envs_dir, progress)
        env = prepared.env
        progress(f"{dep.name}: build {env.spec}: {env.describe()}, torch {env.torch_version}"
                 f"{' (reused)' if not env.created and env.kind != 'system' else ''}")
        builds[dep.name] = prepared
    return builds


def _build_record(dep: DeploymentPlan, build_provenance: dict) -> BuildRecord:
    return BuildRecord.model_validate({**build_provenance, "kernels": dep.build.kernels if dep.build else "vllm"})


def _prepare_on_node(profile, dialect, expected_python, envs_dir) -> PreparedServer:
    """ServerSpec.prepare under Ray: the build is made and checked on the server's node."""
    prepared = prepare_build(profile, dialect, expected_python, envs_dir)
    return PreparedServer(python=prepared.env.python, provenance=prepared.provenance(), env=prepared.server_env)


def _server_spec(run: _Run, dep: DeploymentPlan) -> ServerSpec:
    profile, fetched = dep.profile, run.weights.get(dep.name)
    # the fetched model's path on each node, keyed as the launcher knows its nodes (fills "{model}")
    model_paths = fetched.paths_for(LOCAL_NODE if run.options.launcher == "local" else None) if fetched else {}
    prepare = None
    if dep.build is not None and run.options.launcher == "ray":  # the build is made on the server's node
        prepare = partial(_prepare_on_node, profile, dep.dialect, dep.build.python, run.options.envs_dir)
    env = {**dep.command.env, **run.server_env.get(dep.name, {})}  # e.g. the bundled kernels' overlay
    return ServerSpec(name=dep.name, argv=list(dep.command.argv), env=env, host=profile.host,
                      port=profile.port or 0, log_path=run.recorder.paths.server_log(dep.name),
                      ready_timeout_s=dep.ready_timeout_s, gpus=dep.reserve_gpus,
                      served_model_name=dep.served_model_name, api_key=dep.api_key, pid_dir=run.options.pid_dir,
                      prepare=prepare, model_paths=model_paths, stop_grace_s=dep.stop_grace_s)


def start_failure_reason(exc: ServerStartError) -> str:
    """The words a deployment's points record when its server did not start (their kind is exc.failure)."""
    return exc.reason if isinstance(exc, NotAsRequested) else f"server failed to start: {exc.reason}"


class NotAsRequested(ServerStartError):
    """The server started but does not run what the profile asked for (HiSparse off)."""


class _Server:
    """A deployment's server across restarts: start, check, restart, stop."""

    def __init__(self, run: _Run, dep: DeploymentPlan):
        self.run, self.dep = run, dep
        self.spec = _server_spec(run, dep)
        self.handle: ServerHandle | None = None
        self.starts = 0
        run.recorder.write_command(dep.name, dep.command.shell_line())

    def ensure_up(self) -> ServerHandle:
        if self.handle is not None and self.handle.alive() and self.handle.healthy():
            return self.handle
        if self.handle is not None:
            self.run.progress(f"{self.dep.name}: server is down, restarting")
            self.stop()
        self.handle = self.run.launcher.start(self.spec)
        self.starts += 1
        recorder = self.run.recorder
        # re-runnable by hand: the port the launcher picked replaces the placeholder once known
        recorder.write_command(self.dep.name, self.dep.command.shell_line(port=self.handle.port,
                                                                          model=self.handle.model_path))
        if self.starts > 1:
            recorder.count_restart(self.dep.name)
        fields: dict = {"base_url": self.handle.base_url, "node": self.handle.node_id,
                        "server_pid": self.handle.pid, "pidfile": self.handle.pidfile,
                        "server_version": provenance.server_version(self.handle.base_url)}
        if self.handle.build_provenance:
            fields["build"] = _build_record(self.dep, self.handle.build_provenance)
        recorder.update_deployment(self.dep.name, **fields)
        if self.dep.profile.kv.hisparse is not None:
            self._check_hisparse()
        return self.handle

    def _check_hisparse(self) -> None:
        """An arm that asked for HiSparse must show it (start lines or metrics) before any point runs."""
        evidence = check_hisparse(self.dep.profile, self.handle.log_path, self.handle.base_url + "/metrics",
                                  self.dep.api_key)
        self.run.recorder.update_deployment(self.dep.name, evidence=evidence)
        if evidence.problem:
            self.stop()
            raise NotAsRequested(self.dep.name, evidence.problem, self.spec.log_path, [])

    def stop(self) -> None:
        if self.handle is not None:
            at = utc_now_iso()
            try:
                self.handle.stop()
            except HarnessError as exc:
                self.run.progress(f"{self.dep.name}: teardown: {exc}")
            teardown = self.handle.last_teardown
            if teardown is not None:
                self.run.recorder.record_stop(self.dep.name, StopRecord(
                    at=at, grace_s=teardown.grace_s, duration_s=teardown.duration_s,
                    exited_in_grace=teardown.exited_in_grace, killed=teardown.pids_killed,
                    survivors=teardown.survivors))
                killed = f", {len(teardown.pids_killed)} process(es) killed" if teardown.pids_killed else ""
                self.run.progress(f"{self.dep.name}: server stopped in {teardown.duration_s:.1f}s "
                                  f"(grace {teardown.grace_s:.0f}s{killed})")
            self.handle = None


def _run_deployment(run: _Run, dep: DeploymentPlan, source: PointSource) -> None:
    """Run the points of one deployment, as its source gives them; stops the sweep when the failure policy
    says so."""
    if run.stop.is_set():
        return
    policy = run.plan.config.on_point_failure
    paths = run.recorder.paths
    point = source.next(None)
    if point is None:
        return
    preflight = run_preflight(dep.name, dep.profile, dep.reserve_gpus, paths.root, paths.preflight_json(dep.name),
                              server_on_this_host=run.options.launcher == "local"
                              or run.launcher.nodes_for(0) == 1, weights=run.weights.get(dep.name))
    if not preflight.ok:
        reason = "preflight: " + "; ".join(preflight.problems)
        run.progress(f"{dep.name}: {reason}")
        for rest in [point, *source.remaining()]:
            run.record_point(failed_record(run.plan, rest, reason, [], "infrastructure"))
        if policy == "stop":
            run.stop_by_policy()
        return
    server = _Server(run, dep)
    first = True
    try:
        while point is not None:
            if run.stop.is_set():
                return
            try:
                record = _point_with_retries(run, dep, point, server, announce=first)
            except ServerStartError as exc:
                if run.stop.is_set():
                    return
                # vLLM's refusal stands above its traceback, further up than the tail a failure records
                refused = (None if isinstance(exc, NotAsRequested)
                           else parse_does_not_fit(read_log_tail(exc.log_path, START_LOG_LINES)))
                if refused is not None:  # a result: the deployment's points say so, the sweep goes on
                    run.progress(f"{dep.name}: does not fit: {refused.summary}")
                    for rest in [point, *source.remaining()]:
                        run.record_point(does_not_fit_record(run.plan, rest, refused.reason, exc.log_tail))
                    return
                reason = start_failure_reason(exc)
                kind = "not_as_requested" if isinstance(exc, NotAsRequested) else exc.failure
                run.progress(f"{dep.name}: {reason}")
                for rest in [point, *source.remaining()]:
                    run.record_point(failed_record(run.plan, rest, reason, exc.log_tail, kind))
                if policy == "stop":
                    run.stop_by_policy()
                return
            first = False
            if record is None:  # interrupted: the point stays pending, a resume runs it
                return
            run.record_point(record)
            if record.status == "failed" and policy == "stop":
                run.stop_by_policy()
                return
            point = source.next(record)
    finally:
        server.stop()


def _point_with_retries(run: _Run, dep: DeploymentPlan, point: PointPlan, server: _Server,
                        announce: bool) -> PointRecord | None:
    """Run a point, again on a healthy (restarted if need be) server up to max_point_retries times.
    Every attempt keeps its own EvalScope folder; point.json records the last one. None: the sweep
    is stopping and the point was cut short."""
    retries, attempt, how = run.plan.config.max_point_retries, 0, None
    while True:
        restarted_before = server.starts
        handle = server.ensure_up()  # a ServerStartError ends the deployment: the caller records it
        if announce or server.starts != restarted_before:
            run.progress(f"{dep.name}: server ready at {handle.base_url}")
        announce = False
        _ask_alone(run, dep, handle)
        probe = _probe_under_pressure(run, dep, point, handle)
        try:
            record = run_point(run.plan, dep, point, handle, run.datasets[dep.name], run.recorder.paths,
                               run.load_generator, run.progress, stop=run.stop)
        finally:
            if probe is not None:
                _record_pressured(run, dep, point, probe)
        if run.stop.is_set() and run.interrupted:
            return None
        record.server_restarted = server.starts > 1 and server.starts != restarted_before
        record.retry = how if attempt else None
        if record.status != "failed" or attempt == retries or run.stop.is_set():
            return record
        attempt += 1
        # the failed attempt warmed the prefix cache with its conversations: the retry must not reuse it
        how = run.plan.config.retry_cache
        if how == "shift":
            point = run.shifted(point)
            where = f"on conversations no attempt sent (offset {point.dataset_offset})"
        else:
            server.stop()
            where = "on a restarted server (cold prefix cache)"
        run.progress(f"{dep.name}: c{point.concurrency}: retrying ({attempt} of {retries}) {where}")


def _probe_target(dep: DeploymentPlan, handle: ServerHandle) -> ProbeTarget:
    return ProbeTarget(handle.base_url, dep.served_model_name, dep.api_key)


def _ask_alone(run: _Run, dep: DeploymentPlan, handle: ServerHandle) -> None:
    """The correctness probe's unpressured half: once per deployment, before its first point."""
    if run.prompts is None or dep.name in run.correctness or run.stop.is_set():
        return
    settings = run.plan.config.correctness
    answers = ask(_probe_target(dep, handle), run.prompts, settings.max_tokens)
    record = CorrectnessRecord(prompts=display_path(settings.prompts or DEFAULT_PROMPTS), unpressured=answers)
    run.correctness[dep.name] = record
    run.recorder.record_correctness(dep.name, record)
    run.progress(f"{dep.name}: correctness probe alone: {_answered(answers)}")


def _answered(answers: list[Answer]) -> str:
    failed = sum(1 for a in answers if a.error is not None)
    score = CorrectnessRecord.score(answers)
    return (f"{len(answers) - failed} of {len(answers)} answered"
            + (f", {score:.0%} right" if score is not None else "")
            + (f" ({failed} failed: {next(a.error for a in answers if a.error)})" if failed else ""))


def _probe_under_pressure(run: _Run, dep: DeploymentPlan, point: PointPlan,
                          handle: ServerHandle) -> PressuredProbe | None:
    """The pressured half, asked during the deployment's highest point once half its concurrency runs."""
    if run.prompts is None or dep.name not in run.correctness:
        return None
    if point.concurrency != max(p.concurrency for p in dep.points):
        return None
    fill = max(1, point.concurrency // 2)
    return PressuredProbe(_probe_target(dep, handle), run.prompts, run.plan.config.correctness.max_tokens,
                          fill).start()


def _record_pressured(run: _Run, dep: DeploymentPlan, point: PointPlan, probe: PressuredProbe) -> None:
    probe.finish()
    record = run.correctness[dep.name].model_copy(update={
        "pressured": probe.answers, "pressured_concurrency": point.concurrency,
        "pressured_running": probe.running, "pressured_s": probe.asked_s, "note": probe.note})
    run.correctness[dep.name] = record
    run.recorder.record_correctness(dep.name, record)
    if probe.answers:
        agreement = record.agreement_under_pressure
        same = "-" if agreement is None else f"{agreement:.0%}"
        running = "?" if probe.running is None else f"{probe.running:.0f}"
        run.progress(f"{dep.name}: correctness probe at c{point.concurrency} ({running} running): "
                     f"{_answered(probe.answers)}, {same} the same as alone")
    else:
        run.progress(f"{dep.name}: correctness probe under pressure: {probe.note}")
