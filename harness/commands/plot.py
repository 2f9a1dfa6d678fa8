"""`harness plot RUN [RUN ...]`: Pareto, occupancy, acceptance and time-series figures (PNG + SVG)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from harness.commands import common
from harness.commands.common import CommandArgs, option, positional
from harness.report.plots import default_plots_dir, plot_runs
from harness.summary import resolve_run_dir


@dataclass(frozen=True)
class PlotArgs(CommandArgs):
    runs: list[str] = positional("run folder, or a run id in --results-dir; several runs are overlaid",
                                 metavar="RUN", nargs="+")
    out: Path | None = option("--out", "output folder (default: plots/<run-id>/, or plots/<first-run-id>+N/)",
                              type=Path, metavar="DIR")
    x: str = option("--x", "Pareto x axis: total (default) or output tok/s per GPU", default="total",
                    choices=("total", "output"))
    results_dir: Path = common.results_dir()


def register(parser: argparse.ArgumentParser) -> None:
    PlotArgs.register(parser, run)


def run(args: PlotArgs) -> int:

    run_dirs = [resolve_run_dir(r, args.results_dir) for r in args.runs]
    out_dir = args.out or default_plots_dir(run_dirs)
    written = plot_runs(run_dirs, out_dir, x=args.x)
    print(f"wrote {len(written)} files to {out_dir}/:")
    for path in written:
        print(f"  {path.name}")
    return 0
