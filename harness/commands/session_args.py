"""What the commands that run a session share (`sweep`, `capacity`, `simulate`): their common flags and how a
finished run is printed. Apart from harness/commands/common.py so that commands which never start a session
(serve-sim above all: one per simulated server) do not import the run stack."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from harness.commands.common import (
    CommandArgs,
    clients_dir,
    dialect,
    envs_dir,
    launcher,
    no_report,
    ray_gpus,
    results_dir,
    run_id,
)
from harness.session import SessionOptions, SessionResult


@dataclasses.dataclass(frozen=True)
class ServedRunArgs(CommandArgs):
    """The flags of every command that starts a sweep's servers (`sweep`, `capacity`), declared once."""

    run_id: str | None = run_id()
    launcher: str = launcher()
    dialect: str | None = dialect("render HiSparse flags for")
    ray_gpus: int | None = ray_gpus()
    results_dir: Path = results_dir()
    envs_dir: Path | None = envs_dir()
    clients_dir: Path | None = clients_dir()
    no_report: bool = no_report()

    def session_options(self, **more: Any) -> SessionOptions:
        return SessionOptions(run_id=self.run_id, results_root=self.results_dir, launcher=self.launcher,
                              dialect=self.dialect, ray_gpus=self.ray_gpus, envs_dir=self.envs_dir,
                              clients_dir=self.clients_dir, outputs=not self.no_report, **more)


def print_run_end(result: SessionResult, headline: str) -> None:
    """What a finished run prints last: failures, its headline, the report's warnings, where its outputs are."""
    for failure in result.failures:
        print(f"  failed: {failure}", file=sys.stderr)
    print(headline)
    for line in result.outputs.warnings:
        print(line, file=sys.stderr)
    for line in result.outputs.lines():
        print(line)
