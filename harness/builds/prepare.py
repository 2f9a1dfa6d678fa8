"""Making a server's build ready where the server will run: the environment (made once, cached), the
check that it can run the profile, the bundled kernel module where the profile asks for it, and the
model files the profile generates locally.

The local launcher calls this on the driver before any server starts; the Ray launcher calls it in
the server's actor, on the server's node. Either way the command was rendered by the plan from the
same pure function of the build spec, so the interpreter found here must be the one the plan named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.builds.check import check_build, check_bundled_kernels
from harness.builds.envs import (
    DEFAULT_CUDA_ARCH,
    BuildEnv,
    ensure_build,
    kernel_preview,
    refuse_without_gpu,
)
from harness.builds.kernel_proofs import DispatchProof
from harness.builds.kernels import KernelOverlay, bundled_server_env, ensure_kernel_overlay
from harness.builds.probe import BuildError, BuildProbe
from harness.builds.tiny_model import ensure_tiny_model, tiny_model_path
from harness.config import LaunchProfile
from harness.support import ResolvedDialect

Progress = Callable[[str], None]


@dataclass(frozen=True)
class PreparedBuild:
    """A build made and checked: its environment, what the check found, and extra server env."""

    env: BuildEnv
    probe: BuildProbe
    model: str
    server_env: dict[str, str] = field(default_factory=dict)
    kernel: KernelOverlay | None = None  # kernels: bundled
    dispatch: DispatchProof | None = None  # how the check proved the bundled kernels are reached

    def provenance(self) -> dict:
        out = self.env.provenance()
        if self.kernel is not None:
            out["kernel"] = {**self.kernel.identity.__dict__, "overlay_dir": str(self.kernel.path)}
        return out


def _ensure_model(profile: LaunchProfile) -> str:
    """The model the server loads; the tiny CPU model is generated where the profile names its path.

    (serve.model is already expanded: vLLM takes a path as given, so `~` is resolved at load.)"""
    if Path(profile.serve.model) == tiny_model_path():
        ensure_tiny_model()
    return profile.serve.model


def _ensure_bundled_overlay(profile: LaunchProfile, env: BuildEnv, cache_dir: Path | None, progress: Progress,
                           kernel_source: Path | None = None) -> KernelOverlay:
    """The module built for this environment's torch: CPU kernels for a CPU torch, else CUDA for the
    profile's GPU architecture (build.cuda_arch, default sm 9.0)."""
    if env.python is None:
        raise BuildError(f"build {env.spec}: kernels: bundled needs the server's interpreter, and this `vllm` "
                         "on PATH has none the harness can find; name a build (a PyPI spec or a git ref)")
    if env.torch_version is None:
        raise BuildError(f"build {env.spec} ({env.python}): torch does not import, so the bundled kernels "
                         "cannot be built against it")
    arch = (profile.build.cuda_arch or DEFAULT_CUDA_ARCH) if env.torch_cuda else None
    if arch is not None:  # a system build with a CUDA torch: envs.py refused the others already
        refuse_without_gpu(f"build {env.spec} with kernels: bundled",
                           "its torch is a CUDA build, and the check must show torch.ops._C_cache_ops.hisparse_* "
                           "reaching the bundled CUDA kernels", kernel_preview(env.python, arch, cache_dir),
                           progress, needs_nvcc=True)
    return ensure_kernel_overlay(env.python, env.torch_version, arch, cache_dir, progress, kernel_source)


def prepare_build(profile: LaunchProfile, dialect: ResolvedDialect | None, expected_python: str | None,
                  cache_dir: Path | None = None, progress: Progress = print,
                  kernel_source: Path | None = None) -> PreparedBuild:
    """Make (or reuse) and check the profile's build here; refuse a build whose interpreter is not
    the one the plan rendered the server command for. `kernel_source`: another copy of
    kernels/hisparse to build the bundled module from (tests)."""
    env = ensure_build(profile, cache_dir, progress)
    if expected_python is not None and env.python is not None and env.python != expected_python:
        raise BuildError(f"build {env.spec}: its interpreter here is {env.python}, but the plan rendered the "
                         f"server command for {expected_python}; plan and run with the same cache folder")
    probe = check_build(profile, env, dialect)
    if profile.build.kernels != "bundled":
        return PreparedBuild(env=env, probe=probe, model=_ensure_model(profile))
    overlay = _ensure_bundled_overlay(profile, env, cache_dir, progress, kernel_source)
    server_env = bundled_server_env(overlay.path, profile.env)
    dispatch = check_bundled_kernels(env, overlay, {**profile.env, **server_env})
    progress(f"build {env.spec}: {overlay.identity.describe()}: calls through torch.ops._C_cache_ops reach it "
             f"(overlay {overlay.path})")
    return PreparedBuild(env=env, probe=probe, model=_ensure_model(profile), server_env=server_env, kernel=overlay,
                         dispatch=dispatch)
