"""`python -m harness`: parse, call, print. Each subcommand lives in harness/commands/."""

from __future__ import annotations

import argparse
import importlib
import sys

from harness.errors import HarnessError

# (subcommand, module under harness.commands, one-line help); order is the help order
COMMANDS: list[tuple[str, str, str]] = [
    ("plan", "plan", "print what a sweep will run: server and EvalScope commands, dataset need"),
    ("sweep", "sweep", "run a sweep: servers up, every point with EvalScope, scrapes, run folder"),
    ("dataset", "dataset", "build or verify a padded multi-turn dataset"),
    ("serve-sim", "serve_sim", "serve the simulated engine (OpenAI API + /metrics) on 127.0.0.1"),
    ("simulate", "simulate", "run a sweep on the simulated engine in virtual time"),
    ("calc", "calc", "the blog's concurrency calculator: baseline vs Hybrid HiSparse"),
    ("plot", "plot", "draw the Pareto, occupancy, acceptance and time-series figures of runs"),
    ("report", "report", "write results/<run>/report.md"),
    ("compare", "compare", "compare a run against a reference; exit 1 on regression"),
    ("build", "build", "create and check the server environment a launch profile names"),
]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="harness",
        description="Reproduction and benchmark harness for vLLM's Hybrid HiSparse on GLM-5.3.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name, help_text in COMMANDS:
        try:
            module = importlib.import_module(f"harness.commands.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"harness.commands.{module_name}":
                raise
            continue  # a subcommand not built yet is not offered
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except HarnessError as exc:
        print(f"harness {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"harness {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
