"""The Ray launcher: each server is owned by a Ray actor inside a one-bundle placement group.

The actor asks for `num_gpus` explicitly (with a placement group alone CUDA_VISIBLE_DEVICES can
be empty: ray #50180, vllm #14610), picks a free port on its node, and runs the server through
process.py in a session of its own. That session escapes the actor's process group, so
`ray.kill(actor)` alone would leave the server running: stop() always asks the actor to stop the
tree first (docs/facts.md §7).

A server on the driver's node logs straight into the run folder; on another node it logs to that
node's temp folder and the driver ships the lines back through Ray (LogShipper), so the driver's
run folder holds every server log whatever the filesystem. Pidfiles stay on the server's node
(its reaper needs them there); their path is reported back and recorded.

Import this module only inside a command's run function: it imports ray.
"""

from __future__ import annotations

import functools
import os
import socket
import time
import uuid
from pathlib import Path

import ray
from ray.exceptions import RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from harness.errors import HarnessError
from harness.records import GpuTelemetry
from harness.servers.base import (
    LOG_TAIL_LINES,
    Launcher,
    LauncherClosed,
    PreparedServer,
    ServerHandle,
    ServerSpec,
    ServerStartError,
    ServerStopError,
    Teardown,
    read_log_tail,
)
from harness.servers.process import http_healthy, port_open, terminate_tree
from harness.servers.ray_actor import (
    CONTROL_TIMEOUT_S,
    ActorServerInfo,
    LogShipper,
    ServerActor,
    StartFailure,
)
from harness.servers.reaper import Owner, reap_stale_servers

_ACTOR_START_TIMEOUT_S = 120  # worker process start + the server's spawn, before readiness
_CONTROL_TIMEOUT_S = CONTROL_TIMEOUT_S


class RayServerHandle(ServerHandle):
    def __init__(self, spec: ServerSpec, actor, pg, info: ActorServerInfo, driver_node_id: str,
                 on_stopped=None):
        self._spec = spec
        self._actor = actor
        self._pg = pg
        self._info = info
        self._driver_node_id = driver_node_id
        self._on_stopped = on_stopped
        self._stopped = False
        self.name = spec.name
        self.host = info.host
        self.port = info.port
        self.pid = info.pid
        self.node_id = info.node_id
        self.log_path = Path(spec.log_path)
        self.cuda_visible_devices = info.cuda_visible_devices
        self.model_path = info.model_path
        self.pidfile = info.pidfile
        self.api_key = spec.api_key
        self.stop_grace_s = spec.stop_grace_s
        self._shipper: LogShipper | None = None
        if info.node_log_path is not None:
            self._shipper = LogShipper(actor, self.log_path)
            self._shipper.start()

    def sync_log(self) -> None:
        """Bring the driver's copy of the server log up to date (a no-op when the server is local)."""
        if self._shipper is not None:
            self._shipper.sync()

    def healthy(self, timeout_s: float = 5) -> bool:
        return http_healthy(self.base_url, timeout_s, self.api_key)

    def alive(self) -> bool:
        try:
            return bool(ray.get(self._actor.alive.remote(), timeout=_CONTROL_TIMEOUT_S))
        except RayError:
            return False

    def log_tail(self, n: int = LOG_TAIL_LINES) -> list[str]:
        try:
            return ray.get(self._actor.log_tail.remote(n), timeout=_CONTROL_TIMEOUT_S)
        except RayError:
            return read_log_tail(self.log_path, n)

    def start_gpu_telemetry(self, out_path: Path, interval_s: float) -> None:
        try:
            ray.get(self._actor.gpu_telemetry_start.remote(Path(out_path), interval_s), timeout=_CONTROL_TIMEOUT_S)
        except RayError:
            pass  # the point records telemetry unavailable at stop

    def stop_gpu_telemetry(self) -> GpuTelemetry:
        try:
            return ray.get(self._actor.gpu_telemetry_stop.remote(), timeout=_CONTROL_TIMEOUT_S)
        except RayError as exc:
            return GpuTelemetry(reason=f"the server's Ray actor did not answer ({type(exc).__name__})")

    def stop(self, grace_s: float | None = None) -> Teardown | None:
        if self._stopped:
            return self.last_teardown
        grace_s = self.stop_grace_s if grace_s is None else grace_s
        where = f"server {self.name!r} (pid {self.pid} on node {self.node_id}, port {self.port})"
        try:
            teardown = ray.get(self._actor.stop.remote(grace_s), timeout=grace_s + _CONTROL_TIMEOUT_S)
        except RayError as exc:
            teardown = self._stop_without_actor(grace_s, exc)
        finally:
            if self._shipper is not None:  # the last lines, before the actor (and its node's log) goes
                self._shipper.stop()
            _kill_quietly(self._actor)
            _remove_quietly(self._pg)
            self._stopped = True
            if self._on_stopped is not None:
                self._on_stopped(self)
        if teardown is None:
            raise ServerStopError(f"{where}: its Ray actor is unreachable and the server runs on another "
                                  f"node; its pidfile there lets the next harness start stop it")
        self.last_teardown = teardown
        if not teardown.clean or not _wait_port_closed(self.host, self.port):
            raise ServerStopError(f"{where}: {teardown.problem() or 'port still accepts connections'}")
        return teardown

    def _stop_without_actor(self, grace_s: float, exc: Exception) -> Teardown | None:
        # The actor is gone but its server (own session) may not be: stop it from here when it
        # runs on this node; None when it runs elsewhere.
        if self.node_id != self._driver_node_id:
            return None
        return terminate_tree(self.pid, session_id=self.pid, not_before_ticks=self._info.start_ticks,
                              grace_s=grace_s, host=self.host, port=self.port)


