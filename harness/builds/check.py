"""The build check: whether a made environment can run a profile, decided before any server starts.

HiSparse needs a CUDA build of vLLM >= 0.30 or the blog branch, its compiled ops (or the bundled
kernel module) and the dialect the plan resolved for it; the rules are harness/support.py's.
"""

from __future__ import annotations

from harness.builds.envs import BuildEnv
from harness.builds.probe import BuildError, BuildProbe, probe_build
from harness.config import LaunchProfile
from harness.support import ResolvedDialect, hisparse_refusal


def check_build(profile: LaunchProfile, env: BuildEnv, dialect: ResolvedDialect | None) -> BuildProbe:
    """Import vLLM in the build's interpreter; raise BuildError where it cannot run the profile.

    `dialect` is the one the plan resolved (None where the profile has no HiSparse).
    """
    if env.python is None:  # a `vllm` on PATH not started by a Python we can find: version only
        if profile.kv.hisparse is not None:
            raise BuildError(f"build {env.spec}: cannot check the HiSparse ops of a `vllm` whose interpreter "
                             "is unknown; name a build (a PyPI spec or a git ref) instead")
        return BuildProbe(vllm_version=env.vllm_version)
    probe = probe_build(env.python)
    if probe.vllm_version is None:
        raise BuildError(f"build {env.spec} ({env.python}): vllm does not import: {probe.error}")
    if profile.kv.hisparse is not None and profile.engine == "vllm":
        reason = hisparse_refusal(probe.installed(profile.build.blog_branch), dialect or "release",
                                  bundled_kernels=profile.build.kernels == "bundled")
        if reason is not None:
            raise BuildError(reason)
    return probe
