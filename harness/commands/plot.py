"""`harness plot RUN [RUN ...]`: Pareto, occupancy, acceptance and time-series figures (PNG + SVG)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.report.plots import default_plots_dir, plot_runs
from harness.summary import resolve_run_dir


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run folder, or a run id under results/; several runs are overlaid")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: plots/<run-id>/, or plots/<first-run-id>+N/)")
    parser.add_argument("--x", choices=["total", "output"], default="total",
                        help="Pareto x axis: total (default) or output tok/s per GPU")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:

    run_dirs = [resolve_run_dir(r) for r in args.runs]
    out_dir = args.out or default_plots_dir(run_dirs)
    written = plot_runs(run_dirs, out_dir, x=args.x)
    print(f"wrote {len(written)} files to {out_dir}/:")
    for path in written:
        print(f"  {path.name}")
    return 0
