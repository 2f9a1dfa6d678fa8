"""`harness dashboard --store S --out DIR`: the static nightly dashboard (works offline)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.commands import common
from harness.commands.common import CommandArgs, option
from harness.nightly.dashboard import build_dashboard


@dataclass(frozen=True)
class DashboardArgs(CommandArgs):
    store: Path = common.store()
    out: Path = option("--out", "folder to write the site into", type=Path, metavar="DIR", required=True)


def register(parser: argparse.ArgumentParser) -> None:
    DashboardArgs.register(parser, run)


def run(args: DashboardArgs) -> int:

    result = build_dashboard(args.store, args.out)
    for line in result.warnings:
        print(line, file=sys.stderr)
    print(f"wrote {result.index}: {result.night_pages} night(s), {result.charts} chart(s), "
          f"{result.total_bytes / 1024:,.0f} KiB in {args.out}/")
    return 0
