"""Bundled implementation of vLLM's four HiSparse ops (CPU always, CUDA when built for it).

`load()` registers the ops under `torch.ops.hisparse_kernels`; the vLLM plugin
(`hisparse_kernels.plugin`) also attaches them to `torch.ops._C_cache_ops`. The build
identity is compiled into the library, so `identity()` reports what was built, not
what the source tree says now.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from ._version import __version__

__all__ = ["OP_NAMES", "Identity", "__version__", "announce", "call_counts", "identity", "load"]

OP_NAMES = (
    "hisparse_resolve_residency",
    "hisparse_invalidate_written_slots",
    "hisparse_gather_plan",
    "hisparse_gather_compact",
)
NAMESPACE = "hisparse_kernels"
_ROUTES = ("hisparse_kernels", "_C_cache_ops")
_DEVICES = ("cpu", "cuda")

logger = logging.getLogger("hisparse_kernels")
_lock = threading.Lock()
_library: Path | None = None
_announced: set[tuple[str, ...]] = set()


@dataclass(frozen=True)
class Identity:
    version: str
    source_sha256: str
    built_for: str  # cpu | cuda
    cuda_arch: str | None

    def short(self) -> str:
        return f"{NAMESPACE} {self.version} (sha256 {self.source_sha256[:12]})"


def library_path() -> Path:
    here = Path(__file__).resolve().parent
    found = sorted(here.glob("_C*.so"))
    if not found:
        raise ImportError(f"hisparse_kernels at {here} has no compiled library (_C*.so): "
                          "build it with `pip install --no-build-isolation kernels/hisparse`")
    return found[0]


def load(*, announce_line: bool = True) -> Path:
    """Load the compiled library once per process; returns its path."""
    global _library
    import torch

    with _lock:
        if _library is None:
            path = library_path()
            torch.ops.load_library(str(path))
            _library = path
    if announce_line:
        announce((NAMESPACE,))
    return _library


def identity() -> Identity:
    """The identity compiled into the loaded library."""
    import torch

    load(announce_line=False)
    raw = json.loads(torch.ops.hisparse_kernels.build_identity())
    return Identity(raw["version"], raw["source_sha256"], raw["built_for"], raw["cuda_arch"])


def call_counts() -> dict[str, dict[str, dict[str, int]]]:
    """Calls that reached the bundled kernels: route -> device -> op -> count."""
    import torch

    load(announce_line=False)
    flat = list(torch.ops.hisparse_kernels.call_counts())
    out: dict[str, dict[str, dict[str, int]]] = {}
    i = 0
    for route in _ROUTES:
        out[route] = {}
        for device in _DEVICES:
            out[route][device] = {}
            for op in OP_NAMES:
                out[route][device][op] = int(flat[i])
                i += 1
    return out


def announce(namespaces: tuple[str, ...], log: logging.Logger | None = None) -> None:
    """Log the identity line once per process for each set of namespaces registered."""
    with _lock:
        if namespaces in _announced:
            return
        _announced.add(namespaces)
    (log or logger).info("%s registered: %s", identity().short(), ", ".join(namespaces))
