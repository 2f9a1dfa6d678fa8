"""`harness sweep SWEEP.yaml`: bring servers up, run every point, record everything, tear down, report."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from harness.commands.common import positional, progress
from harness.commands.session_args import ServedRunArgs, print_run_end
from harness.config import load_sweep
from harness.io import display_path
from harness.session import run_session
from harness.summary import summary_table


@dataclass(frozen=True)
class SweepArgs(ServedRunArgs):
    sweep: Path = positional("sweep file, e.g. sweeps/sim.yaml", type=Path)


def register(parser: argparse.ArgumentParser) -> None:
    SweepArgs.register(parser, run)


def run(args: SweepArgs) -> int:
    result = run_session(load_sweep(args.sweep), args.session_options(), progress=progress)
    if result.error is not None:
        raise result.error
    assert result.run_dir is not None
    print(summary_table(result.run_dir))
    print_run_end(result, f"\nrun folder: {display_path(result.run_dir)}  ({result.ok} ok, {result.degraded} degraded, "
                          f"{result.failed} failed, {result.skipped} skipped, {result.wall_s:.0f}s; status "
                          f"{result.status})")
    return result.exit_code
