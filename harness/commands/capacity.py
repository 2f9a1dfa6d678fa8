"""`harness capacity SWEEP`: per (arm, context), the largest concurrency at which every request stays running,
beside vLLM's logged bound and the calculator's estimate; `does not fit` where the server refuses."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.capacity import capacity_lines
from harness.commands import common
from harness.commands.common import CommandArgs, option, positional, progress
from harness.config import load_sweep
from harness.io import display_path
from harness.session import SessionOptions, run_session


@dataclass(frozen=True)
class CapacityArgs(CommandArgs):
    sweep: Path = positional("sweep file with a `search:` section and usually `contexts:` (e.g. "
                             "sweeps/tp8-capacity.yaml)", type=Path)
    simulate: bool = option("--simulate", "search on the simulated engine in virtual time (seconds; no servers, "
                            "no EvalScope)", action="store_true", default=False)
    run_id: str | None = common.run_id("the run folder; an existing one is resumed: probes already measured are "
                                       "reused (default: sweep name + UTC time)")
    launcher: str = common.launcher()
    dialect: str | None = common.dialect("render HiSparse flags for")
    ray_gpus: int | None = common.ray_gpus()
    results_dir: Path = common.results_dir()
    envs_dir: Path | None = common.envs_dir()
    clients_dir: Path | None = common.clients_dir()
    no_report: bool = common.no_report()


def register(parser: argparse.ArgumentParser) -> None:
    CapacityArgs.register(parser, run)


def run(args: CapacityArgs) -> int:
    loaded = load_sweep(args.sweep)
    result = run_session(loaded, SessionOptions(
        run_id=args.run_id, results_root=args.results_dir, simulate=args.simulate, launcher=args.launcher,
        dialect=args.dialect, ray_gpus=args.ray_gpus, envs_dir=args.envs_dir, clients_dir=args.clients_dir,
        outputs=not args.no_report, capacity=True), progress=progress)
    if result.error is not None:
        raise result.error
    assert result.run_dir is not None and result.capacity is not None
    print()
    for line in capacity_lines(result.capacity):
        print(line)
    print(f"\nrun folder: {display_path(result.run_dir)} ({result.wall_s:.0f}s"
          + (f", {result.simulated_s:.0f} s simulated, SIMULATED" if args.simulate else "") + ")")
    for line in result.outputs.warnings:
        print(line, file=sys.stderr)
    for line in result.outputs.lines():
        print(line)
    return 1 if any(r.status == "failed" for r in result.capacity.results) else 0
