"""What every launcher shares: the server spec, the handle, the launcher interface, their errors,
and the guard that stops every server when the harness is interrupted."""

from __future__ import annotations

import signal
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.errors import HarnessError, Interrupted
from harness.records import FailureKind, GpuTelemetry
from harness.telemetry import GpuSampler

LOG_TAIL_LINES = 50
# a server's start-up, in lines of its log: vLLM on CPU logs about 60 before it is ready, a TP8 GPU server a few
# hundred; a start that failed logs its traceback within as many again
START_LOG_LINES = 2000
DEFAULT_PID_DIR = Path("~/.cache/hisparse-harness/pids")
# A server's argv may name its port and host before a launcher picks them on the server's node.
PORT_PLACEHOLDER = "{port}"
HOST_PLACEHOLDER = "{host}"
# ... and the model's path, for weights fetched onto each node before the server starts: the path is
# the fetch's, on the node the launcher lands on (ServerSpec.model_paths), known only at run time.
MODEL_PLACEHOLDER = "{model}"
LOCAL_NODE = "local"  # the model_paths key of the local launcher's one node


def fill_placeholders(argv: list[str], *, host: str | None = None, port: int | None = None,
                      model: str | None = None) -> list[str]:
    """argv with the port, host and model placeholders filled where known (left as they are otherwise)."""
    out = []
    for arg in argv:
        if port is not None:
            arg = arg.replace(PORT_PLACEHOLDER, str(port))
        if host is not None:
            arg = arg.replace(HOST_PLACEHOLDER, host)
        if model is not None:
            arg = arg.replace(MODEL_PLACEHOLDER, model)
        out.append(arg)
    return out


# What a server gets to stop when its profile pins no host memory (and a CPU or simulated server).
DEFAULT_STOP_GRACE_S = 15.0

@dataclass(frozen=True)
class PreparedServer:
    """What preparing a node produced: the interpreter to start the server with, and its provenance."""

    python: str | None = None  # the build's interpreter: must be the argv[0] the plan rendered
    provenance: dict = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # added to the server's environment (e.g. kernels)


@dataclass(frozen=True)
class ServerSpec:
    name: str  # deployment name
    argv: list[str]  # may contain the literal "{port}" and "{host}", substituted at start
    env: dict[str, str]  # added to the inherited environment
    host: str  # address the server binds and the harness connects to (127.0.0.1 locally)
    port: int  # 0 = pick a free port on the node at start
    log_path: Path  # server stdout+stderr, appended; every start writes a marker line first
    ready_timeout_s: float
    gpus: int  # GPUs the server needs (Ray: placement group bundle + actor num_gpus)
    served_model_name: str  # must be listed by /v1/models before the server counts as ready
    api_key: str | None = None  # the server's own API key: readiness and health checks send it
    ready_probe_request: bool = True  # readiness also needs one real chat completion (max_tokens 1)
    pid_dir: Path | None = None  # where pidfiles live (None: DEFAULT_PID_DIR)
    # Run on the node that will run the server, before it starts (Ray: inside the actor): makes
    # the server's environment there. Must be picklable (a module-level function or a partial).
    prepare: Callable[[], PreparedServer] | None = None
    # node id (LOCAL_NODE for the local launcher) -> where the weights fetch put the model on that node
    model_paths: dict[str, str] = field(default_factory=dict)
    # how long a stop waits, after SIGTERM to the server, for its tree to exit before signalling the rest:
    # long enough for the engine to unpin its host pools (harness/plan.py `stop_grace_for`)
    stop_grace_s: float = DEFAULT_STOP_GRACE_S

    def resolved_pid_dir(self) -> Path:
        return (self.pid_dir or DEFAULT_PID_DIR).expanduser()

    def needs_model_path(self) -> bool:
        return any(MODEL_PLACEHOLDER in arg for arg in self.argv)

    def on_node(self, node_id: str) -> ServerSpec:
        """This spec with the model placeholder filled for the node the server will run on."""
        if not self.needs_model_path():
            return self
        path = self.model_paths.get(node_id)
        if path is None:
            fetched = ", ".join(sorted(self.model_paths)) or "none"
            raise ServerStartError(self.name, f"the model's weights were not fetched onto node {node_id} "
                                   f"(fetched onto: {fetched}); run `harness fetch` for this launch profile",
                                   self.log_path, [])
        return replace(self, argv=fill_placeholders(self.argv, model=path))


