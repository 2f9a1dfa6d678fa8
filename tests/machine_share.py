"""Three tests at a time, except where a test measures time on a real engine, and every real vLLM server on
one worker.

The suite runs under pytest-xdist with three workers (pyproject's addopts): most tests wait on servers,
clients and subprocesses, so one test at a time left one of the two cores idle, and two left the machine
idle about a fifth of the time outside the phase that measures alone. A test whose assertions
are timings of a real engine (the shared vLLM-on-CPU sweep the simulator is calibrated against, the
served nights whose performance gate must pass) would measure its neighbour too, so it holds the machine
alone: it takes an exclusive lock that every other test holds shared while it runs.

Every test that starts a real vLLM server on CPU goes to one worker, which runs them one after another: two vLLM
servers never share the two cores, and the session's shared sweep (a session fixture, one per worker)
runs once. xdist's own `loadgroup` does not do it under pytest 9.2 (the group suffix it writes into node
ids no longer reaches its scheduler), so the workers write those node ids to a file at collection and the
scheduler below, given to xdist by conftest, reads them.

A turnstile in front of the lock keeps the exclusive taker from waiting forever: it holds the turnstile
while it waits, so no new test starts beside the ones still running; those finish, it runs alone, then
everything goes on. A fixture that prepares before it measures (the shared sweep builds its environments
first) holds the machine shared and turns the hold exclusive between the two (`alone_from_here`); one whose
timed part ends before its work does turns it back to shared there (`shared_from_here`).

Waiting for the machine costs the other workers their share of it, so the tests that run alone go to the
real-vLLM worker too, right behind the shared sweep (conftest orders them), and an exclusive hold passes
straight to the next test of the same worker when that one runs alone as well (`keep` below): the other
workers wait once for all of them, not once each, and never wait on a long real-vLLM test that holds the
machine shared. Outside xdist (one test at a time, `-p no:xdist` or `-n 0`) nothing is locked.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

TOGETHER = "real-vllm"  # the scope name of the tests that run a real vLLM

def _base() -> Path:
    session = os.environ["HISPARSE_TEST_SESSION"]  # set once by conftest, inherited by every worker
    return Path(tempfile.gettempdir()) / f"hisparse-test-{session}"


def _paths() -> tuple[Path, Path]:
    return _base().with_suffix(".turnstile"), _base().with_suffix(".share")


def publish_together(nodeids: list[str]) -> None:
    """A worker's collection: the node ids that must run on one worker (every worker writes the same)."""
    staged = _base().with_suffix(f".together.{os.getpid()}")
    staged.write_text(json.dumps(sorted(nodeids)), encoding="utf-8")
    staged.rename(_base().with_suffix(".together"))


class TogetherScheduling(LoadScopeScheduling):
    """xdist's load scheduling, one test a unit, except the published tests: one unit, sent first (xdist
    orders units by size)."""

    _together: frozenset[str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._together is None:  # read once the workers have collected (scheduling starts after)
            path = _base().with_suffix(".together")
            self._together = frozenset(json.loads(path.read_text(encoding="utf-8"))) if path.exists() else frozenset()
        return TOGETHER if nodeid in self._together else nodeid


def in_xdist_worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


class _Hold:
    """This worker's hold on the machine: the share lock's open file, and whether the hold is exclusive (one
    test at a time per worker; an exclusive hold may pass from one test to the next)."""

    file = None
    exclusive = False


_hold = _Hold()


@contextmanager
def machine(*, alone: bool, keep: bool = False) -> Iterator[float]:
    """Hold the machine shared (alone=False) or to this test alone, from its first fixture's set-up to its
    last teardown; yields the seconds spent waiting for it. keep: the next test on this worker measures
    alone too, so an exclusive hold is handed to it instead of let go (it finds the hold and takes nothing)."""
    if not in_xdist_worker():
        yield 0.0
        return
    started = time.monotonic()
    if not _hold.exclusive:  # else handed on by the previous test
        _take(fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    try:
        yield time.monotonic() - started
    finally:
        if not (keep and _hold.exclusive):
            fcntl.flock(_hold.file, fcntl.LOCK_UN)
            _hold.file.close()
            _hold.file, _hold.exclusive = None, False


def _take(mode: int) -> None:
    if _hold.file is None:
        _hold.file = open(_paths()[1], "a")  # noqa: SIM115  (may be held across tests)
    with open(_paths()[0], "a") as turnstile:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(_hold.file, mode)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
    _hold.exclusive = mode == fcntl.LOCK_EX


def alone_from_here() -> None:
    """The running test has the machine to itself from now to its end: a fixture whose set-up prepares in
    parallel with other tests (builds an environment) and then measures calls this between the two."""
    if _hold.file is None or _hold.exclusive:
        return  # outside xdist nothing is locked; an exclusive hold is already this test's
    # Let go first, then queue like any test that runs alone: waiting at the turnstile while holding the
    # share would deadlock with an alone test that holds the turnstile and waits for that share.
    fcntl.flock(_hold.file, fcntl.LOCK_UN)
    _take(fcntl.LOCK_EX)


def shared_from_here() -> None:
    """The running test has stopped measuring: other tests may run beside it again, to its end (a fixture
    whose later work asserts no timing calls this once its timed part is over)."""
    if _hold.file is None or not _hold.exclusive:
        return  # outside xdist nothing is locked; a shared hold is shared already
    fcntl.flock(_hold.file, fcntl.LOCK_SH)  # a conversion: the tests waiting for a share start now
    _hold.exclusive = False


def remove_session_files() -> None:
    for path in (*_paths(), _base().with_suffix(".together")):
        path.unlink(missing_ok=True)
