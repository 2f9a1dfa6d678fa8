"""Suite-wide fixtures, order and checks.

- Three tests run at a time (pytest-xdist, pyproject's addopts); a test that measures time on a real engine
  has the machine to itself (tests/machine_share.py).
- Every test that starts a real vLLM server on CPU (marked vllm_server) goes to one worker, which runs
  them one after another, so two vLLM servers never share the two cores and the session's shared sweep
  runs once. The tests that run alone go there too, right behind the shared sweep (which measures alone),
  so the machine is handed from one to the next and the other workers wait for it once; the sweep's other
  readers (the calibration) come after them, beside the other workers' tests.
- Collection order is dispatch order: those tests first, then the other slow tests (the ones that only
  build or import the vLLM environment last among them: the first server test is building it), then the
  rest, so the long work starts early and the short tests fill in beside it.
- The real vLLM-on-CPU sweep runs once per session (tests/cpu_vllm_run.py) and is shared.
- The test run leaves no server or client process behind: every process this session starts
  inherits a marker in its environment, so the check finds this session's leftovers only (not
  another run's on a shared machine), orphans included.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
from cpu_vllm_run import cpu_vllm_run  # noqa: F401  (a session fixture: every module that asks shares one run)
from machine_share import TogetherScheduling, in_xdist_worker, machine, publish_together, remove_session_files

MARKER = "HISPARSE_TEST_SESSION"
os.environ.setdefault(MARKER, uuid.uuid4().hex)
# One build session for every process of this run: an environment whose build failed is not built again
# by the next test that needs it (harness/builds/cached.py); the next test fails at once with the same line.
os.environ.setdefault("HISPARSE_BUILD_SESSION", os.environ[MARKER])
# The suite's processes keep the bytecode of what they import (the harness's own modules: every
# `python -m harness`, simulated server and Ray worker of the suite imports them again), whatever
# PYTHONDONTWRITEBYTECODE says where the suite runs; the environments the harness builds do so anyway
# (harness/builds/locks.py, keep_bytecode).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# Command-line fragments of the processes the harness starts (servers, clients).
HARNESS_CHILDREN = ("evalscope", "serve-sim", "vllm.entrypoints", "fake_openai.py", "harness sweep")


def _matching() -> dict[int, str]:
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            ours = f"{MARKER}={os.environ[MARKER]}".encode() in (entry / "environ").read_bytes()
        except OSError:
            continue
        if ours and state not in ("Z", "X") and any(fragment in cmdline for fragment in HARNESS_CHILDREN):
            found[int(entry.name)] = cmdline.strip()[:200]
    return found


_BEFORE: dict[int, str] = {}


def pytest_collection_modifyitems(config, items):
    def rank(item) -> tuple[int, int]:
        if _runs_shared_sweep(item):
            return 0, 0  # the shared sweep, measured alone in this test's set-up
        if _together(item):
            if item.get_closest_marker("alone"):
                return 0, 1  # alone ones take the machine from the sweep
            # the sweep's other readers measure nothing themselves: after the alone ones, beside other tests
            return 0, 2 if _reads_shared_sweep(item) else 3
        if item.get_closest_marker("cpu_vllm"):
            return 2, 0
        return (1, 0) if item.get_closest_marker("slow") else (3, 0)
    items.sort(key=rank)  # stable: file order within each rank
    if in_xdist_worker():
        publish_together([item.nodeid for item in items if _together(item)])


def _measures_alone(item) -> bool:
    """The test runs alone, or runs the shared sweep, measured alone, in its set-up (it comes first, so an
    exclusive hold passes from it to the tests marked alone)."""
    return item is not None and (item.get_closest_marker("alone") is not None or _runs_shared_sweep(item))


def _reads_shared_sweep(item) -> bool:
    return "cpu_vllm_run" in getattr(item, "fixturenames", ())


def _runs_shared_sweep(item) -> bool:
    """The sweep's own test (marked shared_sweep): it reads the sweep first, so the sweep runs in its set-up.
    A reader runs it instead where that test is not selected; it then holds the machine alone to its end."""
    return _reads_shared_sweep(item) and item.get_closest_marker("shared_sweep") is not None


def _together(item) -> bool:
    return bool(item.get_closest_marker("vllm_server") or item.get_closest_marker("alone"))


def pytest_xdist_make_scheduler(config, log):
    return TogetherScheduling(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with machine(alone=item.get_closest_marker("alone") is not None, keep=_measures_alone(nextitem)):
        yield


def pytest_sessionstart(session):
    _BEFORE.update(_matching())


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller checks once every worker is done, for all of them
    remove_session_files()
    deadline = time.monotonic() + 30  # teardowns of the last tests may still be finishing
    while True:
        left = {pid: cmd for pid, cmd in _matching().items() if pid not in _BEFORE}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"  pid {pid}: {cmd}" for pid, cmd in sorted(left.items())]
        message = "the test run left processes behind:\n" + "\n".join(lines)
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = 1
