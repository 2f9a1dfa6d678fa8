"""Making a server's build ready where the server will run: the environment (made once, cached), the
check that it can run the profile, and the model files the profile generates locally.

The local launcher calls this on the driver before any server starts; the Ray launcher calls it in
the server's actor, on the server's node. Either way the command was rendered by the plan from the
same pure function of the build spec, so the interpreter found here must be the one the plan named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.builds.check import check_build
from harness.builds.envs import BuildEnv, ensure_build
from harness.builds.probe import BuildError, BuildProbe
from harness.builds.tiny_model import ensure_tiny_model, tiny_model_path
from harness.config import LaunchProfile
from harness.support import ResolvedDialect

Progress = Callable[[str], None]


@dataclass(frozen=True)
class PreparedBuild:
    """A build made and checked: its environment, what the check found, and extra server env."""

    env: BuildEnv
    probe: BuildProbe
    model: str
    server_env: dict[str, str] = field(default_factory=dict)

    def provenance(self) -> dict:
        return self.env.provenance()


def ensure_model(profile: LaunchProfile) -> str:
    """The model the server loads; the tiny CPU model is generated where the profile names its path.

    (serve.model is already expanded: vLLM takes a path as given, so `~` is resolved at load.)"""
    if Path(profile.serve.model) == tiny_model_path():
        ensure_tiny_model()
    return profile.serve.model


def prepare_build(profile: LaunchProfile, dialect: ResolvedDialect | None, expected_python: str | None,
                  cache_dir: Path | None = None, progress: Progress = print) -> PreparedBuild:
    """Make (or reuse) and check the profile's build here; refuse a build whose interpreter is not
    the one the plan rendered the server command for."""
    env = ensure_build(profile, cache_dir, progress)
    if expected_python is not None and env.python is not None and env.python != expected_python:
        raise BuildError(f"build {env.spec}: its interpreter here is {env.python}, but the plan rendered the "
                         f"server command for {expected_python}; plan and run with the same cache folder")
    probe = check_build(profile, env, dialect)
    return PreparedBuild(env=env, probe=probe, model=ensure_model(profile))
