"""`harness history add RUN | list | show NIGHT --store S`: the nightly history store."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.commands import common
from harness.commands.common import CommandArgs, option, positional
from harness.errors import HarnessError
from harness.nightly.changepoint import history_change_points
from harness.nightly.gate import gate_history, gate_night
from harness.nightly.gate_markdown import regression_report
from harness.nightly.night import night_from_run
from harness.nightly.store import NightStore
from harness.results import RunPaths
from harness.summary import resolve_run_dir


@dataclass(frozen=True)
class HistoryAddArgs(CommandArgs):
    run_ref: str = positional("run folder, or a run id in --results-dir", metavar="RUN")
    report: Path | None = option("--report", "report file to keep with the night (default: the run's report.md "
                                 "when present)", type=Path, metavar="FILE")
    figures: Path | None = option("--figures", "folder whose .svg and .png figures are kept with the night",
                                  type=Path, metavar="DIR")
    replace: bool = option("--replace", "overwrite the night if it is already stored", action="store_true",
                           default=False)
    store: Path = common.store()
    results_dir: Path = common.results_dir()


@dataclass(frozen=True)
class HistoryShowArgs(CommandArgs):
    night_id: str | None = positional("night id (the run id; default: the latest night)", metavar="NIGHT",
                                      nargs="?")
    store: Path = common.store()


@dataclass(frozen=True)
class HistoryListArgs(CommandArgs):
    store: Path = common.store()


ACTIONS = {"add": (HistoryAddArgs, "add a run folder to the history as one night"),
           "show": (HistoryShowArgs, "the gate's report of one night against the nights before it, judged with "
                    "the settings it was recorded with"),
           "list": (HistoryListArgs, "every night: when, what hardware, gate outcome")}


def register(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, (args_class, help_text) in ACTIONS.items():
        sub = actions.add_parser(name, help=help_text, description=help_text)
        run = {"add": _add, "show": _show, "list": _list}[name]
        args_class.register(sub, run)


def _add(args: HistoryAddArgs) -> int:
    store = NightStore(args.store)
    run_dir = resolve_run_dir(args.run_ref, args.results_dir)
    report = args.report
    if report is None and RunPaths(run_dir).report_md.is_file():
        report = RunPaths(run_dir).report_md
    figures = sorted(p for p in args.figures.glob("*") if p.suffix in (".svg", ".png")) if args.figures else []
    stored = store.add(night_from_run(run_dir), report=report, figures=figures, replace=args.replace)
    ok = sum(r.status == "ok" for r in stored.rows)
    print(f"added night {stored.night_id} to {store.root}: {ok}/{len(stored.rows)} point(s) ok"
          + (", report kept" if stored.report_path else "") + (f", {len(figures)} figure(s)" if figures else ""))
    return 0


def _list(args: HistoryListArgs) -> int:
    store = NightStore(args.store)
    history = store.load()
    for line in history.warnings:
        print(line, file=sys.stderr)
    if not history.nights:
        print(f"{store.root}: no nights yet")
        return 0
    results = gate_history(history.nights)
    print(f"{'night':<40} {'started':<20} {'hardware':<18} {'points':>7}  gate")
    for night, result in zip(history.nights, results, strict=True):
        hardware = "simulated" if night.simulated else f"{night.gpu.count or '?'}x {night.gpu.model or '?'}"
        ok = sum(r.status == "ok" for r in night.rows)
        print(f"{night.night_id:<40} {night.started_at or '-':<20} {hardware:<18} {ok:>3}/{len(night.rows):<3}  "
              f"{result.outcome}" + (f" ({len(result.findings)} finding(s))" if result.findings else ""))
    return 0


def _show(args: HistoryShowArgs) -> int:
    store = NightStore(args.store)
    history = store.load()
    for line in history.warnings:
        print(line, file=sys.stderr)
    if args.night_id is None and not history.nights:
        raise HarnessError(f"{store.root}: no nights in the history yet")
    night = store.get(args.night_id) if args.night_id else history.nights[-1]
    result = gate_night(night, history.before(night))
    changes = [c for c in history_change_points(history.nights) if c.night_id == night.night_id]
    print(regression_report(result, night, changes), end="")
    return 0
