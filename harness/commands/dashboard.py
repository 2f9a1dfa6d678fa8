"""`harness dashboard --store S --out DIR`: the static nightly dashboard (works offline)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.nightly.dashboard import build_dashboard


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", type=Path, required=True, metavar="S", help="history folder")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder to write the site into")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:

    result = build_dashboard(args.store, args.out)
    for line in result.warnings:
        print(line, file=sys.stderr)
    print(f"wrote {result.index}: {result.night_pages} night(s), {result.charts} chart(s), "
          f"{result.total_bytes / 1024:,.0f} KiB in {args.out}/")
    return 0
