"""The sweep loop: per deployment, standup -> points -> teardown; resume; failure policy.

A failure is data: a point that failed still gets a point.json with the reason and
the server log tail, and the sweep goes on (or stops, by policy). A point already
ok in the run folder is skipped and its files are never touched.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Literal

from harness import provenance
from harness.config import LoadedSweep, display_path
from harness.dataset import BuiltDataset, ensure_built
from harness.errors import HarnessError
from harness.launch.base import (
    Launcher,
    ServerHandle,
    ServerSpec,
    ServerStartError,
    stop_servers_on_signal,
)
from harness.launch.preflight import run_preflight
from harness.launch.vllm import ServerCommand
from harness.plan import DeploymentPlan, Plan, PointPlan, make_plan
from harness.point import failed_record, run_point
from harness.records import PointRecord
from harness.redact import redact_config
from harness.results import (
    Manifest,
    RunPaths,
    atomic_write_text,
    read_manifest,
    read_point,
    write_manifest,
    write_point,
)

Progress = Callable[[str], None]
LauncherKind = Literal["ray", "local"]


@dataclass(frozen=True)
class SweepOptions:
    run_id: str | None = None
    results_root: Path = Path("results")
    launcher: LauncherKind = "ray"
    dialect: str | None = None
    pid_dir: Path | None = None
    ray_gpus: int | None = None  # GPUs a locally started Ray declares (fake ones on a CPU host)


@dataclass
class SweepOutcome:
    run_dir: Path
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    wall_s: float = 0.0
    stopped_by_policy: bool = False
    failures: list[str] = field(default_factory=list)


def default_run_id(sweep_name: str) -> str:
    return f"{sweep_name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"


def make_launcher(options: SweepOptions) -> Launcher:
    if options.launcher == "local":
        from harness.launch.local import LocalLauncher
        return LocalLauncher()
    from harness.launch.ray_launcher import RayLauncher
    return RayLauncher(num_gpus=options.ray_gpus)


class _RunState:
    """The manifest and the counts, shared by deployment threads; every change is written at once."""

    def __init__(self, paths: RunPaths, manifest: Manifest, outcome: SweepOutcome):
        self.paths, self.manifest, self.outcome = paths, manifest, outcome
        self._lock = threading.Lock()

    def update(self, change: Callable[[Manifest], None]) -> None:
        with self._lock:
            change(self.manifest)
            write_manifest(self.paths.root, self.manifest)

    def record_point(self, record: PointRecord) -> None:
        write_point(self.paths.root, record)

        def change(m: Manifest) -> None:
            m.points.setdefault(record.deployment, {})[record.point_id] = record.status
        self.update(change)
        with self._lock:
            if record.status == "ok":
                self.outcome.ok += 1
            else:
                self.outcome.failed += 1
                self.outcome.failures.append(f"{record.deployment} c{record.parallel}: {record.reason}")


def run_sweep(loaded: LoadedSweep, options: SweepOptions, progress: Progress = print) -> SweepOutcome:
    started = time.monotonic()
    plan = make_plan(loaded, dialect=options.dialect)
    run_id = options.run_id or default_run_id(loaded.sweep.name)
    paths = RunPaths(Path(options.results_root) / run_id)
    manifest = _open_manifest(paths, plan)
    outcome = SweepOutcome(run_dir=paths.root)

    pending = {dep.name: [p for p in dep.points if not _already_ok(paths, p)] for dep in plan.deployments}
    outcome.skipped = sum(len(d.points) - len(pending[d.name]) for d in plan.deployments)
    if outcome.skipped:
        progress(f"resuming {run_id}: {outcome.skipped} point(s) already ok, skipped")
    todo = [d for d in plan.deployments if pending[d.name]]
    if not todo:
        progress(f"nothing to run: every point of {run_id} is ok")
        outcome.wall_s = time.monotonic() - started
        return outcome

    # every vLLM build is made and checked before any server starts; commands run from the build
    from harness.launch.build import prepare_builds
    plan, builds = prepare_builds(plan, {d.name for d in todo}, options.dialect, progress,
                                  build_here=options.launcher == "local")
    todo = [d for d in plan.deployments if pending[d.name]]

    dataset = ensure_built(loaded.recipe, plan.dataset.conversations_needed)
    progress(f"dataset {display_path(dataset.path)}: {dataset.conversations} conversations"
             f"{' (cached)' if dataset.cached else ''}")
    state = _RunState(paths, manifest, outcome)
    prov = provenance.collect(loaded, dataset.path, dataset.sha256)

    def begin(m: Manifest) -> None:
        m.provenance = {**m.provenance, **prov.__dict__}
        m.gpu_model = m.gpu_model or prov.gpu.get("model") or _declared_gpu(plan)
        m.workload["dataset_sha256"] = dataset.sha256
        m.workload["conversations_built"] = dataset.conversations
        for name, env in builds.items():
            m.deployments[name]["build"] = env.provenance()
        m.status = "running"
        m.ended_at = None
    state.update(begin)

    launcher = make_launcher(options)
    try:
        with stop_servers_on_signal(launcher):
            gpus_needed = max(_reserved_gpus(plan, d) for d in todo)
            parallel_slots = max(1, min(len(todo), launcher.nodes_for(gpus_needed)))
            if parallel_slots > 1:
                progress(f"running {len(todo)} deployments on {parallel_slots} nodes at once")
                with ThreadPoolExecutor(max_workers=parallel_slots) as pool:
                    futures = [pool.submit(_run_deployment, plan, d, pending[d.name], dataset, launcher,
                                           state, options, progress) for d in todo]
                    for f in futures:
                        f.result()
            else:
                for dep in todo:
                    if not _run_deployment(plan, dep, pending[dep.name], dataset, launcher, state, options,
                                           progress):
                        break
    finally:
        launcher.close()
        status = "interrupted"
        if outcome.ok + outcome.failed + outcome.skipped == sum(len(d.points) for d in plan.deployments):
            status = "failed" if outcome.failed else "ok"
        if outcome.stopped_by_policy:
            status = "stopped"

        def end(m: Manifest) -> None:
            m.status = status
            m.ended_at = provenance.utc_now_iso()
        state.update(end)
        outcome.wall_s = time.monotonic() - started
    return outcome


def _declared_gpu(plan: Plan) -> str | None:
    gpus = {plan.sweep.launch_for(d.name).gpu for d in plan.deployments}
    return gpus.pop() if len(gpus) == 1 else None


def _already_ok(paths: RunPaths, point: PointPlan) -> bool:
    record = read_point(paths.point_json(point.deployment, point.parallel))
    return record is not None and record.status == "ok"


def _open_manifest(paths: RunPaths, plan: Plan) -> Manifest:
    sweep = plan.sweep
    if paths.manifest.exists():
        manifest = read_manifest(paths.root)
        if manifest.sweep_name != sweep.sweep.name:
            raise HarnessError(f"{display_path(paths.root)}: run id belongs to sweep {manifest.sweep_name!r}, "
                               f"not {sweep.sweep.name!r}; choose another --run-id")
        return manifest
    recipe = sweep.recipe.recipe
    manifest = Manifest(
        run_id=paths.run_id, sweep_name=sweep.sweep.name, sweep_path=display_path(sweep.path),
        simulated=plan.simulated, gpus_per_server=sweep.sweep.gpus_per_server,
        workload={"recipe": recipe.name, "first_turn_length": recipe.first_turn_length,
                  "subsequent_turn_length": recipe.subsequent_turn_length, "num_turns": recipe.num_turns,
                  "max_tokens": sweep.sweep.client.max_tokens,
                  "conversations_needed": plan.dataset.conversations_needed},
        resolved_config=redact_config({"sweep": sweep.sweep.model_dump(mode="json"),
                                       "launches": {name: ld.profile.model_dump(mode="json")
                                                    for name, ld in sweep.launches.items()}}),
        deployments={d.name: {"launch": display_path(d.launch_path), "engine": d.engine,
                              "dialect": d.command.dialect, "restarts": 0} for d in plan.deployments},
        points={d.name: {p.point_id: "pending" for p in d.points} for d in plan.deployments},
        started_at=provenance.utc_now_iso())
    write_manifest(paths.root, manifest)
    return manifest


def _server_spec(plan: Plan, dep: DeploymentPlan, paths: RunPaths, options: SweepOptions) -> ServerSpec:
    profile = plan.sweep.launch_for(dep.name)
    prepare = None
    if profile.engine == "vllm" and options.launcher == "ray":  # the build is made on the server's node
        from harness.launch.build import build_on_node
        prepare = partial(build_on_node, profile, options.dialect)
    return ServerSpec(name=dep.name, argv=list(dep.command.argv), env=dict(dep.command.env), host=profile.host,
                      port=profile.port or 0, log_path=paths.server_log(dep.name),
                      ready_timeout_s=dep.ready_timeout_s, gpus=_reserved_gpus(plan, dep),
                      served_model_name=dep.served_model_name, pid_dir=options.pid_dir, prepare=prepare)


def _reserved_gpus(plan: Plan, dep: DeploymentPlan) -> int:
    profile = plan.sweep.launch_for(dep.name)
    if profile.reserve_gpus is not None:
        return profile.reserve_gpus
    return 0 if profile.engine == "sim" else dep.gpus


class _Server:
    """A deployment's server across restarts: start, check, restart, stop."""

    def __init__(self, spec: ServerSpec, command: ServerCommand, launcher: Launcher, state: _RunState,
                 progress: Progress):
        self.spec, self.command, self.launcher, self.state, self.progress = spec, command, launcher, state, progress
        self.handle: ServerHandle | None = None
        self.starts = 0
        self._record_command(port=None)

    def _record_command(self, port: int | None) -> None:
        # re-runnable by hand: the port the launcher picked replaces the placeholder once known
        atomic_write_text(self.state.paths.command_txt(self.spec.name), self.command.shell_line(port=port) + "\n")

    def ensure_up(self) -> ServerHandle:
        if self.handle is not None and self.handle.alive() and self.handle.healthy():
            return self.handle
        if self.handle is not None:
            self.progress(f"{self.spec.name}: server is down, restarting")
            self.stop()
        self.handle = self.launcher.start(self.spec)
        self.starts += 1
        self._record_command(port=self.handle.port)
        if self.starts > 1:
            def bump(m: Manifest) -> None:
                m.deployments[self.spec.name]["restarts"] = m.deployments[self.spec.name].get("restarts", 0) + 1
            self.state.update(bump)
        version = provenance.server_version(self.handle.base_url)

        def note(m: Manifest) -> None:
            m.deployments[self.spec.name].update({"base_url": self.handle.base_url, "node": self.handle.node_id,
                                                  "server_version": version})
            if self.handle.build_provenance:
                m.deployments[self.spec.name]["build"] = self.handle.build_provenance
        self.state.update(note)
        return self.handle

    def stop(self) -> None:
        if self.handle is not None:
            try:
                self.handle.stop()
            except HarnessError as exc:
                self.progress(f"{self.spec.name}: teardown: {exc}")
            self.handle = None


