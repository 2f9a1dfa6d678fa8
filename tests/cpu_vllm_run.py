"""One real run of sweeps/cpu-vllm.yaml per test session, shared by every test that needs it (the sweep
itself in test_cpu_vllm.py, the calibration against it in test_calibrate_cpu_vllm.py): vLLM on 2 CPU cores
is the slowest thing the suite does, so it runs once. tests/conftest.py makes the fixture visible."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from machine_share import alone_from_here, shared_from_here

ROOT = Path(__file__).resolve().parents[1]
VLLM_MARKS = ("vllm.entrypoints", "EngineCore", "VLLM::")
RUN_ID = "cpu"
# The server whose points the simulator is fitted on and whose held-out timings are asserted
# (tests/test_calibrate_cpu_vllm.py): the sweep runs it first, alone; the second server (the pressured arm,
# held to its preemptions and occupancy, not its timing) runs beside other tests.
TIMED_DEPLOYMENT = "cpu-baseline"
LAST_TIMED_POINT = "c8"


def vllm_processes() -> list[tuple[int, str]]:
    """Every live process that is part of a vLLM server (API server, engine core, workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            comm = (entry / "comm").read_text().strip()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(mark in cmdline or mark in comm for mark in VLLM_MARKS):
            found.append((int(entry.name), (comm + " " + cmdline)[:160]))
    return found


@dataclass(frozen=True)
class CpuVllmRun:
    run_dir: Path
    results_root: Path
    done: subprocess.CompletedProcess
    wall_s: float
    before: frozenset[int]   # vLLM processes that were not ours (another run) when the sweep started
    load_avg: tuple[float, float]  # 1-minute load average before and after: the machine's share of the noise


@pytest.fixture(scope="session")
def cpu_vllm_run(tmp_path_factory: pytest.TempPathFactory) -> CpuVllmRun:
    results = tmp_path_factory.mktemp("cpu-vllm") / "results"
    # The environments first, beside other tests; then the sweep, with the machine to itself
    # (tests/machine_share.py) while the server whose timings the simulator is calibrated against and held to
    # runs, beside other tests again from when it stops. A failed build shows in the sweep's output.
    built = subprocess.run([sys.executable, "-m", "harness", "build", "sweeps/cpu-vllm.yaml"],
                           capture_output=True, text=True, cwd=ROOT, timeout=1140)
    print(built.stdout[-2000:], built.stderr[-2000:])
    alone_from_here()
    before = frozenset(pid for pid, _ in vllm_processes())
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    done = _sweep_alone_until_timed_server_stops(
        [sys.executable, "-m", "harness", "sweep", "sweeps/cpu-vllm.yaml", "--run-id", RUN_ID,
         "--results-dir", str(results), "--launcher", "ray"], timeout_s=1140)
    wall_s = time.monotonic() - started
    print(done.stdout[-4000:], f"\nsweep wall time {wall_s:.0f}s")
    return CpuVllmRun(run_dir=results / RUN_ID, results_root=results, done=done, wall_s=wall_s, before=before,
                      load_avg=(load_before, os.getloadavg()[0]))


def _sweep_alone_until_timed_server_stops(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """Run the sweep, reading its progress lines (`[HH:MM:SS] message`) as they come; the machine goes back to
    the other tests once the timed server has run its last point and stopped. Otherwise subprocess.run with
    capture_output and a timeout."""
    last_point = re.compile(rf"^\[[\d:]+\] {TIMED_DEPLOYMENT}: {LAST_TIMED_POINT} ok in ")
    stopped = re.compile(rf"^\[[\d:]+\] {TIMED_DEPLOYMENT}: server stopped in ")
    lines: list[str] = []
    timed_points_done = False
    with tempfile.TemporaryFile("w+") as stderr, \
            subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True) as proc:
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            proc.kill()

        watchdog = threading.Timer(timeout_s, kill)
        watchdog.start()
        try:
            for line in proc.stdout:
                lines.append(line)
                timed_points_done = timed_points_done or bool(last_point.match(line))
                if timed_points_done and stopped.match(line):
                    shared_from_here()
            proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:  # this fixture failed while the sweep ran: leave nothing behind
                proc.kill()
        stderr.seek(0)
        if timed_out.is_set():
            raise subprocess.TimeoutExpired(args, timeout_s, "".join(lines), stderr.read())
        return subprocess.CompletedProcess(args, proc.returncode, "".join(lines), stderr.read())
