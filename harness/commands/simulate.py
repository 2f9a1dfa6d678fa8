"""`harness simulate SWEEP.yaml`: the sweep on the simulated engine in virtual time -> a run folder."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", type=Path, help="sweep file (its launch profiles may be vllm or sim)")
    parser.add_argument("--run-id", default=None, help="run folder name (default: <sweep>-sim-<UTC time>)")
    parser.add_argument("--results", type=Path, default=Path("results"), help="results root (default: results)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from harness.config import display_path, load_sweep
    from harness.sim.simulate import SimulateOptions, simulate_sweep
    from harness.summary import summary_table

    loaded = load_sweep(args.sweep)
    outcome = simulate_sweep(loaded, SimulateOptions(run_id=args.run_id, results_root=args.results))
    print(summary_table(outcome.run_dir))
    ratio = outcome.simulated_s / outcome.wall_s if outcome.wall_s > 0 else float("inf")
    print(f"simulate: {outcome.points} points, {outcome.simulated_s:.0f} s simulated in {outcome.wall_s:.1f} s "
          f"wall ({ratio:.0f}x); run folder {display_path(outcome.run_dir)} (SIMULATED)")
    return 0
