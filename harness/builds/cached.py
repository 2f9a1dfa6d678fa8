"""Something built once into a cache folder and reused after: found by a marker written last, or built
in a temporary folder beside its final place and renamed into it, so a half-built folder is never used.
One builder at a time: a second harness waits on the lock, then finds the first one's result."""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


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
        if final.exists():  # no marker: not ours or broken; never built in place, so clear it
            shutil.rmtree(final)
        for stale in root.glob(f".tmp-{final.name}-*"):  # left by a killed build
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
        try:
            made = build(tmp)
            tmp.chmod(0o755)  # mkdtemp makes it private; servers of other users read it too
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return made, True
