"""`harness sweep SWEEP.yaml`: bring servers up, run every point, record everything, tear down."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", help="sweep file, e.g. sweeps/sim.yaml")
    parser.add_argument("--run-id", help="name of the run folder; an existing one is resumed "
                        "(default: sweep name + UTC time)")
    parser.add_argument("--launcher", choices=["ray", "local"], default="ray",
                        help="ray (default; RAY_ADDRESS or a local Ray) or local subprocesses")
    parser.add_argument("--dialect", choices=["auto", "blog-branch", "release"], default=None,
                        help="vLLM dialect for HiSparse flags (default: the profile's)")
    parser.add_argument("--ray-gpus", type=int, default=None, metavar="N",
                        help="GPUs a locally started Ray declares (e.g. fake ones on a CPU-only host)")
    parser.add_argument("--results-dir", type=Path, default=Path("results"), help="where run folders go")
    parser.set_defaults(run=run)


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(args: argparse.Namespace) -> int:
    from harness.config import display_path, load_sweep
    from harness.launch.reaper import reap_stale_servers
    from harness.runner import SweepOptions, run_sweep
    from harness.summary import summary_table, write_summary_csv

    loaded = load_sweep(args.sweep)
    for killed in reap_stale_servers():
        _progress(f"stopped a server left behind by an earlier harness: {killed}")
    options = SweepOptions(run_id=args.run_id, results_root=args.results_dir, launcher=args.launcher,
                           dialect=args.dialect, ray_gpus=args.ray_gpus)
    outcome = run_sweep(loaded, options, progress=_progress)
    write_summary_csv(outcome.run_dir)
    print(summary_table(outcome.run_dir))
    print(f"\nrun folder: {display_path(outcome.run_dir)}  ({outcome.ok} ok, {outcome.failed} failed, "
          f"{outcome.skipped} skipped, {outcome.wall_s:.0f}s)")
    for failure in outcome.failures:
        print(f"  failed: {failure}", file=sys.stderr)
    return 1 if outcome.failed else 0
