"""What several commands share: progress lines, option spellings, and the run's closing outputs."""

from __future__ import annotations

import argparse
import time
import typing
from pathlib import Path

from harness.config import Dialect
from harness.report.markdown import write_report
from harness.report.plots import default_plots_dir, plot_runs

DIALECT_CHOICES = typing.get_args(Dialect)


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def add_results_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results-dir", type=Path, default=Path("results"),
                        help="where run folders go (default: results)")


def add_dialect(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--dialect", choices=DIALECT_CHOICES, default=None,
                        help=f"vLLM dialect to {what} (default: the profile's)")


def add_no_report(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-report", action="store_true",
                        help="skip the figures and report.md at the end (write them later with `harness report`)")


def write_run_outputs(run_dir: Path) -> list[str]:
    """Draw the run's figures and write its report; the closing lines that name both."""

    plots_dir = default_plots_dir([run_dir])
    plot_runs([run_dir], plots_dir)
    report = write_report(run_dir, plots_dir)
    return [f"report:  {report}", f"figures: {plots_dir}/"]
