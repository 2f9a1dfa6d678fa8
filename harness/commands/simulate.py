"""`harness simulate SWEEP.yaml`: the sweep on the simulated engine in virtual time -> a run folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.commands.common import add_no_report, add_results_dir, write_run_outputs
from harness.config import load_sweep
from harness.io import display_path
from harness.simulate import SimulateOptions, simulate_sweep
from harness.summary import summary_table


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", type=Path, help="sweep file (its launch profiles may be vllm or sim)")
    parser.add_argument("--run-id", default=None, help="run folder name (default: <sweep>-sim-<UTC time>)")
    add_results_dir(parser)
    add_no_report(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    loaded = load_sweep(args.sweep)
    outcome = simulate_sweep(loaded, SimulateOptions(run_id=args.run_id, results_root=args.results_dir))
    print(summary_table(outcome.run_dir))
    ratio = outcome.simulated_s / outcome.wall_s if outcome.wall_s > 0 else float("inf")
    print(f"simulate: {outcome.points} points, {outcome.simulated_s:.0f} s simulated in {outcome.wall_s:.1f} s "
          f"wall ({ratio:.0f}x); run folder {display_path(outcome.run_dir)} (SIMULATED)")
    if not args.no_report:
        for line in write_run_outputs(outcome.run_dir):
            print(line)
    return 0
