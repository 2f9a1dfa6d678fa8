"""One server subprocess: start it in its own session, wait until it is ready, stop its whole tree.

Used directly by the local launcher and inside the Ray actor. Process trees are found through
/proc (Linux): vLLM is an API server + engine core + workers, and SIGKILL to the API server alone
leaves the rest holding GBs (docs/facts.md §7), so teardown signals every descendant.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from harness.io import die_with_parent
from harness.redact import redact_argv, redact_text
from harness.servers.base import ServerSpec, ServerStartError, Teardown, fill_placeholders, read_log_tail

_PROC = Path("/proc")
_POLL_S = 0.25
# The server is what a run measures: it runs at normal priority even where its starter runs lower (a Ray
# worker runs at niceness 15 by default, so a server it started yielded the CPU to the client, Ray and
# every other normal process on the node: slower and noisier on a busy node).
SERVER_NICENESS = 0
# Direct HTTP only: a proxy from the environment must never see the probe traffic.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# ---- /proc -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    start_ticks: int  # clock ticks after boot: with the pid, identifies a process across pid reuse


def proc_info(pid: int) -> ProcInfo | None:
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'
    rest = raw[raw.rindex(")") + 2:].split()
    return ProcInfo(pid=pid, state=rest[0], ppid=int(rest[1]), pgid=int(rest[2]), sid=int(rest[3]),
                    start_ticks=int(rest[19]))


def _all_procs() -> list[ProcInfo]:
    infos = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            info = proc_info(int(entry.name))
            if info is not None:
                infos.append(info)
    return infos


def is_running(pid: int, start_ticks: int | None = None) -> bool:
    """Alive and not a zombie; with start_ticks, also the same process (not a recycled pid)."""
    info = proc_info(pid)
    if info is None or info.state in ("Z", "X"):
        return False
    return start_ticks is None or info.start_ticks == start_ticks


def process_tree(root_pid: int, session_id: int | None = None,
                 not_before_ticks: int = 0) -> dict[int, int]:
    """pid -> start_ticks of root_pid, its descendants, and members of session `session_id`.

    Session members are included because a server started with start_new_session leads its own
    session: its children stay in it even after their parent dies and they are reparented, unless
    they call setsid themselves, in which case the parent links still find them while it lives.
    """
    procs = [p for p in _all_procs() if p.state not in ("Z", "X")]
    children: dict[int, list[ProcInfo]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p)
    tree: dict[int, int] = {}
    root = proc_info(root_pid)
    stack = [root] if root is not None and root.state not in ("Z", "X") else []
    if session_id is not None:
        stack += [p for p in procs if p.sid == session_id and p.start_ticks >= not_before_ticks]
    while stack:
        p = stack.pop()
        if p.pid in tree or p.pid == os.getpid():
            continue
        tree[p.pid] = p.start_ticks
        stack.extend(children.get(p.pid, []))
    return tree


def _signal_tree(tree: dict[int, int], sig: int) -> list[int]:
    sent = []
    for pid, ticks in tree.items():
        if is_running(pid, ticks):
            try:
                os.kill(pid, sig)
                sent.append(pid)
            except ProcessLookupError:
                pass
    return sent


def _shm_files_of(pids: list[int]) -> set[str]:
    """/dev/shm/psm_* files a set of processes holds open or mapped (Python multiprocessing shm)."""
    found: set[str] = set()
    for pid in pids:
        try:
            for fd in (_PROC / str(pid) / "fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("/dev/shm/psm_"):
                    found.add(target.removesuffix(" (deleted)"))
            for line in (_PROC / str(pid) / "maps").read_text().splitlines():
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith("/dev/shm/psm_"):
                    found.add(fields[5].removesuffix(" (deleted)"))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A port free now on this node; a small race with other binders is accepted."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    bind_host = "" if host in ("0.0.0.0", "::") else host
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((bind_host, 0))
        return int(sock.getsockname()[1])


# After the server's own grace: how long the processes it left get after their own SIGTERM, before SIGKILL.
_LEFTOVER_GRACE_S = 5.0


def terminate_tree(root_pid: int, *, session_id: int | None = None, not_before_ticks: int = 0,
                   grace_s: float = 15, host: str | None = None, port: int | None = None,
                   reap: subprocess.Popen | None = None) -> Teardown:
    """SIGTERM the server, give its tree grace_s to exit, then SIGTERM what is left, then SIGKILL; confirm
    nothing survives.

    Only the server (the root) gets the first SIGTERM: vLLM's API server then shuts its engine and workers
    down in order, and a worker that is unpinning hundreds of GiB of host memory must not be signalled or
    killed mid-way (a process killed while unpinning has outlived a scheduler's kill wait and drained the
    node). The tree is re-read while waiting, so processes spawned during shutdown are caught too. `reap`
    is our own Popen of root_pid: polling it keeps the root from lingering as a zombie.
    """
    started = time.monotonic()
    tree = process_tree(root_pid, session_id, not_before_ticks)
    shm = _shm_files_of(list(tree))
    signalled = _signal_tree({root_pid: tree[root_pid]} if root_pid in tree else {}, signal.SIGTERM)
    left = _wait_tree(tree, root_pid, session_id, not_before_ticks, reap, time.monotonic() + grace_s)
    exited_in_grace = not left
    if left:  # the server did not take its tree down in time: every process left gets its own SIGTERM
        if session_id is not None and is_running(session_id, not_before_ticks or None):
            try:  # the leader is ours, so is its group: catches members forked since the snapshot
                os.killpg(session_id, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        signalled += _signal_tree(left, signal.SIGTERM)
        left = _wait_tree(tree, root_pid, session_id, not_before_ticks, reap,
                          time.monotonic() + _LEFTOVER_GRACE_S, signal_new=True)
    killed = _signal_tree(left, signal.SIGKILL) if left else []
    kill_deadline = time.monotonic() + 5
    while True:
        if reap is not None:
            reap.poll()
        survivors = [pid for pid, t in tree.items() if is_running(pid, t)]
        if not survivors or time.monotonic() >= kill_deadline:
            break
        time.sleep(0.05)
    removed = []
    if not survivors:
        for path in sorted(shm):
            try:
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:
                pass  # the server cleaned up after itself
            except OSError:
                pass  # not ours to remove
    closed = True
    if host is not None and port is not None:
        close_deadline = time.monotonic() + 5
        closed = not port_open(host, port)
        while not closed and time.monotonic() < close_deadline:
            time.sleep(0.1)
            closed = not port_open(host, port)
    return Teardown(pids_signalled=sorted(set(signalled)), pids_killed=sorted(killed),
                    survivors=sorted(survivors), port_closed=closed, shm_removed=removed, grace_s=grace_s,
                    duration_s=round(time.monotonic() - started, 3), exited_in_grace=exited_in_grace)


def _wait_tree(tree: dict[int, int], root_pid: int, session_id: int | None, not_before_ticks: int,
               reap: subprocess.Popen | None, deadline: float, *, signal_new: bool = False) -> dict[int, int]:
    """Wait until every process of the tree (re-read as it goes) exits or the deadline passes; what is left."""
    while True:
        if reap is not None:
            reap.poll()
        for pid, ticks in process_tree(root_pid, session_id, not_before_ticks).items():
            if pid not in tree:
                tree[pid] = ticks
                if signal_new:
                    _signal_tree({pid: ticks}, signal.SIGTERM)
        left = {pid: t for pid, t in tree.items() if is_running(pid, t)}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


# ---- readiness ---------------------------------------------------------------------------------

def _auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _get(url: str, timeout_s: float, api_key: str | None = None) -> tuple[int, bytes]:
    try:
        with _OPENER.open(urllib.request.Request(url, headers=_auth_headers(api_key)), timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_healthy(base_url: str, timeout_s: float = 5, api_key: str | None = None) -> bool:
    try:
        status, _ = _get(f"{base_url}/health", timeout_s, api_key)
    except (OSError, ValueError):
        return False
    return status == 200


def _probe_once(base_url: str, served_model_name: str, probe_request: bool, timeout_s: float,
               api_key: str | None = None) -> str | None:
    """None when ready, else what is not ready yet (for the timeout message). With the server's API
    key every request carries it, as a client's would."""
    try:
        status, _ = _get(f"{base_url}/health", timeout_s, api_key)
        if status != 200:
            return f"/health answered {status}"
        status, body = _get(f"{base_url}/v1/models", timeout_s, api_key)
        if status != 200:
            return f"/v1/models answered {status}"
        models = [m.get("id") for m in json.loads(body).get("data", [])]
        if served_model_name not in models:
            return f"/v1/models lists {models}, not {served_model_name!r}"
        if not probe_request:
            return None
        payload = json.dumps({"model": served_model_name, "max_tokens": 1, "stream": False,
                              "messages": [{"role": "user", "content": "Hello"}]}).encode()
        req = urllib.request.Request(f"{base_url}/v1/chat/completions", data=payload,
                                     headers={"Content-Type": "application/json", **_auth_headers(api_key)})
        try:
            with _OPENER.open(req, timeout=timeout_s) as resp:
                status, body = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read()
        if status != 200:
            return f"probe chat completion answered {status}: {body[:200].decode(errors='replace')}"
        if not json.loads(body).get("choices"):
            return "probe chat completion returned no choices"
        return None
    except (OSError, ValueError, AttributeError) as exc:
        return f"{type(exc).__name__}: {exc}"


