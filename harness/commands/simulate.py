"""`harness simulate SWEEP.yaml`: the sweep on the simulated engine in virtual time -> a run folder."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from harness.commands import common
from harness.commands.common import CommandArgs, positional, progress
from harness.commands.session_args import print_run_end
from harness.config import load_sweep
from harness.io import display_path
from harness.session import SessionOptions, run_session
from harness.summary import summary_table


@dataclass(frozen=True)
class SimulateArgs(CommandArgs):
    sweep: Path = positional("sweep file (its launch profiles may be vllm or sim)", type=Path)
    run_id: str | None = common.run_id("run folder name (default: <sweep>-sim-<UTC time>)")
    results_dir: Path = common.results_dir()
    no_report: bool = common.no_report()


def register(parser: argparse.ArgumentParser) -> None:
    SimulateArgs.register(parser, run)


def run(args: SimulateArgs) -> int:
    loaded = load_sweep(args.sweep)
    result = run_session(loaded, SessionOptions(run_id=args.run_id, results_root=args.results_dir, simulate=True,
                                                outputs=not args.no_report), progress=progress)
    if result.error is not None:
        raise result.error
    assert result.run_dir is not None
    print(summary_table(result.run_dir))
    ratio = result.simulated_s / result.wall_s if result.wall_s > 0 else float("inf")
    print_run_end(result, f"simulate: {result.ok + result.degraded + result.failed} points, {result.simulated_s:.0f} s "
                          f"simulated in {result.wall_s:.1f} s wall ({ratio:.0f}x); run folder "
                          f"{display_path(result.run_dir)} (SIMULATED)")
    return result.exit_code
