"""Small generic helpers every layer may use: atomic writes, hashing and JSON digests, paths for people,
time stamps, compact JSON, the data files shipped inside the package, installed package versions, and the
wrapper that makes a child process die with its parent. Nothing here knows a harness type."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import tempfile
from datetime import UTC, datetime
from importlib import metadata, resources
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are for everyone on the machine to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    """A pydantic model or plain data as indented JSON, atomically."""
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def display_path(path: Path | str) -> str:
    """A path as the user would type it: relative to the working folder when inside it."""
    p = Path(path)
    try:
        rel = os.path.relpath(p.resolve(), Path.cwd())
    except ValueError:
        return str(p)
    return str(p) if rel.startswith("..") else rel


def utc_now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_from_unix(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def compact_json(obj: Any) -> str:
    """JSON as vLLM and EvalScope flags want it: no spaces, keys in the order they were built."""
    return json.dumps(obj, separators=(",", ":"))


def json_digest(obj: Any, length: int = 16) -> str:
    """A stable name for JSON-able data: the first `length` hex digits of the sha256 of its JSON with
    sorted keys (cache keys of environments and datasets, identities of launch profiles)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:length]


def data_path(*parts: str) -> Path:
    """A file or folder shipped in the package's data/ (works from a checkout, a wheel or an sdist)."""
    return Path(str(resources.files("harness").joinpath("data", *parts)))


def package_version(name: str) -> str | None:
    """The installed version of a distribution in this interpreter, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# Sets the parent-death signal (and, if asked, the niceness), then becomes the real program (exec keeps
# the pid and the settings): a child of the harness dies with the harness even when the harness is
# killed with SIGKILL. Raising priority back needs CAP_SYS_NICE; without it the child keeps its starter's.
_DIE_WITH_PARENT = (
    "import ctypes, os, sys\n"
    "sig, parent, nice = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != parent:\n"
    "    os.kill(os.getpid(), sig)  # the parent died before the setting took hold\n"
    "if nice != '-':\n"
    "    try:\n"
    "        os.setpriority(os.PRIO_PROCESS, 0, int(nice))\n"
    "    except OSError as exc:\n"
    "        print(f'harness: cannot set niceness {nice} (kept {os.getpriority(os.PRIO_PROCESS, 0)}): {exc}',\n"
    "              file=sys.stderr, flush=True)\n"
    "os.execvp(sys.argv[4], sys.argv[4:])\n")


def die_with_parent(argv: list[str], sig: int = signal.SIGTERM, *, niceness: int | None = None) -> list[str]:
    """argv wrapped so the process gets `sig` when the thread that starts it (the harness) dies; with
    `niceness`, the program runs at that niceness where the system allows it (None: the starter's)."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    nice = "-" if niceness is None else str(int(niceness))
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(int(sig)), str(os.getpid()), nice, *argv]

