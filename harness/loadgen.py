"""One EvalScope `perf` invocation per point: its command, its run, where its summary lands.

Each attempt gets a fresh output folder: EvalScope fails when it reuses one with
`--no-timestamp` (docs/facts.md §6). The offset is always explicit, so a point never
depends on EvalScope's own offset bookkeeping between runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.config import ClientSettings
from harness.io import compact_json, package_version
from harness.metrics.evalscope_summary import parse_summary
from harness.records import EvalScopeSummary

BASE_URL_PLACEHOLDER = "{base_url}"
DATASET_PLACEHOLDER = "{dataset}"
OUTPUTS_PLACEHOLDER = "{outputs}"


@dataclass(frozen=True)
class ClientPlan:
    """Which EvalScope the points run: its command prefix and version (resolved once, by the plan)."""

    program: tuple[str, ...]
    version: str | None
    source: str  # "harness" (the harness's own environment) or the pinned spec it was built from


def evalscope_program() -> list[str]:
    # The console script beside this interpreter, so the harness's own EvalScope runs
    # even when PATH points elsewhere; the module form where no script is installed.
    script = Path(sys.executable).with_name("evalscope")
    if script.exists():
        return [str(script)]
    found = shutil.which("evalscope")
    return [found] if found else [sys.executable, "-m", "evalscope.cli.cli"]


def resolve_client(client: ClientSettings) -> ClientPlan:
    return ClientPlan(program=tuple(evalscope_program()), version=package_version("evalscope"), source="harness")


def client_argv_template(plan: ClientPlan, client: ClientSettings, *, model: str, parallel: int, number: int,
                         dataset_offset: int, name: str) -> list[str]:
    """One point's EvalScope argv, with the server URL, dataset path and output folder left as
    placeholders that only a run knows (fill_client_argv)."""
    argv = list(plan.program) + [
        "perf",
        "--model", model,
        "--url", f"{BASE_URL_PLACEHOLDER}/v1/chat/completions",
        "--api", client.api,
        "--dataset", client.dataset,
        "--dataset-path", DATASET_PLACEHOLDER,
        "--dataset-offset", str(dataset_offset),
        "--max-tokens", str(client.max_tokens),
    ]
    if client.multi_turn:
        argv.append("--multi-turn")
    argv += ["--number", str(number), "--parallel", str(parallel)]
    if client.extra_args:
        argv += ["--extra-args", compact_json(client.extra_args)]
    argv += ["--name", name, "--outputs-dir", OUTPUTS_PLACEHOLDER, "--no-timestamp"]
    return argv + list(client.evalscope_args)


def fill_client_argv(template: tuple[str, ...] | list[str], *, base_url: str, dataset_path: Path,
                     outputs_dir: Path) -> list[str]:
    values = {BASE_URL_PLACEHOLDER: base_url.rstrip("/"), DATASET_PLACEHOLDER: str(dataset_path),
              OUTPUTS_PLACEHOLDER: str(outputs_dir)}
    out = []
    for arg in template:
        for placeholder, value in values.items():
            arg = arg.replace(placeholder, value)
        out.append(arg)
    return out


def summary_dir(outputs_dir: Path, name: str, parallel: int, number: int) -> Path:
    """Where EvalScope writes one run's benchmark_summary.json."""
    return outputs_dir / name / f"parallel_{parallel}_number_{number}"


@dataclass(frozen=True)
class LoadRun:
    returncode: int
    wall_s: float
    stdout_path: Path
    timed_out: bool
    interrupted: bool = False


def run_evalscope(argv: list[str], log_path: Path, timeout_s: float,
                  should_stop: Callable[[], bool] | None = None) -> LoadRun:
    """Run one EvalScope process to completion, its output into `log_path`.

    `should_stop()` is polled: when it turns true (the server died), EvalScope is
    stopped rather than left to time out request by request.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    start = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
        timed_out = interrupted = False
        try:
            while proc.poll() is None:
                if time.monotonic() - start > timeout_s:
                    timed_out = True
                    break
                if should_stop is not None and should_stop():
                    interrupted = True
                    break
                try:
                    proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            if proc.poll() is None:
                _stop_group(proc)
    return LoadRun(returncode=proc.returncode if proc.returncode is not None else -1,
                   wall_s=time.monotonic() - start, stdout_path=log_path,
                   timed_out=timed_out, interrupted=interrupted)


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


class LoadGenerator:
    """What the runner asks of a load generator: run one point's command, read its summary.

    EvalScope is the real one; tests pass in-process fakes with the same two methods.
    """

    def run(self, argv: list[str], log_path: Path, timeout_s: float,
            should_stop: Callable[[], bool] | None = None) -> LoadRun:
        return run_evalscope(argv, log_path, timeout_s, should_stop)

    def read_summary(self, run_summary_dir: Path) -> EvalScopeSummary | None:
        """The run's summary; None where it wrote none; HarnessError where it is unreadable."""
        path = run_summary_dir / "benchmark_summary.json"
        if not path.exists():
            return None
        return parse_summary(path)
