"""`python -m harness`: parse, call, print. Each subcommand lives in harness/commands/.

Only the chosen subcommand's module is imported (the others may pull heavy libraries), and a
module that fails to import is reported as a broken install, never hidden. SIGINT and SIGTERM
are handled from the first line, whatever the parent process left them as (a shell script's
background job inherits SIGINT ignored), so every command stops cleanly.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from harness.errors import HarnessError, Interrupted

# (subcommand, module under harness.commands, one-line help); order is the help order
COMMANDS: list[tuple[str, str, str]] = [
    ("plan", "plan", "print what a sweep will run: server and EvalScope commands, dataset need"),
    ("sweep", "sweep", "run a sweep: servers up, every point with EvalScope, scrapes, run folder, report"),
    ("dataset", "dataset", "build or verify a padded multi-turn dataset"),
    ("serve-sim", "serve_sim", "serve the simulated engine (OpenAI API + /metrics) on 127.0.0.1"),
    ("simulate", "simulate", "run a sweep on the simulated engine in virtual time"),
    ("capacity", "capacity", "per arm and context, the largest concurrency that keeps every request running"),
    ("calibrate", "calibrate", "fit the simulated engine to a measured run or public measurements; --validate"),
    ("calc", "calc", "the blog's concurrency calculator: baseline vs Hybrid HiSparse"),
    ("plot", "plot", "draw the Pareto, occupancy, acceptance and time-series figures of runs"),
    ("report", "report", "write results/<run>/report.md"),
    ("compare", "compare", "compare a run against a reference; exit 1 on regression"),
    ("build", "build", "create and check the server environment a launch profile names"),
    ("lock", "lock", "re-resolve the locks of every environment the harness builds (the refresh path)"),
    ("fetch", "fetch", "put a profile's or sweep's model weights on every node that will run a server"),
    ("history", "history", "the nightly history: add a run as a night, list nights, show a night's gate report"),
    ("dashboard", "dashboard", "write the static nightly dashboard of a history (works offline)"),
    ("nightly", "nightly", "one nightly night: build, sweep, history, gate, reports, dashboard; exit 0/1/2"),
]


def _install_signal_handlers() -> None:
    """SIGINT and SIGTERM raise Interrupted in the main thread (exit 130 / 143 after cleanup)."""
    def interrupt(signum, _frame):
        raise Interrupted(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, interrupt)


def _chosen(argv: list[str]) -> str | None:
    """The subcommand argparse will pick: the first argument that is not an option."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if first in {name for name, _, _ in COMMANDS} else None


def _parser(chosen: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="harness",
        description="Reproduction and benchmark harness for vLLM's Hybrid HiSparse on GLM-5.3.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name, help_text in COMMANDS:
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            try:
                module = importlib.import_module(f"harness.commands.{module_name}")
            except ImportError as exc:
                raise BrokenCommand(name, exc) from exc
            module.register(sub)
    return parser


class BrokenCommand(Exception):
    def __init__(self, name: str, exc: ImportError):
        super().__init__(f"harness {name}: this command cannot load (a broken install?): "
                         f"{type(exc).__name__}: {exc}")


def main(argv: list[str] | None = None) -> int:
    _install_signal_handlers()
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = _parser(_chosen(argv))
    except BrokenCommand as exc:
        print(exc, file=sys.stderr)
        return 1
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except HarnessError as exc:
        print(f"harness {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        print(f"harness {args.command}: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
        return 128 + int(signum)
    except BrokenPipeError:
        return 0
