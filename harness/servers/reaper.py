"""Pidfiles, so that servers outlive no harness: a harness killed with SIGKILL cannot stop its
servers (vllm #16259), so the next harness start finds their pidfiles and stops them.

One JSON file per server (and per load-generator client) in the pid dir. A process is stale when
its owning harness process is gone; both pids are checked together with their start times so a
recycled pid is never taken for the original process. Each pidfile names its host and boot: a
reaper acts only on its own host's processes and never deletes a pidfile of another host (pid dirs
may sit on a home directory shared by several machines); a pidfile from an earlier boot of this
host names no live process and is removed.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.io import atomic_write_json
from harness.redact import redact_argv
from harness.servers.base import DEFAULT_PID_DIR, ServerSpec, Teardown
from harness.servers.process import ServerProcess, is_running, proc_info, process_tree, terminate_tree

_ARGV_HEAD = 6


@dataclass(frozen=True)
class Owner:
    """The harness process a server belongs to."""

    pid: int
    start_ticks: int

    @classmethod
    def current(cls) -> Owner:
        info = proc_info(os.getpid())
        return cls(pid=os.getpid(), start_ticks=info.start_ticks if info else 0)

    def alive(self) -> bool:
        return is_running(self.pid, self.start_ticks)


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class PidRecord:
    name: str
    pid: int
    pgid: int
    start_ticks: int
    argv_head: list[str]
    host: str
    port: int
    log_path: str
    harness_pid: int
    harness_start_ticks: int
    created_unix_s: float
    hostname: str = ""  # empty in files of older harnesses: taken as this host
    boot_id: str = ""
    kind: str = "server"  # server | client

    def here(self) -> bool:
        """Written on this host (a shared pid dir holds other hosts' files too)."""
        return not self.hostname or self.hostname == socket.gethostname()

    def this_boot(self) -> bool:
        return not self.boot_id or self.boot_id == boot_id()


@dataclass(frozen=True)
class ReapedServer:
    record: PidRecord
    pidfile: Path
    teardown: Teardown

    def __str__(self) -> str:
        r = self.record
        state = "stopped" if self.teardown.clean else f"NOT fully stopped: {self.teardown.problem()}"
        return (f"{r.name} (pid {r.pid}, {r.host}:{r.port}, {' '.join(r.argv_head)}; "
                f"harness pid {r.harness_pid} is gone): {state}")


def _pidfile_path(pid_dir: Path, name: str, pid: int) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return Path(pid_dir) / f"{safe}-{pid}.json"


def track(server: ServerProcess, pid_dir: Path, owner: Owner | None = None) -> Path:
    """Write the pidfile of a freshly started server; ServerProcess.stop() removes it."""
    owner = owner or Owner.current()
    record = PidRecord(name=server.spec.name, pid=server.pid, pgid=server.pid, start_ticks=server.start_ticks,
                       argv_head=redact_argv(list(server.argv))[:_ARGV_HEAD], host=server.host,
                       port=server.port, log_path=str(server.spec.log_path), harness_pid=owner.pid,
                       harness_start_ticks=owner.start_ticks, created_unix_s=time.time(),
                       hostname=socket.gethostname(), boot_id=boot_id())
    path = _pidfile_path(Path(pid_dir).expanduser(), record.name, record.pid)
    atomic_write_json(path, asdict(record))
    server.pidfile = path
    return path


def track_client(name: str, pid: int, argv: list[str], pid_dir: Path, owner: Owner | None = None) -> Path:
    """A pidfile for a load-generator process, so a harness killed mid-point leaves no client behind
    (the parent-death signal stops it at once; this covers what that cannot, e.g. a reparented child)."""
    owner = owner or Owner.current()
    info = proc_info(pid)
    record = PidRecord(name=name, pid=pid, pgid=pid, start_ticks=info.start_ticks if info else 0,
                       argv_head=redact_argv(argv)[:_ARGV_HEAD], host="", port=0, log_path="",
                       harness_pid=owner.pid, harness_start_ticks=owner.start_ticks, created_unix_s=time.time(),
                       hostname=socket.gethostname(), boot_id=boot_id(), kind="client")
    path = _pidfile_path(Path(pid_dir).expanduser(), f"client-{name}", pid)
    atomic_write_json(path, asdict(record))
    return path


def start_tracked(spec: ServerSpec, host: str, port: int, owner: Owner | None = None) -> ServerProcess:
    server = ServerProcess.start(spec, host, port)
    track(server, spec.resolved_pid_dir(), owner)
    return server


def read_pidfiles(pid_dir: Path) -> list[tuple[Path, PidRecord | None]]:
    """Every pidfile in pid_dir; None for one that cannot be read (removed by the reaper)."""
    pid_dir = Path(pid_dir).expanduser()
    if not pid_dir.is_dir():
        return []
    out = []
    for path in sorted(pid_dir.glob("*.json")):
        try:
            out.append((path, PidRecord(**json.loads(path.read_text()))))
        except (OSError, ValueError, TypeError):
            out.append((path, None))
    return out


def reap_stale_servers(pid_dir: Path | None = None, grace_s: float = 10) -> list[ReapedServer]:
    """Stop servers whose owning harness is dead; return the ones that were still running.

    The server's whole session is stopped, so engine and worker processes left behind by an API
    server that already died are found as well.
    """
    reaped = []
    for path, record in read_pidfiles(pid_dir or DEFAULT_PID_DIR):
        if record is None:
            path.unlink(missing_ok=True)
            continue
        if not record.here():
            continue  # another host's process: only a reaper there may judge it
        if not record.this_boot():
            path.unlink(missing_ok=True)  # written before this host last booted: nothing of it runs
            continue
        if is_running(record.harness_pid, record.harness_start_ticks):
            continue  # its harness still runs and will stop it
        tree = process_tree(record.pid, session_id=record.pgid, not_before_ticks=record.start_ticks)
        if not is_running(record.pid, record.start_ticks):
            # the recorded pid may now be someone else's: keep only the old session's members
            tree = {pid: t for pid, t in tree.items() if pid != record.pid and _session_of(pid) == record.pgid}
        if tree:
            teardown = terminate_tree(record.pid if record.pid in tree else next(iter(tree)),
                                      session_id=record.pgid, not_before_ticks=record.start_ticks,
                                      grace_s=grace_s)
            reaped.append(ReapedServer(record=record, pidfile=path, teardown=teardown))
            if not teardown.clean:
                continue  # keep the pidfile: the next start tries again
        path.unlink(missing_ok=True)
    return reaped


def _session_of(pid: int) -> int | None:
    info = proc_info(pid)
    return info.sid if info else None
