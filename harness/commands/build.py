"""`harness build LAUNCH.yaml`: create (once) and check the server environment a profile names."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.builds.envs import expected_python
from harness.builds.prepare import prepare_build
from harness.commands.common import add_dialect, progress
from harness.config import load_launch
from harness.plan import resolve_dialect


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("launch", help="launch profile, e.g. launch/tiny-cpu.yaml")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where environments live (default ~/.cache/hisparse-harness/envs)")
    add_dialect(parser, "check the build against")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    loaded = load_launch(args.launch)
    profile = loaded.profile
    if profile.engine != "vllm":
        print(f"{args.launch}: engine {profile.engine} runs in the harness itself; nothing to build")
        return 0
    dialect, notes = resolve_dialect(loaded, args.dialect)
    for note in notes:
        progress(f"warning: {note}")
    prepared = prepare_build(profile, dialect, expected_python(profile.build, args.cache_dir), args.cache_dir,
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
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0
