"""Something built once into a cache folder and reused after: found by a marker written last, or built
in a temporary folder beside its final place and renamed into it, so a half-built folder is never used.
One builder at a time: a second harness waits on the lock, then finds the first one's result.

A build that fails is remembered beside the folder, with the build session it failed in
(HISPARSE_BUILD_SESSION, which the test suite sets once for all its processes): another attempt in the
same session fails at once with the same line instead of spending minutes on the same failure. Outside a
session (a person retrying), every attempt builds again.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from harness.errors import HarnessError

T = TypeVar("T")

SESSION_ENV = "HISPARSE_BUILD_SESSION"


class RememberedBuildFailure(HarnessError):
    """This session already tried the build and it failed: the first failure's line, not another build."""


def build_log_path(final: Path) -> Path:
    """Where the build of `final` logs: beside it, so the log of a failed build stays to be read (a
    successful build moves it inside)."""
    return final.parent / f"{final.name}.build.log"


def _failure_path(final: Path) -> Path:
    return final.parent / f".{final.name}.failed.json"


def _remembered(final: Path) -> str | None:
    session = os.environ.get(SESSION_ENV)
    if not session:
        return None
    try:
        data = json.loads(_failure_path(final).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data.get("message") if data.get("session") == session else None


def build_once(final: Path, *, find: Callable[[], T | None], build: Callable[[Path], T]) -> tuple[T, bool]:
    """(the cached thing at `final`, whether this call built it). `find()` returns it where its marker
    is there; `build(tmp)` makes it in `tmp` (marker last) and returns it; the folder is then renamed."""
    root = final.parent
    found = find()
    if found is not None:
        return found, False
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = find()
        if found is not None:
            return found, False
        earlier = _remembered(final)
        if earlier is not None:
            raise RememberedBuildFailure(f"{earlier} (failed earlier in this session; not built again)")
        if final.exists():  # no marker: not ours or broken; never built in place, so clear it
            shutil.rmtree(final)
        for stale in root.glob(f".tmp-{final.name}-*"):  # left by a killed build
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
        try:
            made = build(tmp)
            tmp.chmod(0o755)  # mkdtemp makes it private; servers of other users read it too
            tmp.rename(final)
        except HarnessError as exc:
            record = {"message": str(exc), "session": os.environ.get(SESSION_ENV), "time": time.time()}
            _failure_path(final).write_text(json.dumps(record) + "\n", encoding="utf-8")
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    _failure_path(final).unlink(missing_ok=True)
    return made, True
