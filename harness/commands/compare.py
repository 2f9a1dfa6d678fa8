"""`harness compare RUN --reference REF`: per-point changes; exit 1 on a regression, 2 when refused."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from harness.commands import common
from harness.commands.common import CommandArgs, option, positional
from harness.errors import HarnessError
from harness.report.compare import compare_runs, write_reference
from harness.summary import resolve_run_dir


@dataclass(frozen=True)
class CompareArgs(CommandArgs):
    run_ref: str = positional("run folder, or a run id in --results-dir", metavar="RUN")
    reference: str | None = option("--reference", "reference: a run folder, a run id in --results-dir, or a "
                                   "reference JSON", metavar="REF")
    tolerance: float | None = option("--tolerance", "one relative change allowed for every ratio rule (e.g. "
                                     "0.10); default: the run's own sweep's nightly thresholds, as the nightly "
                                     "gate applies them", type=float)
    summary_file: Path | None = option("--summary-file", "also append the markdown table here (e.g. "
                                       "$GITHUB_STEP_SUMMARY)", type=Path, metavar="FILE")
    write_reference: Path | None = option("--write-reference", "write RUN's metrics as a reference JSON to FILE",
                                          type=Path, metavar="FILE")
    results_dir: Path = common.results_dir()


def register(parser: argparse.ArgumentParser) -> None:
    CompareArgs.register(parser, run)


def run(args: CompareArgs) -> int:

    if args.reference is None and args.write_reference is None:
        raise HarnessError("give --reference REF to compare, or --write-reference OUT to write a reference")
    run_dir = resolve_run_dir(args.run_ref, args.results_dir)
    if args.write_reference is not None:
        print(f"wrote reference {write_reference(run_dir, args.write_reference)}")
    if args.reference is None:
        return 0
    ref = Path(args.reference)
    reference = ref if ref.is_file() else resolve_run_dir(args.reference, args.results_dir)
    comparison = compare_runs(run_dir, reference, tolerance=args.tolerance)
    table = comparison.markdown()
    print(table, end="")
    if args.summary_file is not None:
        with open(args.summary_file, "a", encoding="utf-8") as fh:  # CI summaries accumulate
            fh.write(table + "\n")
    return comparison.exit_code
