"""`harness build LAUNCH.yaml | SWEEP.yaml`: create (once) and check the server environment a profile names;
for a sweep, the pinned EvalScope its client names and every vLLM arm's environment."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.builds.client import ensure_client
from harness.builds.envs import expected_python
from harness.builds.prepare import prepare_build
from harness.commands import common
from harness.commands.common import CommandArgs, positional, progress
from harness.config import load_launch, load_sweep
from harness.io import display_path, package_version
from harness.plan import resolve_dialect


@dataclass(frozen=True)
class BuildArgs(CommandArgs):
    launch: Path = positional("launch profile (launch/tiny-cpu.yaml) or sweep file (sweeps/tp8.yaml)", type=Path)
    clients_dir: Path | None = common.clients_dir()
    envs_dir: Path | None = common.envs_dir()
    dialect: str | None = common.dialect("check the build against")


def register(parser: argparse.ArgumentParser) -> None:
    BuildArgs.register(parser, run)


def _is_sweep(path: Path) -> bool:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return False  # load_launch says what is wrong with it
    return isinstance(data, dict) and "deployments" in data


def _build_sweep(args: BuildArgs) -> int:
    """The sweep's pinned client (built here: EvalScope runs beside the harness) and every vLLM arm."""
    loaded = load_sweep(args.launch)
    spec = loaded.sweep.client.evalscope
    if spec is None:
        print(f"client: the harness's own EvalScope {package_version('evalscope') or '?'}; nothing to build")
    else:
        client = ensure_client(spec, args.clients_dir, progress)
        print(f"client: EvalScope {client.evalscope_version} ({'built now' if client.created else 'reused'}, "
              f"{client.env_dir})")
    done: set[Path] = set()
    for dep in loaded.sweep.deployments:
        launch = loaded.launches[dep.name]
        if launch.path in done:
            continue
        done.add(launch.path)
        print(f"\n{dep.name} ({display_path(launch.path)}):")
        code = run(dataclasses.replace(args, launch=launch.path))
        if code:
            return code
    return 0


def run(args: BuildArgs) -> int:
    if _is_sweep(args.launch):
        return _build_sweep(args)
    loaded = load_launch(args.launch)
    profile = loaded.profile
    if profile.engine != "vllm":
        print(f"{args.launch}: engine {profile.engine} runs in the harness itself; nothing to build")
        return 0
    dialect, notes = resolve_dialect(loaded, args.dialect)
    for note in notes:
        progress(f"warning: {note}")
    prepared = prepare_build(profile, dialect, expected_python(profile.build, args.envs_dir), args.envs_dir,
                             progress)
    env, probe = prepared.env, prepared.probe
    size = f"{env.size_bytes / 2**30:.1f} GiB" if env.size_bytes else "n/a"
    rows = [("build", env.spec), ("kind", env.kind), ("status", "built now" if env.created else "reused"),
            ("environment", str(env.env_dir or "-")), ("python", env.python or "(the vllm on PATH)"),
            ("vllm", f"{env.describe()} (commit {env.vllm_commit or 'n/a'})"),
            ("torch", f"{env.torch_version} ({'CUDA ' + env.torch_cuda if env.torch_cuda else 'CPU'})"),
            ("build time", f"{env.build_s:.0f}s"), ("size", size),
            ("HiSparse ops", ", ".join(probe.ops) or "none"), ("kernels", profile.build.kernels),
            ("model", prepared.model), ("check", "ok")]
    if prepared.kernel is not None:  # kernels: bundled: what was built, and how the check proved it is used
        kernel, dispatch = prepared.kernel, prepared.dispatch
        reached = sum(dispatch.reached.values()) if dispatch else 0
        cuda = f", {sum(dispatch.reached_cuda.values())} on CUDA" if dispatch and dispatch.reached_cuda else ""
        rows[-1:-1] = [("kernel", f"{kernel.identity.describe()}, sha256 {kernel.identity.source_sha256}"),
                       ("kernel overlay", f"{kernel.path} ({'built now' if kernel.created else 'reused'}, "
                                          f"build {kernel.build_s:.0f}s)"),
                       ("kernel dispatch", f"{reached}/4 ops via torch.ops._C_cache_ops reached the bundled kernels"
                                           f"{cuda} (vLLM {dispatch.vllm_version if dispatch else '?'})"),
                       ("server env", " ".join(f"{k}={v}" for k, v in prepared.server_env.items()))]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0