class ServerStartError(HarnessError):
    """The server exited or never became ready. str() is the reason, then the log tail. `failure` is the
    kind its points record (harness/records.py FailureKind)."""

    failure: FailureKind = "infrastructure"

    def __init__(self, name: str, reason: str, log_path: Path, log_tail: list[str]):
        self.name = name
        self.reason = reason
        self.log_path = Path(log_path)
        self.log_tail = list(log_tail)
        super().__init__(self._message())

    def _message(self) -> str:
        head = f"server {self.name!r}: {self.reason}"
        if not self.log_tail:
            return head
        body = "\n".join(f"  | {line}" for line in self.log_tail)
        return f"{head}\n  last {len(self.log_tail)} lines of {self.log_path}:\n{body}"

    def __reduce__(self):  # survive pickling across Ray
        return (type(self), (self.name, self.reason, self.log_path, self.log_tail))


class ServerStopError(HarnessError):
    """Teardown left something behind: a process of the server's tree, or its port still open."""


class LauncherClosed(ServerStartError):
    """start() after the launcher began shutting down (interrupt or close)."""

    def __init__(self, name: str, log_path: Path):
        super().__init__(name, "not started: the harness is shutting down", log_path, [])

    def __reduce__(self):
        return (type(self), (self.name, self.log_path))


class ServerInterrupt(Interrupted):
    """SIGINT or SIGTERM arrived while servers were running; they are stopped on the way out."""


@dataclass(frozen=True)
class Teardown:
    """What stopping a process tree did, so the caller can prove nothing survived."""

    pids_signalled: list[int] = field(default_factory=list)
    pids_killed: list[int] = field(default_factory=list)  # needed SIGKILL after the grace period
    survivors: list[int] = field(default_factory=list)
    port_closed: bool = True
    shm_removed: list[str] = field(default_factory=list)
    grace_s: float = 0.0  # how long the server was given after SIGTERM before the rest was signalled
    duration_s: float = 0.0  # from the first SIGTERM to nothing left (or to giving up)
    exited_in_grace: bool = True  # the whole tree exited within the grace, on the server's own SIGTERM

    @property
    def clean(self) -> bool:
        return not self.survivors and self.port_closed

    def problem(self) -> str:
        parts = []
        if self.survivors:
            parts.append(f"processes still alive after SIGKILL: {self.survivors}")
        if not self.port_closed:
            parts.append("port still accepts connections")
        return "; ".join(parts)


def read_log_tail(path: Path, n: int = LOG_TAIL_LINES) -> list[str]:
    """The last n lines of a log file, read from its end (server logs grow to GBs)."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            block = 64 * 1024
            data = b""
            pos = size
            while pos > 0 and data.count(b"\n") <= n:
                step = min(block, pos)
                pos -= step
                fh.seek(pos)
                data = fh.read(step) + data
    except FileNotFoundError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return list(deque(lines, maxlen=n))


def read_log_head(path: Path, n: int = START_LOG_LINES) -> list[str]:
    """The first n lines of a log file: a server's start-up (its KV size and logged bounds are there, however
    long it ran afterwards)."""
    lines: list[str] = []
    try:
        with Path(path).open("rb") as fh:
            for raw in fh:
                lines.append(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
                if len(lines) >= n:
                    break
    except FileNotFoundError:
        return []
    return lines


class ServerHandle(ABC):
    """One running server, however it was started."""

    name: str
    host: str
    port: int
    pid: int
    node_id: str | None
    log_path: Path
    cuda_visible_devices: str | None
    build_provenance: dict | None = None  # set where the server's node prepared its own build
    model_path: str | None = None  # the fetched model the server loads (its node's copy), if fetched
    api_key: str | None = None  # what clients of this server must send (readiness, health, scrapes, load)
    pidfile: str | None = None  # where the server's pidfile lies, on its node

    def sync_log(self) -> None:  # noqa: B027  (a hook: only handles of servers on other nodes act)
        """Bring log_path up to date where the server logs elsewhere (another node); else nothing."""

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @abstractmethod
    def healthy(self, timeout_s: float = 5) -> bool:
        """/health answers 200 now."""

    @abstractmethod
    def alive(self) -> bool:
        """The server process has not exited."""

    def log_tail(self, n: int = LOG_TAIL_LINES) -> list[str]:
        return read_log_tail(self.log_path, n)

    def start_gpu_telemetry(self, out_path: Path, interval_s: float) -> None:
        """Sample the server's GPUs into `out_path` (gpu.jsonl) from the process that owns the server:
        here, for a server this process started; the Ray handle asks its actor on the server's node."""
        self._gpu_sampler = GpuSampler(out_path, interval_s, self.cuda_visible_devices).start()

    def stop_gpu_telemetry(self) -> GpuTelemetry:
        sampler, self._gpu_sampler = getattr(self, "_gpu_sampler", None), None
        return sampler.stop() if sampler is not None else GpuTelemetry(reason="not sampled")

    stop_grace_s: float = DEFAULT_STOP_GRACE_S  # the spec's: what stop() waits when given no grace
    last_teardown: Teardown | None = None

    @abstractmethod
    def stop(self, grace_s: float | None = None) -> Teardown | None:
        """TERM the server, wait its grace (the spec's unless given) for the tree to exit, then TERM and
        KILL what is left; the teardown (None if nothing was running); raises ServerStopError if anything
        survives."""


