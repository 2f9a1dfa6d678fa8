"""One EvalScope `perf` invocation per point: its command, its run, where its summary lands.

Each attempt gets a fresh output folder: EvalScope fails when it reuses one with
`--no-timestamp` (FACTS.md §6). The offset is always explicit, so a point never
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
from harness.launch.vllm import compact_json


@dataclass(frozen=True)
class LoadPoint:
    """What one EvalScope run must do: the point, its offset, where it writes."""

    model: str
    url: str  # .../v1/chat/completions
    dataset_path: Path
    parallel: int
    number: int
    dataset_offset: int
    name: str
    outputs_dir: Path


def evalscope_program() -> list[str]:
    # The console script beside this interpreter, so the harness's own EvalScope runs
    # even when PATH points elsewhere; the module form where no script is installed.
    script = Path(sys.executable).with_name("evalscope")
    if script.exists():
        return [str(script)]
    found = shutil.which("evalscope")
    return [found] if found else [sys.executable, "-m", "evalscope.cli.cli"]


def evalscope_argv(point: LoadPoint, client: ClientSettings, program: list[str] | None = None) -> list[str]:
    argv = list(program or ["evalscope"]) + [
        "perf",
        "--model", point.model,
        "--url", point.url,
        "--api", client.api,
        "--dataset", client.dataset,
        "--dataset-path", str(point.dataset_path),
        "--dataset-offset", str(point.dataset_offset),
        "--max-tokens", str(client.max_tokens),
    ]
    if client.multi_turn:
        argv.append("--multi-turn")
    argv += ["--number", str(point.number), "--parallel", str(point.parallel)]
    if client.extra_args:
        argv += ["--extra-args", compact_json(client.extra_args)]
    argv += ["--name", point.name, "--outputs-dir", str(point.outputs_dir), "--no-timestamp"]
    return argv + list(client.evalscope_args)


def summary_dir(point: LoadPoint) -> Path:
    """Where EvalScope writes this run's benchmark_summary.json."""
    return point.outputs_dir / point.name / f"parallel_{point.parallel}_number_{point.number}"


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
