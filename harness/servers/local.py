"""The local launcher: servers as subprocesses of the harness on this machine, no Ray."""

from __future__ import annotations

import os
from pathlib import Path

from harness.servers.base import (
    LOCAL_NODE,
    Launcher,
    LauncherClosed,
    ServerHandle,
    ServerSpec,
    ServerStopError,
    Teardown,
)
from harness.servers.process import ServerProcess, http_healthy, pick_free_port
from harness.servers.reaper import reap_stale_servers, start_tracked


class LocalServerHandle(ServerHandle):
    def __init__(self, server: ServerProcess, on_stopped=None):
        self._server = server
        self._on_stopped = on_stopped
        self.name = server.spec.name
        self.host = server.host
        self.port = server.port
        self.pid = server.pid
        self.node_id = None
        self.log_path = Path(server.spec.log_path)
        self.cuda_visible_devices = server.spec.env.get("CUDA_VISIBLE_DEVICES",
                                                        os.environ.get("CUDA_VISIBLE_DEVICES"))
        self.api_key = server.spec.api_key
        self.pidfile = str(server.pidfile) if server.pidfile else None
        self.stop_grace_s = server.spec.stop_grace_s

    def healthy(self, timeout_s: float = 5) -> bool:
        return self.alive() and http_healthy(self.base_url, timeout_s, self.api_key)

    def alive(self) -> bool:
        return self._server.alive()

    def stop(self, grace_s: float | None = None) -> Teardown:
        teardown = self._server.stop(grace_s)
        self.last_teardown = teardown
        if self._on_stopped is not None:
            self._on_stopped(self)
        if not teardown.clean:
            raise ServerStopError(f"server {self.name!r} (pid {self.pid}, port {self.port}): "
                                  f"{teardown.problem()}")
        return teardown


class LocalLauncher(Launcher):
    """One server at a time on this machine (nodes_for is 1): GPUs are not partitioned here."""

    def __init__(self) -> None:
        super().__init__(reaper=reap_stale_servers)

    def start(self, spec: ServerSpec) -> LocalServerHandle:
        if not self.accepting:
            raise LauncherClosed(spec.name, spec.log_path)
        self._reap_once(spec.resolved_pid_dir())
        spec = spec.on_node(LOCAL_NODE)  # the fetched model's path on this machine
        port = spec.port or pick_free_port(spec.host)
        server = start_tracked(spec, spec.host, port)
        handle = LocalServerHandle(server, on_stopped=self._forget)
        handle.model_path = spec.model_paths.get(LOCAL_NODE) if spec.model_paths else None
        with self._lock:
            self._handles.append(handle)
            accepting = self.accepting
        try:
            if not accepting:
                raise LauncherClosed(spec.name, spec.log_path)
            server.wait_ready()
        except BaseException:
            # early exit, timeout, or Ctrl-C while waiting: nothing of this server may survive
            server.stop()
            self._forget(handle)
            raise
        return handle

    def nodes_for(self, gpus: int) -> int:
        return 1
