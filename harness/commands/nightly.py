"""`harness nightly SWEEP --store S`: one whole night (build, sweep, history, gate, reports, dashboard).

Exit 0 pass, 1 regression, 2 not comparable or an infrastructure failure (docs/nightly.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import typing
from dataclasses import dataclass
from pathlib import Path

from harness.commands import common
from harness.commands.common import CommandArgs, option, positional, progress
from harness.config import load_sweep
from harness.io import display_path
from harness.nightly.gate_markdown import step_summary
from harness.nightly.overrides import Kernels
from harness.nightly.run import REPORT_NAME, NightlyOptions, run_night


@dataclass(frozen=True)
class NightlyArgs(CommandArgs):
    sweep: Path = positional("sweep file, e.g. sweeps/nightly.yaml (its `nightly:` section sets the baseline "
                             "window and thresholds)", type=Path)
    store: Path = common.store()
    simulate: bool = option("--simulate", "run the sweep on the simulated engine in virtual time (seconds; no "
                            "servers, no EvalScope); such nights are compared only with each other",
                            action="store_true", default=False)
    kernels: str | None = option("--kernels", "HiSparse kernels of every vLLM arm tonight: bundled (the "
                                 "harness's module) or vllm (the build's own); default: each launch profile's "
                                 "build.kernels", choices=typing.get_args(Kernels))
    vllm_ref: str | None = option("--vllm-ref", "build every vLLM arm from REF tonight: a commit or branch of "
                                  "the profile's repository, or a whole spec (owner/vllm@ref, ==0.33.0)",
                                  metavar="REF")
    deployments: tuple[str, ...] = option("--deployment", "run only this deployment (repeatable); the gate "
                                          "reports the others as missing", metavar="NAME", repeat=True)
    run_id: str | None = common.run_id("the night's run folder and night id (default: sweep name + UTC time); "
                                       "an existing run folder is resumed")
    results_dir: Path = common.results_dir()
    launcher: str = common.launcher()
    ray_gpus: int | None = common.ray_gpus()
    envs_dir: Path | None = common.envs_dir()
    clients_dir: Path | None = common.clients_dir()
    out: Path = option("--out", "where the dashboard is written (default: site)", type=Path, metavar="DIR",
                       default=Path("site"), deprecated=("--site",))
    no_dashboard: bool = option("--no-dashboard", "do not write the dashboard", action="store_true", default=False,
                                deprecated=("--no-site",))
    regression_report: Path | None = option("--regression-report", "the regression report, shaped as an issue "
                                            f"(default: <run folder>/{REPORT_NAME})", type=Path, metavar="FILE",
                                            deprecated=("--report",))
    no_report: bool = common.no_report()


def register(parser: argparse.ArgumentParser) -> None:
    NightlyArgs.register(parser, run)


def run(args: NightlyArgs) -> int:
    loaded = load_sweep(args.sweep)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    options = NightlyOptions(
        store=args.store, run_id=args.run_id, results_root=args.results_dir, simulate=args.simulate,
        launcher=args.launcher, ray_gpus=args.ray_gpus, envs_dir=args.envs_dir, clients_dir=args.clients_dir,
        kernels=args.kernels, vllm_ref=args.vllm_ref, deployments=args.deployments, figures=not args.no_report,
        site_dir=None if args.no_dashboard else args.out, report_path=args.regression_report,
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
