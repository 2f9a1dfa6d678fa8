"""`harness compare RUN --reference REF`: per-point changes; exit 1 on a regression, 2 when refused."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.errors import HarnessError
from harness.report.compare import compare_runs, write_reference
from harness.summary import resolve_run_dir


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_ref", metavar="RUN", help="run folder, or a run id under results/")
    parser.add_argument("--reference", metavar="REF", default=None,
                        help="reference: a run folder, a run id under results/, or a reference JSON")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="one relative change allowed for every ratio rule (e.g. 0.10); default: the run's "
                        "own sweep's nightly thresholds, as the nightly gate applies them")
    parser.add_argument("--summary-file", type=Path, default=None,
                        help="also write the markdown table here (e.g. $GITHUB_STEP_SUMMARY)")
    parser.add_argument("--write-reference", type=Path, default=None, metavar="OUT",
                        help="write RUN's metrics as a reference JSON to OUT")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:

    if args.reference is None and args.write_reference is None:
        raise HarnessError("give --reference REF to compare, or --write-reference OUT to write a reference")
    run_dir = resolve_run_dir(args.run_ref)
    if args.write_reference is not None:
        print(f"wrote reference {write_reference(run_dir, args.write_reference)}")
    if args.reference is None:
        return 0
    ref = Path(args.reference)
    reference = ref if ref.is_file() else resolve_run_dir(args.reference)
    comparison = compare_runs(run_dir, reference, tolerance=args.tolerance)
    table = comparison.markdown()
    print(table, end="")
    if args.summary_file is not None:
        with open(args.summary_file, "a", encoding="utf-8") as fh:  # CI summaries accumulate
            fh.write(table + "\n")
    return comparison.exit_code
