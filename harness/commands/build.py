"""`harness build LAUNCH.yaml`: create (once) and check the server environment a profile names."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("launch", help="launch profile, e.g. launch/tiny-cpu.yaml")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where environments live (default ~/.cache/hisparse-harness/envs)")
    parser.add_argument("--dialect", choices=["auto", "blog-branch", "release"], default=None,
                        help="vLLM dialect to check the build against (default: the profile's)")
    parser.set_defaults(run=run)


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(args: argparse.Namespace) -> int:
    from harness.config import load_launch
    from harness.launch.build import check_build, ensure_build, ensure_model

    loaded = load_launch(args.launch)
    profile = loaded.profile
    if profile.engine != "vllm":
        print(f"{args.launch}: engine {profile.engine} runs in the harness itself; nothing to build")
        return 0
    env = ensure_build(profile, args.cache_dir, progress=_progress)
    probe = check_build(profile, env, args.dialect)
    model = ensure_model(profile)
    size = f"{env.size_bytes / 2**30:.1f} GiB" if env.size_bytes else "n/a"
    rows = [("build", env.spec), ("kind", env.kind), ("status", "built now" if env.created else "reused"),
            ("environment", str(env.env_dir or "-")), ("python", env.python or "(the vllm on PATH)"),
            ("vllm", f"{env.describe()} (commit {env.vllm_commit or 'n/a'})"),
            ("torch", f"{env.torch_version} ({'CUDA ' + env.torch_cuda if env.torch_cuda else 'CPU'})"),
            ("build time", f"{env.build_s:.0f}s"), ("size", size),
            ("HiSparse ops", ", ".join(probe.ops) or "none"), ("model", model), ("check", "ok")]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0