def _run_deployment(plan: Plan, dep: DeploymentPlan, points: list[PointPlan], dataset: BuiltDataset,
                    launcher: Launcher, state: _RunState, options: SweepOptions, progress: Progress) -> bool:
    """Run the pending points of one deployment; False when the failure policy says stop."""
    paths = state.paths
    spec = _server_spec(plan, dep, paths, options)
    server = _Server(spec, dep.command, launcher, state, progress)
    policy = plan.sweep.sweep.on_point_failure
    preflight = run_preflight(dep.name, plan.sweep.launch_for(dep.name), spec.gpus, paths.root,
                              paths.preflight_json(dep.name),
                              server_on_this_host=options.launcher == "local" or launcher.nodes_for(0) == 1)
    if not preflight.ok:
        reason = "preflight: " + "; ".join(preflight.problems)
        progress(f"{dep.name}: {reason}")
        for point in points:
            state.record_point(failed_record(plan, point, reason, []))
        return policy == "continue"
    try:
        for i, point in enumerate(points):
            try:
                record = _point_with_retries(plan, dep, point, server, dataset, paths, progress,
                                             announce=i == 0)
            except ServerStartError as exc:
                progress(f"{dep.name}: server failed to start: {exc.reason}")
                for rest in points[i:]:
                    state.record_point(failed_record(plan, rest, f"server failed to start: {exc.reason}",
                                               exc.log_tail))
                return policy == "continue"
            state.record_point(record)
            if record.status == "failed" and policy == "stop":
                state.outcome.stopped_by_policy = True
                return False
    finally:
        server.stop()
    return True


def _point_with_retries(plan: Plan, dep: DeploymentPlan, point: PointPlan, server: _Server,
                        dataset: BuiltDataset, paths: RunPaths, progress: Progress, announce: bool) -> PointRecord:
    """Run a point, again on a healthy (restarted if need be) server up to max_point_retries times.
    Every attempt keeps its own EvalScope folder; point.json records the last one."""
    retries, attempt = plan.sweep.sweep.max_point_retries, 0
    while True:
        restarted_before = server.starts
        handle = server.ensure_up()  # a ServerStartError ends the deployment: the caller records it
        if announce or server.starts != restarted_before:
            progress(f"{dep.name}: server ready at {handle.base_url}")
        announce = False
        record = run_point(plan, dep, point, handle, dataset, paths, progress)
        record.server_restarted = server.starts > 1 and server.starts != restarted_before
        if record.status == "ok" or attempt == retries:
            return record
        attempt += 1
        progress(f"{dep.name}: c{point.parallel}: retrying ({attempt} of {retries})")
