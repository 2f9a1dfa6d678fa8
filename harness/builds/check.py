"""The build check: whether a made environment can run a profile, decided before any server starts.

HiSparse needs a CUDA build of vLLM >= 0.30 or the blog branch, its compiled ops (or the bundled
kernel module) and the dialect the plan resolved for it; the rules are harness/support.py's. With
`kernels: bundled` the check also proves, in the build's interpreter, that vLLM's
`torch.ops._C_cache_ops.hisparse_*` run the bundled module: by its call counters and the identity
it reports, not by what is installed.

Each check's subprocess runs once per process for a made environment (one with a folder and its marker)
and the same process environment: a sweep's deployments that share a build (a capacity search's contexts,
the two arms of a kernel A/B, a sweep run twice in one process) import vLLM once, not once each (10 s on
2 CPU cores, more for a CUDA build). A rebuilt environment has a new marker, so it is checked again; only
passing checks are kept.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from harness.builds.envs import MARKER, BuildEnv
from harness.builds.kernel_proofs import DispatchProof, probe_dispatch
from harness.builds.kernels import KernelOverlay
from harness.builds.probe import BuildError, BuildProbe, probe_build
from harness.config import LaunchProfile
from harness.support import ResolvedDialect, build_hisparse_refusal

T = TypeVar("T")


def check_build(profile: LaunchProfile, env: BuildEnv, dialect: ResolvedDialect | None) -> BuildProbe:
    """Import vLLM in the build's interpreter; raise BuildError where it cannot run the profile.

    `dialect` is the one the plan resolved (None where the profile has no HiSparse).
    """
    if env.python is None:  # a `vllm` on PATH not started by a Python we can find: version only
        if profile.kv.hisparse is not None:
            raise BuildError(f"build {env.spec}: cannot check the HiSparse ops of a `vllm` whose interpreter "
                             "is unknown; name a build (a PyPI spec or a git ref) instead")
        return BuildProbe(vllm_version=env.vllm_version)
    python = env.python
    probe = _once(_memo_key(env, ("probe",)), lambda: probe_build(python),
                  lambda p: p.vllm_version is not None and p.error is None)
    if probe.vllm_version is None:
        raise BuildError(f"build {env.spec} ({env.python}): vllm does not import: {probe.error}")
    if profile.kv.hisparse is not None and profile.engine == "vllm":
        reason = build_hisparse_refusal(probe.installed(profile.build.blog_branch), dialect or "release",
                                  bundled_kernels=profile.build.kernels == "bundled")
        if reason is not None:
            raise BuildError(reason)
    return probe


def check_bundled_kernels(env: BuildEnv, overlay: KernelOverlay, server_env: dict[str, str]) -> DispatchProof:
    """Start the build's Python with the server's environment, load vLLM's plugins as a worker does,
    call the four ops through _C_cache_ops and read the bundled call counters; BuildError (one line)
    unless every call reached the overlay's kernels (also on CUDA, for a CUDA build)."""
    assert env.python is not None  # prepare refuses bundled kernels without an interpreter
    python = env.python
    proof = _once(_memo_key(env, ("dispatch", str(overlay.path), overlay.identity.source_sha256,
                                  *sorted(server_env.items()))),
                  lambda: probe_dispatch(python, overlay.path, server_env),
                  lambda p: _dispatch_problem(p, overlay) is None)
    problem = _dispatch_problem(proof, overlay)
    if problem is not None:
        raise BuildError(f"build {env.spec}: bundled kernels not proven in {env.python}: {problem}")
    return proof


def _dispatch_problem(proof: DispatchProof, overlay: KernelOverlay) -> str | None:
    """Why the proof does not show every call reaching the overlay's kernels; None where it does."""
    problem = None if proof.ok else proof.why_not()
    if problem is None and proof.identity != overlay.identity:
        problem = (f"the process loaded {proof.identity.describe() if proof.identity else 'no module'}, not the "
                   f"overlay's {overlay.identity.describe()}")
    if problem is None and overlay.identity.built_for == "cuda":
        missed = [op for op, hit in proof.reached_cuda.items() if not hit]
        if not proof.reached_cuda or missed:
            problem = ("calls on CUDA tensors did not reach the bundled CUDA kernels: "
                       + (", ".join(missed) or "no CUDA device was usable"))
    return problem


_KEPT: dict[tuple, object] = {}  # passing checks of this process, by _memo_key


def _once(key: tuple | None, run: Callable[[], T], passed: Callable[[T], bool]) -> T:
    """run()'s result, kept under `key` where it passed; a kept one is returned without running again."""
    if key is not None and key in _KEPT:
        return _KEPT[key]  # type: ignore[return-value]
    result = run()
    if key is not None and passed(result):
        _KEPT[key] = result
    return result


def _memo_key(env: BuildEnv, extra: tuple = ()) -> tuple | None:
    """What a check's result depends on in this process: the interpreter, its environment as made (the
    marker, rewritten by a rebuild), the process environment the subprocess inherits; None where nothing
    marks the environment as made (a system build: it can change under the harness)."""
    if env.env_dir is None or env.python is None:
        return None
    try:
        made = (env.env_dir / MARKER).stat()
    except OSError:
        return None
    return (env.python, made.st_ino, made.st_mtime_ns, hash(frozenset(os.environ.items())), *extra)
