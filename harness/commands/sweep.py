"""`harness sweep SWEEP.yaml`: bring servers up, run every point, record everything, tear down, report."""

from __future__ import annotations

import argparse
import sys

from harness.commands.common import add_dialect, add_no_report, add_results_dir, progress, write_run_outputs
from harness.config import load_sweep
from harness.io import display_path
from harness.runner import SweepOptions, run_sweep
from harness.servers.reaper import reap_stale_servers
from harness.summary import summary_table, write_summary_csv


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", help="sweep file, e.g. sweeps/sim.yaml")
    parser.add_argument("--run-id", help="name of the run folder; an existing one is resumed "
                        "(default: sweep name + UTC time)")
    parser.add_argument("--launcher", choices=["ray", "local"], default="ray",
                        help="ray (default; RAY_ADDRESS or a local Ray) or local subprocesses")
    add_dialect(parser, "render HiSparse flags for")
    parser.add_argument("--ray-gpus", type=int, default=None, metavar="N",
                        help="GPUs a locally started Ray declares (e.g. fake ones on a CPU-only host)")
    add_results_dir(parser)
    add_no_report(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    loaded = load_sweep(args.sweep)
    for killed in reap_stale_servers():
        progress(f"stopped a server left behind by an earlier harness: {killed}")
    options = SweepOptions(run_id=args.run_id, results_root=args.results_dir, launcher=args.launcher,
                           dialect=args.dialect, ray_gpus=args.ray_gpus)
    outcome = run_sweep(loaded, options, progress=progress)
    write_summary_csv(outcome.run_dir)
    print(summary_table(outcome.run_dir))
    for failure in outcome.failures:
        print(f"  failed: {failure}", file=sys.stderr)
    print(f"\nrun folder: {display_path(outcome.run_dir)}  ({outcome.ok} ok, {outcome.degraded} degraded, "
          f"{outcome.failed} failed, {outcome.skipped} skipped, {outcome.wall_s:.0f}s; status {outcome.status})")
    if not args.no_report:
        for line in write_run_outputs(outcome.run_dir):
            print(line)
    return 1 if outcome.failed or outcome.degraded else 0
