"""`harness sweep SWEEP.yaml`: bring servers up, run every point, record everything, tear down, report."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.commands import common
from harness.commands.common import CommandArgs, positional, progress
from harness.config import load_sweep
from harness.io import display_path
from harness.session import SessionOptions, run_session
from harness.summary import summary_table


@dataclass(frozen=True)
class SweepArgs(CommandArgs):
    sweep: Path = positional("sweep file, e.g. sweeps/sim.yaml", type=Path)
    run_id: str | None = common.run_id()
    launcher: str = common.launcher()
    dialect: str | None = common.dialect("render HiSparse flags for")
    ray_gpus: int | None = common.ray_gpus()
    results_dir: Path = common.results_dir()
    envs_dir: Path | None = common.envs_dir()
    clients_dir: Path | None = common.clients_dir()
    no_report: bool = common.no_report()


def register(parser: argparse.ArgumentParser) -> None:
    SweepArgs.register(parser, run)


def run(args: SweepArgs) -> int:
    loaded = load_sweep(args.sweep)
    options = SessionOptions(run_id=args.run_id, results_root=args.results_dir, launcher=args.launcher,
                             dialect=args.dialect, ray_gpus=args.ray_gpus, envs_dir=args.envs_dir,
                             clients_dir=args.clients_dir, outputs=not args.no_report)
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