# ---- one server process ------------------------------------------------------------------------

def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


class LogPump(threading.Thread):
    """Copies a server's output into its log line by line, secrets masked before they are written
    (vLLM prints its non-default arguments, an API key among them in older releases)."""

    def __init__(self, stream: IO[bytes], log_path: Path):
        super().__init__(name=f"log-pump:{log_path.name}", daemon=True)
        self.stream, self.log_path = stream, log_path

    def run(self) -> None:
        with self.log_path.open("ab") as log:
            for raw in iter(self.stream.readline, b""):
                log.write(redact_text(raw.decode("utf-8", errors="replace")).encode("utf-8"))
                log.flush()
        self.stream.close()


class ServerProcess:
    """The subprocess of one server start, its identity, and its teardown."""

    def __init__(self, spec: ServerSpec, host: str, port: int, popen: subprocess.Popen, argv: list[str],
                 pump: LogPump | None = None):
        self.spec = spec
        self.host = host
        self.port = port
        self.popen = popen
        self.argv = argv  # what runs (without the parent-death wrapper)
        self.pump = pump
        self.pid = popen.pid
        info = proc_info(popen.pid)
        self.start_ticks = info.start_ticks if info else 0
        self.pidfile: Path | None = None  # set by reaper.track(); removed after a clean stop
        self.teardown: Teardown | None = None

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @classmethod
    def start(cls, spec: ServerSpec, host: str, port: int) -> ServerProcess:
        """Spawn in a new session (own process group), dying with its starter, output appended
        (redacted) to spec.log_path."""
        argv = fill_placeholders(spec.argv, host=host, port=port)
        log_path = Path(spec.log_path)
        if port_open("127.0.0.1" if host in ("0.0.0.0", "") else host, port):
            # another server there would answer our readiness probes in this one's place
            raise ServerStartError(spec.name, f"port {port} on {host} is already in use by another process",
                                   log_path, [])
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **spec.env}
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with log_path.open("ab") as log:
            marker = f"===== harness: start {spec.name} at {stamp} on {host}:{port}: " \
                     f"{' '.join(redact_argv(argv))} =====\n"
            log.write(marker.encode())
            log.flush()
        if shutil.which(argv[0], path=env.get("PATH")) is None:
            raise ServerStartError(spec.name, f"cannot run {argv[0]!r}: [Errno 2] No such file or directory",
                                   log_path, read_log_tail(log_path))
        try:
            popen = subprocess.Popen(die_with_parent(argv, niceness=SERVER_NICENESS), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        except OSError as exc:
            raise ServerStartError(spec.name, f"cannot run {argv[0]!r}: {exc}", log_path,
                                   read_log_tail(log_path)) from exc
        pump = LogPump(popen.stdout, log_path)
        pump.start()
        return cls(spec, host, port, popen, argv, pump)

    def _drain_log(self, timeout_s: float = 2.0) -> None:
        """Let the log pump write what the process printed before it exited."""
        if self.pump is not None and self.popen.poll() is not None:
            self.pump.join(timeout_s)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_ready(self) -> None:
        """Poll until ready; stop waiting at once if the process exits. Raises ServerStartError."""
        deadline = time.monotonic() + self.spec.ready_timeout_s
        last = "no answer yet"
        while True:
            code = self.popen.poll()
            if code is not None:
                raise self.start_error(f"{_describe_exit(code)} before it was ready")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self.start_error(f"not ready after {self.spec.ready_timeout_s:g} s ({last})")
            not_ready = _probe_once(self.base_url, self.spec.served_model_name,
                                   self.spec.ready_probe_request, timeout_s=max(0.5, min(remaining, 60)),
                                   api_key=self.spec.api_key)
            if not_ready is None:
                if self.popen.poll() is None:
                    return
                continue  # answered, then died: report the exit
            last = not_ready
            time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))

    def start_error(self, reason: str) -> ServerStartError:
        self._drain_log()
        return ServerStartError(self.spec.name, reason, self.spec.log_path, read_log_tail(self.spec.log_path))

    def stop(self, grace_s: float | None = None) -> Teardown:
        """Stop the whole tree (idempotent), giving the server its spec's grace unless told otherwise; the
        pidfile goes only when nothing survived."""
        if self.teardown is not None and self.teardown.clean:
            return self.teardown
        grace = self.spec.stop_grace_s if grace_s is None else grace_s
        self.teardown = terminate_tree(self.pid, session_id=self.pid, not_before_ticks=self.start_ticks,
                                       grace_s=grace, host=self.host, port=self.port, reap=self.popen)
        try:
            self.popen.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        self._drain_log()
        if self.teardown.clean and self.pidfile is not None:
            self.pidfile.unlink(missing_ok=True)
        return self.teardown
