"""What several commands share: progress lines and option spellings."""

from __future__ import annotations

import argparse
import time
import typing
from pathlib import Path

from harness.config import Dialect

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
