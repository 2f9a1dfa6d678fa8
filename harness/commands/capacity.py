"""`harness capacity SWEEP`: per (arm, context), the largest concurrency at which every request stays running,
beside vLLM's logged bound and the calculator's estimate; `does not fit` where the server refuses."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from harness.capacity import capacity_lines
from harness.commands import common
from harness.commands.common import option, positional, progress
from harness.commands.session_args import ServedRunArgs, print_run_end
from harness.config import load_sweep
from harness.io import display_path
from harness.session import run_session


@dataclass(frozen=True)
class CapacityArgs(ServedRunArgs):
    sweep: Path = positional("sweep file with a `search:` section and usually `contexts:` (e.g. "
                             "sweeps/tp8-capacity.yaml)", type=Path)
    simulate: bool = option("--simulate", "search on the simulated engine in virtual time (seconds; no servers, "
                            "no EvalScope)", action="store_true", default=False)
    run_id: str | None = common.run_id("the run folder; an existing one is resumed: probes already measured are "
                                       "reused (default: sweep name + UTC time)")


def register(parser: argparse.ArgumentParser) -> None:
    CapacityArgs.register(parser, run)


def run(args: CapacityArgs) -> int:
    result = run_session(load_sweep(args.sweep), args.session_options(simulate=args.simulate, capacity=True),
                         progress=progress)
    if result.error is not None:
        raise result.error
    assert result.run_dir is not None and result.capacity is not None
    print()
    for line in capacity_lines(result.capacity):
        print(line)
    print_run_end(result, f"\nrun folder: {display_path(result.run_dir)} ({result.wall_s:.0f}s"
                          + (f", {result.simulated_s:.0f} s simulated, SIMULATED" if args.simulate else "") + ")")
    return 1 if any(r.status == "failed" for r in result.capacity.results) else 0