@functools.cache
def _remote_server_actor():
    return ray.remote(ServerActor)


def _kill_quietly(actor) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except (RayError, ValueError):
        pass


def _remove_quietly(pg) -> None:
    try:
        remove_placement_group(pg)
    except Exception:  # already removed, or the cluster is gone: nothing left to free
        pass


def _wait_port_closed(host: str, port: int, timeout_s: float = 5) -> bool:
    deadline = time.monotonic() + timeout_s
    while port_open(host, port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def _gcs_address(address: str) -> tuple[str, int] | None:
    """host and port to check for a RAY_ADDRESS value; None when there is nothing to check."""
    if address == "auto":
        current = Path("/tmp/ray/ray_current_cluster")
        if not current.exists():
            raise HarnessError("RAY_ADDRESS=auto but no Ray cluster was started on this machine "
                               "(no /tmp/ray/ray_current_cluster); start one or unset RAY_ADDRESS")
        address = current.read_text().strip()
    address = address.removeprefix("ray://")
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise HarnessError(f"RAY_ADDRESS={address!r} is not host:port (or ray://host:port, auto, local)")
    return host.strip("[]"), int(port)


def _check_ray_address(address: str, timeout_s: float = 5) -> None:
    """Fail fast where ray.init() would hang for minutes retrying a cluster that is not there."""
    host, port = _gcs_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise HarnessError(f"RAY_ADDRESS={address}: no Ray cluster answers at {host}:{port} ({reason}); "
                           f"start the cluster or unset RAY_ADDRESS to use a local Ray") from exc


def _before_the_server(spec: ServerSpec, actor, pg, method, timeout_s: float | None, doing: str):
    """Call an actor step that precedes a running server; on any failure release the actor and
    its placement group, then raise ServerStartError (or re-raise an interrupt)."""
    try:
        outcome = ray.get(method.remote(), timeout=timeout_s)
    except RayError as exc:
        outcome = StartFailure(f"the Ray actor failed while {doing} ({type(exc).__name__})",
                               read_log_tail(spec.log_path))
    except BaseException:
        _kill_quietly(actor)
        _remove_quietly(pg)
        raise
    if isinstance(outcome, StartFailure):
        _kill_quietly(actor)
        _remove_quietly(pg)
        raise ServerStartError(spec.name, outcome.reason, spec.log_path, outcome.log_tail)
    return outcome


class RayLauncher(Launcher):
    """Servers as Ray actors, one placement group each.

    address: a cluster to join (default: $RAY_ADDRESS); without one, a local Ray is started with
    the given num_gpus/num_cpus (num_gpus declares fake GPUs on machines without them), a capped
    object store and temp_dir (Ray's socket paths need it short). If Ray is already initialised
    in this process, that session is used and left running on close().
    """

    def __init__(self, address: str | None = None, *, num_gpus: int | None = None,
                 num_cpus: int | None = None, object_store_memory_bytes: int = 256 * 1024**2,
                 temp_dir: Path | None = None, placement_timeout_s: float = 120):
        super().__init__(reaper=reap_stale_servers)
        self.placement_timeout_s = placement_timeout_s
        address = address if address is not None else os.environ.get("RAY_ADDRESS") or None
        if address not in (None, "local"):
            _check_ray_address(address)
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            try:
                if address in (None, "local"):
                    # Ray starts its workers at niceness 15; the servers its actors start are what a run
                    # measures, so the cluster the harness owns runs them at normal priority (on a cluster
                    # it joins, the server's start lowers niceness where the node allows it).
                    ray.init(address="local", num_gpus=num_gpus, num_cpus=num_cpus, include_dashboard=False,
                             object_store_memory=object_store_memory_bytes,
                             _temp_dir=str(temp_dir) if temp_dir else None, log_to_driver=False,
                             _system_config={"worker_niceness": 0})
                else:
                    ray.init(address=address, log_to_driver=False)
            except (RayError, ConnectionError, ValueError, RuntimeError) as exc:
                raise HarnessError(f"cannot start or join Ray (address {address or 'local'}): "
                                   f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
        self._driver_node_id = ray.get_runtime_context().get_node_id()

    def _gpu_nodes(self) -> list[float]:
        return [float(n["Resources"].get("GPU", 0)) for n in ray.nodes()
                if n.get("Alive") and n["Resources"].get("CPU", 0) >= 1]

    def nodes_for(self, gpus: int) -> int:
        return sum(1 for node_gpus in self._gpu_nodes() if node_gpus >= gpus)

    def start(self, spec: ServerSpec) -> RayServerHandle:
        if not self.accepting:
            raise LauncherClosed(spec.name, spec.log_path)
        self._reap_once(spec.resolved_pid_dir())  # leftovers of killed harnesses, on this node
        if self.nodes_for(spec.gpus) == 0:
            largest = max(self._gpu_nodes(), default=0)
            raise ServerStartError(spec.name, f"no Ray node has {spec.gpus} GPU(s) and a CPU "
                                   f"(largest node: {largest:g} GPU(s)); the placement group can never "
                                   f"be placed", spec.log_path, [])
        bundle = {"CPU": 1, "GPU": spec.gpus} if spec.gpus else {"CPU": 1}
        pg = placement_group([bundle], strategy="STRICT_PACK", name=f"hisparse-{spec.name}-{uuid.uuid4().hex[:8]}")
        try:
            placed = pg.wait(timeout_seconds=self.placement_timeout_s)
        except BaseException:
            _remove_quietly(pg)
            raise
        if not placed:
            _remove_quietly(pg)
            raise ServerStartError(spec.name, f"placement group {bundle} not placed within "
                                   f"{self.placement_timeout_s:g} s (GPUs busy with other servers?)",
                                   spec.log_path, [])
        actor = _remote_server_actor().options(
            num_gpus=spec.gpus, num_cpus=1, max_concurrency=4, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg,
                                                                 placement_group_bundle_index=0),
        ).remote(spec, Owner.current(), self._driver_node_id)
        prepared = PreparedServer()
        if spec.prepare is not None:  # a build can take minutes: no timeout but Ctrl-C
            prepared = _before_the_server(spec, actor, pg, actor.prepare, None, "preparing the node")
        info = _before_the_server(spec, actor, pg, actor.launch, _ACTOR_START_TIMEOUT_S, "starting the server")
        handle = RayServerHandle(spec, actor, pg, info, self._driver_node_id, on_stopped=self._forget)
        handle.build_provenance = prepared.provenance
        with self._lock:
            self._handles.append(handle)
            accepting = self.accepting
        if not accepting:
            self._stop_after_failed_start(handle)
            raise LauncherClosed(spec.name, spec.log_path)
        try:
            failure = ray.get(actor.wait_ready.remote(), timeout=spec.ready_timeout_s + _CONTROL_TIMEOUT_S)
        except RayError as exc:
            failure = StartFailure(f"the Ray actor failed while waiting for readiness ({type(exc).__name__})",
                                   read_log_tail(spec.log_path))
        except BaseException:
            self._stop_after_failed_start(handle)
            raise
        if failure is not None:
            self._stop_after_failed_start(handle)
            raise ServerStartError(spec.name, failure.reason, spec.log_path, failure.log_tail)
        handle.sync_log()  # what the server printed up to readiness is in the driver's run folder now
        return handle

    def _stop_after_failed_start(self, handle: RayServerHandle) -> None:
        try:
            handle.stop()
        except ServerStopError:
            pass  # the start error is the one to report; the pidfile stays for the next reap

    def close(self) -> None:
        self.stop_accepting()
        try:
            self.stop_all()
        finally:
            if self._owns_ray and ray.is_initialized():
                ray.shutdown()
