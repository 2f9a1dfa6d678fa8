"""`harness sweep SWEEP.yaml`: bring servers up, run every point, record everything, tear down, report."""

from __future__ import annotations

import argparse
import sys

from harness.commands.common import add_dialect, add_no_report, add_results_dir, progress
from harness.config import load_sweep
from harness.io import display_path
from harness.session import SessionOptions, run_session
from harness.summary import summary_table


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
    options = SessionOptions(run_id=args.run_id, results_root=args.results_dir, launcher=args.launcher,
                             dialect=args.dialect, ray_gpus=args.ray_gpus, outputs=not args.no_report)
    result = run_session(loaded, options, progress=progress)
    if result.error is not None:
        raise result.error
    assert result.run_dir is not None
    print(summary_table(result.run_dir))
    for failure in result.failures:
        print(f"  failed: {failure}", file=sys.stderr)
    print(f"\nrun folder: {display_path(result.run_dir)}  ({result.ok} ok, {result.degraded} degraded, "
          f"{result.failed} failed, {result.skipped} skipped, {result.wall_s:.0f}s; status {result.status})")
    for line in result.outputs.warnings:
        print(line, file=sys.stderr)
    for line in result.outputs.lines():
        print(line)
    return result.exit_code
