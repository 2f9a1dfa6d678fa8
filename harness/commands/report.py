"""`harness report RUN`: results/<run>/report.md, drawing the figures first when they are missing."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from harness.commands import common
from harness.commands.common import CommandArgs, option, positional
from harness.report.markdown import collect_warnings, write_report
from harness.report.plots import default_plots_dir, figures_present, plot_runs
from harness.results import iter_points, read_manifest
from harness.summary import resolve_run_dir


@dataclass(frozen=True)
class ReportArgs(CommandArgs):
    run_ref: str = positional("run folder, or a run id in --results-dir", metavar="RUN")
    out: Path | None = option("--out", "figures folder (default: plots/<run-id>/); drawn there when missing",
                              type=Path, metavar="DIR", deprecated=("--plots",))
    redraw: bool = option("--redraw", "draw the figures even when present", action="store_true", default=False)
    results_dir: Path = common.results_dir()


def register(parser: argparse.ArgumentParser) -> None:
    ReportArgs.register(parser, run)


def run(args: ReportArgs) -> int:

    run_dir = resolve_run_dir(args.run_ref, args.results_dir)
    plots_dir = args.out or default_plots_dir([run_dir])
    if args.redraw or not figures_present(plots_dir):
        written = plot_runs([run_dir], plots_dir)
        print(f"drew {len(written)} figure files in {plots_dir}/")
    path = write_report(run_dir, plots_dir)
    warnings = collect_warnings(read_manifest(run_dir), iter_points(run_dir))
    print(f"wrote {path}" + (f" ({len(warnings)} warning(s))" if warnings else ""))
    for w in warnings:
        print(f"  warning: {w.kind}: {w.text}")
    return 0
