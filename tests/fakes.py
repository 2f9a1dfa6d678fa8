"""In-process stand-ins for the runner's two collaborators, implementing the same interfaces as the
real ones (harness.servers.base.Launcher / ServerHandle, harness.loadgen.LoadGenerator), so that the
runner's policy (retries, stop/continue, status, resume, interrupts) is tested in seconds. The
end-to-end tests (test_sweep.py, test_cpu_vllm.py) run the real ones."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.loadgen import LoadGenerator, LoadRun
from harness.records import EvalScopeSummary
from harness.servers.base import Launcher, ServerHandle, ServerSpec, ServerStartError

CLOSED_PORT = 9  # discard: nothing listens on 127.0.0.1, so scrapes fail at once


class FakeHandle(ServerHandle):
    def __init__(self, spec: ServerSpec, launcher: FakeLauncher):
        self.name, self.host, self.port, self.pid = spec.name, "127.0.0.1", CLOSED_PORT, 0
        self.node_id, self.log_path, self.cuda_visible_devices = None, Path(spec.log_path), None
        self._launcher = launcher
        self.dead = False

    def healthy(self, timeout_s: float = 5) -> bool:
        return not self.dead

    def alive(self) -> bool:
        return not self.dead

    def log_tail(self, n: int = 50) -> list[str]:
        return [f"fake server {self.name}: log line"]

    def stop(self, grace_s: float = 15) -> None:
        self.dead = True
        self._launcher._forget(self)


class FakeLauncher(Launcher):
    """Starts FakeHandles; `nodes` servers at once; `fail_start` names deployments that never start."""

    def __init__(self, nodes: int = 1, fail_start: set[str] | None = None):
        super().__init__()
        self.nodes, self.fail_start = nodes, fail_start or set()
        self.started: list[str] = []

    def start(self, spec: ServerSpec) -> FakeHandle:
        if not self.accepting:
            raise ServerStartError(spec.name, "not started: the harness is shutting down", spec.log_path, [])
        if spec.name in self.fail_start:
            raise ServerStartError(spec.name, "exited with code 1 before it was ready", spec.log_path,
                                   ["RuntimeError: no GPU"])
        handle = FakeHandle(spec, self)
        with self._lock:
            self._handles.append(handle)
            self.started.append(spec.name)
        return handle

    def nodes_for(self, gpus: int) -> int:
        return self.nodes


@dataclass
class FakeLoadGenerator(LoadGenerator):
    """Every run succeeds unless `outcome(deployment-c<parallel>, attempt)` says otherwise:
    "fail" (EvalScope exits 1), "partial" (one request failed), "interrupt" (Ctrl-C during the run)."""

    outcome: Callable[[str, int], str] = lambda name, attempt: "ok"
    calls: list[str] = field(default_factory=list)

    def __post_init__(self):
        LoadGenerator.__init__(self)

    def run(self, argv: list[str], log_path: Path, timeout_s: float, should_stop=None) -> LoadRun:
        name = argv[argv.index("--name") + 1]
        attempt = sum(1 for c in self.calls if c == name) + 1
        self.calls.append(name)
        outputs = Path(argv[argv.index("--outputs-dir") + 1])
        parallel, number = argv[argv.index("--parallel") + 1], argv[argv.index("--number") + 1]
        summary_dir = outputs / name / f"parallel_{parallel}_number_{number}"
        summary_dir.mkdir(parents=True, exist_ok=True)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("fake load generator\n")
        what = self.outcome(name, attempt)
        if what == "interrupt":
            raise KeyboardInterrupt
        if what == "fail":
            return LoadRun(returncode=1, wall_s=0.01, stdout_path=log_path, timed_out=False)
        (summary_dir / "ok").write_text(f"{number} {1 if what == 'partial' else 0}")
        return LoadRun(returncode=0, wall_s=0.01, stdout_path=log_path, timed_out=False)

    def read_summary(self, run_summary_dir: Path) -> EvalScopeSummary | None:
        marker = run_summary_dir / "ok"
        if not marker.exists():
            return None
        n, failed = map(int, marker.read_text().split())
        return EvalScopeSummary(total_requests=n, success_requests=n - failed, failed_requests=failed, mean_tpot_ms=10.0,
                                mean_ttft_ms=100.0, total_throughput_tok_s=1000.0, output_throughput_tok_s=100.0,
                                key_set=">=1.10")
