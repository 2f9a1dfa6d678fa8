"""The suite's own machine sharing (tests/machine_share.py), with real locks between real processes: a test
that measures alone keeps every other test out until it hands the machine back, and no longer."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# One worker: it takes the machine alone, says so, waits for "share", hands it back with shared_from_here,
# says so (with the time it began to), waits for "end", lets go.
MEASURER = """
import sys, time
from machine_share import alone_from_here, machine, shared_from_here
with machine(alone=False):
    alone_from_here()
    print("alone", time.monotonic(), flush=True)
    sys.stdin.readline()
    sharing_from = time.monotonic()  # before the hand-back: a neighbour may run before this process prints
    shared_from_here()
    print("shared", sharing_from, flush=True)
    sys.stdin.readline()
"""
# Another worker's ordinary test: it says when it got the machine.
NEIGHBOUR = """
import time
from machine_share import machine
with machine(alone=False):
    print("got", time.monotonic(), flush=True)
"""


def _worker(code: str, env: dict[str, str], name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], cwd=TESTS, env={**env, "PYTEST_XDIST_WORKER": name},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _said(proc: subprocess.Popen, word: str, within_s: float = 30.0) -> float:
    ready, _, _ = select.select([proc.stdout], [], [], within_s)
    assert ready, f"nothing said within {within_s:.0f} s (waiting for {word!r})"
    line = proc.stdout.readline().split()
    assert line and line[0] == word, line
    return float(line[1])


def test_a_test_that_stops_measuring_lets_the_others_in_before_it_ends():
    session = f"share-{uuid.uuid4().hex[:12]}"  # its own lock files, not the running suite's
    env = {**os.environ, "HISPARSE_TEST_SESSION": session, "PYTHONPATH": str(TESTS)}
    measurer = _worker(MEASURER, env, "gw0")
    neighbour = None
    try:
        _said(measurer, "alone")
        neighbour = _worker(NEIGHBOUR, env, "gw1")
        time.sleep(1.0)
        assert neighbour.poll() is None  # kept out while the measurer measures
        measurer.stdin.write("share\n")
        measurer.stdin.flush()
        shared_at = _said(measurer, "shared")
        got_at = _said(neighbour, "got", within_s=10.0)
        assert got_at >= shared_at
        assert neighbour.wait(timeout=30) == 0
        assert measurer.poll() is None  # in before the measurer's test ended
        measurer.stdin.write("end\n")
        measurer.stdin.flush()
        assert measurer.wait(timeout=30) == 0
    finally:
        for proc in (measurer, neighbour):
            if proc is not None and proc.poll() is None:
                proc.kill()
        for path in Path(tempfile.gettempdir()).glob(f"hisparse-test-{session}.*"):  # its lock files
            path.unlink()
