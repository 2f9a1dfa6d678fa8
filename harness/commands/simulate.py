"""`harness simulate SWEEP.yaml`: the sweep on the simulated engine in virtual time -> a run folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.commands.common import add_no_report, add_results_dir, progress
from harness.config import load_sweep
from harness.io import display_path
from harness.session import SessionOptions, run_session
from harness.summary import summary_table


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", type=Path, help="sweep file (its launch profiles may be vllm or sim)")
    parser.add_argument("--run-id", default=None, help="run folder name (default: <sweep>-sim-<UTC time>)")
    add_results_dir(parser)
    add_no_report(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    loaded = load_sweep(args.sweep)
    result = run_session(loaded, SessionOptions(run_id=args.run_id, results_root=args.results_dir, simulate=True,
                                                outputs=not args.no_report), progress=progress)
    if result.error is not None:
        raise result.error
    assert result.run_dir is not None
    print(summary_table(result.run_dir))
    for failure in result.failures:
        print(f"  failed: {failure}", file=sys.stderr)
    ratio = result.simulated_s / result.wall_s if result.wall_s > 0 else float("inf")
    print(f"simulate: {result.ok + result.degraded + result.failed} points, {result.simulated_s:.0f} s simulated "
          f"in {result.wall_s:.1f} s wall ({ratio:.0f}x); run folder {display_path(result.run_dir)} (SIMULATED)")
    for line in result.outputs.warnings:
        print(line, file=sys.stderr)
    for line in result.outputs.lines():
        print(line)
    return result.exit_code