class Launcher(ABC):
    """Starts servers and remembers them until they are stopped; `with launcher:` stops them all.

    Safe to call start() from several threads (one deployment per node).
    """

    _accepting: bool = True

    def __init__(self, reaper: Callable[[Path], list] | None = None):
        self.reaped: list = []  # ReapedServer records of servers killed harnesses left behind
        self._reaper = reaper  # reaper.reap_stale_servers, given by launchers that track pidfiles
        self._handles: list[ServerHandle] = []
        self._reaped_dirs: set[Path] = set()
        self._lock = threading.Lock()

    def _reap_once(self, pid_dir: Path) -> None:
        """Before the first server in a pid dir: stop leftovers of harnesses that were killed."""
        if self._reaper is None:
            return
        with self._lock:
            if pid_dir in self._reaped_dirs:
                return
            self._reaped_dirs.add(pid_dir)
            self.reaped.extend(self._reaper(pid_dir))

    @property
    def accepting(self) -> bool:
        return self._accepting

    def stop_accepting(self) -> None:
        """From now on start() refuses; a start racing with this stops its own server and fails."""
        self._accepting = False

    @abstractmethod
    def start(self, spec: ServerSpec) -> ServerHandle:
        """Blocks until the server is ready; raises ServerStartError on early exit or timeout."""

    def _forget(self, handle: ServerHandle) -> None:
        with self._lock:
            if handle in self._handles:
                self._handles.remove(handle)

    def running(self) -> list[ServerHandle]:
        with self._lock:
            return list(self._handles)

    def stop_all(self) -> None:
        """Stop every server this launcher started and has not stopped yet (newest first)."""
        problems = []
        for handle in reversed(self.running()):
            try:
                handle.stop()
            except ServerStopError as exc:
                problems.append(str(exc))
        if problems:
            raise ServerStopError("; ".join(problems))

    def close(self) -> None:
        self.stop_accepting()
        self.stop_all()

    @abstractmethod
    def nodes_for(self, gpus: int) -> int:
        """How many servers needing `gpus` GPUs can run at once."""

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def stop_servers_on_signal(launcher: Launcher) -> Iterator[Launcher]:
    """Turn SIGINT/SIGTERM into ServerInterrupt, and stop every server of `launcher` on the way out.

    The handler only raises: stopping happens in `finally`, on the main thread, outside whatever
    the launcher was doing when the signal came. Further signals are ignored while stopping so a
    second Ctrl-C cannot leave half the servers running. Inside ray.get() Ray re-raises the
    handler's exception as a plain KeyboardInterrupt: catch KeyboardInterrupt, not ServerInterrupt.
    """
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = {}
    if on_main_thread:
        def _raise(signum, _frame):
            raise ServerInterrupt(signum)

        for signum in _STOP_SIGNALS:
            previous[signum] = signal.signal(signum, _raise)
    try:
        yield launcher
    except BaseException:
        # other threads may be starting servers right now: none may come up after stop_all
        launcher.stop_accepting()
        raise
    finally:
        if on_main_thread:
            for signum in _STOP_SIGNALS:
                signal.signal(signum, signal.SIG_IGN)
        try:
            launcher.stop_all()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

