"""What every command shares: one typed options class per command, whose fields make its flags.

A command declares a frozen dataclass of `CommandArgs` whose fields carry their flag (the metadata of
`option()` / `positional()`); `add_cli_args` adds exactly those flags to its parser and `from_cli_args`
builds the options from the parsed namespace, so a flag and the field it fills cannot drift (vLLM's
`benchmarks/sweep` pattern). Flags several commands take are declared once, below (`results_dir()`,
`launcher()`, ...), so one concept has one spelling everywhere: `--out` for what a command writes,
`--results-dir` for where run folders are, `--envs-dir` and `--clients-dir` for the build caches. An old
spelling stays accepted for a release and says, on stderr, which flag replaced it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from harness.config import Dialect

DIALECT_CHOICES = typing.get_args(Dialect)
T = TypeVar("T", bound="CommandArgs")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def option(flag: str, help: str, *, default: Any = None, type: Callable[[str], Any] | None = None,
           metavar: str | None = None, choices: Sequence[str] | None = None, action: str | None = None,
           required: bool = False, deprecated: Sequence[str] = (), repeat: bool = False) -> Any:
    """A dataclass field that is the flag `flag` (and, for a while, its deprecated spellings)."""
    spec = {"flag": flag, "help": help, "type": type, "metavar": metavar, "choices": choices, "action": action,
            "required": required, "deprecated": tuple(deprecated), "repeat": repeat}
    if repeat:
        return dataclasses.field(default_factory=tuple, metadata={"cli": spec})
    return dataclasses.field(default=default, metadata={"cli": spec})


def positional(help: str, *, metavar: str | None = None, type: Callable[[str], Any] | None = None,
               nargs: str | None = None) -> Any:
    """A dataclass field that is a positional argument."""
    spec = {"positional": True, "help": help, "type": type, "metavar": metavar, "nargs": nargs}
    return dataclasses.field(default=None, metadata={"cli": spec})


class CommandArgs:
    """Base of the per-command options classes (frozen dataclasses)."""

    command: ClassVar[str] = ""

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            spec = f.metadata.get("cli")
            if spec is None:
                continue
            if spec.get("positional"):
                kwargs = {k: spec[k] for k in ("help", "type", "metavar", "nargs") if spec.get(k) is not None}
                parser.add_argument(f.name, **kwargs)
                continue
            kwargs = {"dest": f.name, "help": spec["help"]}
            if spec["action"]:
                kwargs["action"] = spec["action"]
            elif spec["repeat"]:
                kwargs.update(action="append", default=[], metavar=spec["metavar"], type=spec["type"])
            else:
                kwargs.update({k: spec[k] for k in ("type", "metavar", "choices") if spec[k] is not None})
                kwargs["default"] = f.default
            if spec["required"]:
                kwargs["required"] = True
            kwargs = {k: v for k, v in kwargs.items() if v is not None}
            parser.add_argument(spec["flag"], **kwargs)
            for old in spec["deprecated"]:
                hidden = {k: v for k, v in kwargs.items() if k not in ("help", "required", "default")}
                parser.add_argument(old, **{**hidden, "dest": f"_deprecated_{f.name}_{old.lstrip('-')}",
                                            "help": argparse.SUPPRESS, "default": None})

    @classmethod
    def from_cli_args(cls: type[T], ns: argparse.Namespace) -> T:
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            spec = f.metadata.get("cli") or {}
            value = getattr(ns, f.name, f.default)
            for old in spec.get("deprecated", ()):
                given = getattr(ns, f"_deprecated_{f.name}_{old.lstrip('-')}", None)
                if given not in (None, False, []):
                    print(f"harness {ns.command}: {old} is deprecated; use {spec['flag']}", file=sys.stderr)
                    value = given
            if spec.get("repeat"):
                value = tuple(value or ())
            values[f.name] = value
        return cls(**values)

    @classmethod
    def register(cls, parser: argparse.ArgumentParser, run: Callable[[Any], int]) -> None:
        """Add the flags and call `run` with the typed options."""
        cls.add_cli_args(parser)
        parser.set_defaults(run=lambda ns: run(cls.from_cli_args(ns)))


# ---- flags several commands share: declared once ----------------------------------------------------

def results_dir() -> Any:
    return option("--results-dir", "where run folders are (default: results); a RUN may be a run id in it",
                  default=Path("results"), type=Path, metavar="DIR")


def run_id(help: str = "name of the run folder; an existing one is resumed (default: sweep name + UTC time)") -> Any:
    return option("--run-id", help)


def launcher() -> Any:
    return option("--launcher", "ray (default; RAY_ADDRESS or a local Ray) or local subprocesses",
                  default="ray", choices=("ray", "local"))


def ray_gpus() -> Any:
    return option("--ray-gpus", "GPUs a locally started Ray declares (e.g. fake ones on a CPU-only host)",
                  type=int, metavar="N")


def dialect(what: str) -> Any:
    return option("--dialect", f"vLLM dialect to {what} (default: the profile's)", choices=DIALECT_CHOICES)


def no_report() -> Any:
    return option("--no-report", "skip the figures and report.md at the end (write them later with "
                  "`harness report`)", action="store_true", default=False)


def envs_dir() -> Any:
    return option("--envs-dir", "where server environments are built and reused (default "
                  "~/.cache/hisparse-harness/envs)", type=Path, metavar="DIR", deprecated=("--cache-dir",))


def clients_dir() -> Any:
    return option("--clients-dir", "where pinned EvalScope clients are built and reused (default "
                  "~/.cache/hisparse-harness/clients)", type=Path, metavar="DIR")


def store() -> Any:
    return option("--store", "history folder (created if new)", type=Path, metavar="S", required=True)
