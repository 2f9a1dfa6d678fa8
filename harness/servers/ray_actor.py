"""What runs inside Ray on the server's node: the actor that owns one server process, and the shipper
that brings the actor's node-local log back to the driver's run folder.

Import this module only where ray may be imported (the Ray launcher).
"""

from __future__ import annotations

import os
import tempfile
import threading
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import ray
from ray.exceptions import RayError

from harness.errors import HarnessError
from harness.records import GpuTelemetry
from harness.servers.base import (
    PreparedServer,
    ServerSpec,
    ServerStartError,
    Teardown,
    read_log_tail,
)
from harness.servers.process import ServerProcess, pick_free_port
from harness.servers.reaper import Owner, start_tracked
from harness.telemetry import GpuSampler

_WILDCARD_HOSTS = ("0.0.0.0", "::", "")
CONTROL_TIMEOUT_S = 30
SHIP_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class ActorServerInfo:
    host: str
    port: int
    pid: int
    start_ticks: int
    node_id: str
    node_ip: str
    cuda_visible_devices: str | None
    model_path: str | None = None  # the fetched model on this node, where the argv needed one
    node_log_path: str | None = None  # on another node than the driver: the log there, shipped back
    pidfile: str | None = None  # on the server's node


@dataclass(frozen=True)
class StartFailure:
    """Start errors cross from the actor as values: a pickled exception would come back wrapped."""

    reason: str
    log_tail: list[str]


class ServerActor:
    """Runs inside the Ray worker: owns one ServerProcess. Threaded (max_concurrency > 1) so that
    stop() and alive() answer while wait_ready() is still polling."""

    def __init__(self, spec: ServerSpec, owner: Owner, driver_node_id: str | None = None):
        self._owner = owner
        self._server: ServerProcess | None = None
        # On another node the driver's run folder may not exist: log to this node, and the driver
        # ships the lines back (log_chunk), so its run folder is complete whatever the filesystem.
        self._node_log: Path | None = None
        if driver_node_id is not None and ray.get_runtime_context().get_node_id() != driver_node_id:
            self._node_log = (Path(tempfile.gettempdir()) / "hisparse-harness" / "server-logs"
                              / f"{spec.name}-{uuid.uuid4().hex[:8]}.log")
            spec = replace(spec, log_path=self._node_log)
        self._spec = spec

    def prepare(self) -> PreparedServer | StartFailure:
        """The spec's preparation (the server's build), here on the server's node."""
        try:
            prepared = self._spec.prepare()
        except HarnessError as exc:
            return StartFailure(f"preparing the node failed: {str(exc).splitlines()[0]}",
                                read_log_tail(self._spec.log_path))
        if prepared.env:  # e.g. the bundled kernels' folder on PYTHONPATH
            self._spec = replace(self._spec, env={**self._spec.env, **prepared.env})
        return prepared

    def launch(self) -> ActorServerInfo | StartFailure:
        node_ip = ray.util.get_node_ip_address()
        node_id = ray.get_runtime_context().get_node_id()
        try:
            self._spec = self._spec.on_node(node_id)  # the model's path as the fetch left it on this node
        except ServerStartError as exc:
            return StartFailure(exc.reason, [])
        bind_host = self._spec.host
        connect_host = node_ip if bind_host in _WILDCARD_HOSTS else bind_host
        port = self._spec.port or pick_free_port(bind_host or "0.0.0.0")
        try:
            self._server = start_tracked(self._spec, bind_host, port, self._owner)
        except ServerStartError as exc:
            return StartFailure(exc.reason, exc.log_tail)
        self._server.host = connect_host  # readiness and the port check go where the harness connects
        return ActorServerInfo(host=connect_host, port=port, pid=self._server.pid,
                               start_ticks=self._server.start_ticks, node_id=node_id, node_ip=node_ip,
                               cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                               model_path=self._spec.model_paths.get(node_id),
                               node_log_path=str(self._node_log) if self._node_log else None,
                               pidfile=str(self._server.pidfile) if self._server.pidfile else None)

    def wait_ready(self) -> StartFailure | None:
        try:
            self._server.wait_ready()
        except ServerStartError as exc:
            return StartFailure(exc.reason, exc.log_tail)
        return None

    def alive(self) -> bool:
        return self._server is not None and self._server.alive()

    def log_tail(self, n: int) -> list[str]:
        return read_log_tail(self._spec.log_path, n)

    def gpu_telemetry_start(self, out_path: Path, interval_s: float) -> None:
        """NVML runs here, on the server's node, with the GPUs Ray gave this actor."""
        self._gpu_sampler = GpuSampler(out_path, interval_s, os.environ.get("CUDA_VISIBLE_DEVICES")).start()

    def gpu_telemetry_stop(self) -> GpuTelemetry:
        sampler, self._gpu_sampler = getattr(self, "_gpu_sampler", None), None
        return sampler.stop() if sampler is not None else GpuTelemetry(reason="not sampled")

    def log_chunk(self, offset: int, max_bytes: int = SHIP_CHUNK_BYTES) -> bytes:
        """The node-local log from `offset` (at most max_bytes), for the driver to append."""
        try:
            with open(self._spec.log_path, "rb") as fh:
                fh.seek(offset)
                return fh.read(max_bytes)
        except FileNotFoundError:
            return b""

    def stop(self, grace_s: float | None = None) -> Teardown:
        return self._server.stop(grace_s) if self._server is not None else Teardown()


class LogShipper(threading.Thread):
    """Appends a server's node-local log to the driver's copy, every interval and on demand."""

    def __init__(self, actor, dest: Path, interval_s: float = 1.0):
        super().__init__(name=f"log-ship:{dest.name}", daemon=True)
        self.actor, self.dest, self.interval_s = actor, Path(dest), interval_s
        self.offset = 0
        self._lock = threading.Lock()
        self._stop_event = threading.Event()

    def sync(self) -> None:
        """Ship everything written so far (best effort: an unreachable actor ships nothing more)."""
        with self._lock:
            while True:
                try:
                    chunk = ray.get(self.actor.log_chunk.remote(self.offset), timeout=CONTROL_TIMEOUT_S)
                except RayError:
                    return
                if not chunk:
                    return
                self.dest.parent.mkdir(parents=True, exist_ok=True)
                with self.dest.open("ab") as fh:
                    fh.write(chunk)
                self.offset += len(chunk)
                if len(chunk) < SHIP_CHUNK_BYTES:
                    return

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.sync()

    def stop(self) -> None:
        self._stop_event.set()
        self.sync()
