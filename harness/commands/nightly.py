"""`harness nightly SWEEP --store S`: one whole night (build, sweep, history, gate, reports, dashboard).

Exit 0 pass, 1 regression, 2 not comparable or an infrastructure failure (docs/nightly.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import typing
from pathlib import Path

from harness.commands.common import add_no_report, add_results_dir, progress
from harness.config import load_sweep
from harness.io import display_path
from harness.nightly.markdown import step_summary
from harness.nightly.overrides import Kernels
from harness.nightly.run import REPORT_NAME, NightlyOptions, run_night


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", type=Path, help="sweep file, e.g. sweeps/nightly.yaml (its `nightly:` section "
                        "sets the baseline window and thresholds)")
    parser.add_argument("--store", type=Path, required=True, metavar="S", help="history folder (created if new)")
    parser.add_argument("--simulate", action="store_true",
                        help="run the sweep on the simulated engine in virtual time (seconds; no servers, no "
                        "EvalScope); such nights are compared only with each other")
    parser.add_argument("--kernels", choices=typing.get_args(Kernels), default=None,
                        help="HiSparse kernels of every vLLM arm tonight: bundled (the harness's module) or "
                        "vllm (the build's own); default: each launch profile's build.kernels")
    parser.add_argument("--vllm-ref", default=None, metavar="REF",
                        help="build every vLLM arm from REF tonight: a commit or branch of the profile's "
                        "repository, or a whole spec (owner/vllm@ref, ==0.33.0)")
    parser.add_argument("--deployment", dest="deployments", action="append", default=[], metavar="NAME",
                        help="run only this deployment (repeatable); the gate reports the others as missing")
    parser.add_argument("--run-id", default=None, help="the night's run folder and night id "
                        "(default: sweep name + UTC time); an existing run folder is resumed")
    add_results_dir(parser)
    parser.add_argument("--launcher", choices=["ray", "local"], default="ray",
                        help="ray (default; RAY_ADDRESS or a local Ray) or local subprocesses")
    parser.add_argument("--ray-gpus", type=int, default=None, metavar="N",
                        help="GPUs a locally started Ray declares (e.g. fake ones on a CPU-only host)")
    parser.add_argument("--site", type=Path, default=Path("site"), metavar="DIR",
                        help="where the dashboard is written (default: site)")
    parser.add_argument("--no-site", action="store_true", help="do not write the dashboard")
    parser.add_argument("--report", type=Path, default=None, metavar="FILE",
                        help=f"the regression report, shaped as an issue (default: <run folder>/{REPORT_NAME})")
    add_no_report(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    loaded = load_sweep(args.sweep)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    options = NightlyOptions(
        store=args.store, run_id=args.run_id, results_root=args.results_dir, simulate=args.simulate,
        launcher=args.launcher, ray_gpus=args.ray_gpus, kernels=args.kernels, vllm_ref=args.vllm_ref,
        deployments=tuple(args.deployments), figures=not args.no_report,
        site_dir=None if args.no_site else args.site, report_path=args.report,
        step_summary_path=Path(summary) if summary else None)
    outcome = run_night(loaded, options, progress=progress)
    for line in outcome.warnings:
        print(line, file=sys.stderr)
    print()
    print(step_summary(outcome.result, outcome.night, outcome.change_points), end="")
    print(f"\nreport: {display_path(outcome.report_path)}")
    if outcome.dashboard is not None:
        print(f"dashboard: {display_path(outcome.dashboard.index)} ({outcome.dashboard.night_pages} night(s), "
              f"{outcome.dashboard.charts} chart(s))")
    print(f"nightly: {outcome.result.outcome} (exit {outcome.exit_code}) in {outcome.wall_s:.0f} s")
    return outcome.exit_code
