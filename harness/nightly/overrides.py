"""What `harness nightly` may change in a sweep for one night, without touching its files: the HiSparse
kernels and the vLLM build of every vLLM arm (`--kernels`, `--vllm-ref`), and which deployments run
(`--deployment`). The sweep file's hash stays what it is, so the night is still compared with the
others; the versions a night really ran are in its record, and a change there is named as the likely
cause of a regression.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from pydantic import ValidationError

from harness.config import BuildSpec, ConfigError, LaunchProfile, LoadedLaunch, LoadedSweep

Kernels = Literal["vllm", "bundled"]
# where a bare ref (a commit, a branch) is looked up when the profile's build is not a git build
DEFAULT_VLLM_REPO = "vllm-project/vllm"


def vllm_spec_for_ref(build: BuildSpec, ref: str) -> str:
    """--vllm-ref as a build spec: a whole spec (`owner/vllm@ref`, `==0.33.0`, `system`) as given; a bare
    ref (a commit or branch) in the repository the profile already builds from, else vLLM's own."""
    ref = ref.strip()
    if "@" in ref or ref == "system" or ref.startswith("==") or "==" in ref:
        return ref
    return f"{build.git_repo or DEFAULT_VLLM_REPO}@{ref}"


def _overridden(launch: LoadedLaunch, kernels: Kernels | None, vllm_ref: str | None) -> LoadedLaunch:
    profile = launch.profile
    build = profile.build.model_dump()
    if kernels is not None:
        build["kernels"] = kernels
    if vllm_ref is not None:
        build["vllm"] = vllm_spec_for_ref(profile.build, vllm_ref)
    given = " ".join(f"{flag} {value}" for flag, value in (("--kernels", kernels), ("--vllm-ref", vllm_ref))
                     if value is not None)
    try:
        # validated again as a whole: the profile's own rules (a bundled kernel module needs a build
        # that can take it, HiSparse needs a vLLM that has it) hold for the build tonight runs
        changed = LaunchProfile.model_validate({**profile.model_dump(), "build": build},
                                               context={"base_dir": launch.path.parent})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if not str(p).startswith("function-"))
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        raise ConfigError(launch.path, f"with {given}: {message}", where) from None
    return LoadedLaunch(path=launch.path, profile=changed, files=launch.files)


def with_overrides(loaded: LoadedSweep, *, kernels: Kernels | None = None, vllm_ref: str | None = None,
                   deployments: Sequence[str] = ()) -> LoadedSweep:
    """The sweep as tonight runs it. Only vLLM arms take --kernels and --vllm-ref (the simulated engine
    has no build); an unknown --deployment is refused with the names there are."""
    sweep = loaded.sweep
    names = [d.name for d in sweep.deployments]
    unknown = [n for n in deployments if n not in names]
    if unknown:
        raise ConfigError(loaded.path, f"--deployment {unknown[0]}: not a deployment of this sweep "
                          f"(it has {', '.join(names)})")
    if deployments:
        sweep = sweep.model_copy(update={"deployments": [d for d in sweep.deployments if d.name in deployments]})
    launches = {}
    for dep in sweep.deployments:
        launch = loaded.launches[dep.name]
        if launch.profile.engine == "vllm" and (kernels is not None or vllm_ref is not None):
            launch = _overridden(launch, kernels, vllm_ref)
        launches[dep.name] = launch
    return replace(loaded, sweep=sweep, launches=launches)

