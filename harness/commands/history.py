"""`harness history add RUN | list | show NIGHT --store S`: the nightly history store."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import HarnessError
from harness.nightly.changepoint import history_change_points
from harness.nightly.gate import gate_history, gate_night
from harness.nightly.markdown import regression_report
from harness.nightly.night import night_from_run
from harness.nightly.store import NightStore
from harness.results import RunPaths
from harness.summary import resolve_run_dir

if TYPE_CHECKING:
    from harness.nightly.store import NightStore


def register(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="add a run folder to the history as one night",
                             description="add a run folder to the history as one night")
    add.add_argument("run_ref", metavar="RUN", help="run folder, or a run id under results/")
    add.add_argument("--report", type=Path, default=None,
                     help="report file to keep with the night (default: the run's report.md when present)")
    add.add_argument("--figures", type=Path, default=None, metavar="DIR",
                     help="folder whose .svg and .png figures are kept with the night")
    add.add_argument("--replace", action="store_true", help="overwrite the night if it is already stored")
    show = actions.add_parser("show", help="the gate's report of one night against the nights before it",
                              description="the gate's report of one night against the nights before it")
    show.add_argument("night_id", metavar="NIGHT", nargs="?", default=None,
                      help="night id (the run id; default: the latest night)")
    actions.add_parser("list", help="every night: when, what hardware, gate outcome",
                       description="every night: when, what hardware, gate outcome")
    for sub in actions.choices.values():
        sub.add_argument("--store", type=Path, required=True, metavar="S", help="history folder")
        sub.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:

    store = NightStore(args.store)
    return {"add": _add, "list": _list, "show": _show}[args.action](args, store)


def _add(args: argparse.Namespace, store: NightStore) -> int:

    run_dir = resolve_run_dir(args.run_ref)
    report = args.report
    if report is None and RunPaths(run_dir).report_md.is_file():
        report = RunPaths(run_dir).report_md
    figures = sorted(p for p in args.figures.glob("*") if p.suffix in (".svg", ".png")) if args.figures else []
    stored = store.add(night_from_run(run_dir), report=report, figures=figures, replace=args.replace)
    ok = sum(r.status == "ok" for r in stored.rows)
    print(f"added night {stored.night_id} to {store.root}: {ok}/{len(stored.rows)} point(s) ok"
          + (", report kept" if stored.report_path else "") + (f", {len(figures)} figure(s)" if figures else ""))
    return 0


def _list(args: argparse.Namespace, store: NightStore) -> int:

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


def _show(args: argparse.Namespace, store: NightStore) -> int:

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
