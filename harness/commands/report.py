"""`harness report RUN`: results/<run>/report.md, drawing the figures first when they are missing."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.report.markdown import collect_warnings, write_report
from harness.report.plots import default_plots_dir, figures_present, plot_runs
from harness.results import iter_points, read_manifest
from harness.summary import resolve_run_dir


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_ref", metavar="RUN", help="run folder, or a run id under results/")
    parser.add_argument("--plots", type=Path, default=None,
                        help="figures folder (default: plots/<run-id>/); drawn there when missing")
    parser.add_argument("--redraw", action="store_true", help="draw the figures even when present")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:

    run_dir = resolve_run_dir(args.run_ref)
    plots_dir = args.plots or default_plots_dir([run_dir])
    if args.redraw or not figures_present(plots_dir):
        written = plot_runs([run_dir], plots_dir)
        print(f"drew {len(written)} figure files in {plots_dir}/")
    path = write_report(run_dir, plots_dir)
    warnings = collect_warnings(read_manifest(run_dir), iter_points(run_dir))
    print(f"wrote {path}" + (f" ({len(warnings)} warning(s))" if warnings else ""))
    for w in warnings:
        print(f"  warning: {w.kind}: {w.text}")
    return 0
