"""Reading the YAML files: `extends`, paths relative to the file, one-line errors.

A user never sees a pydantic or YAML traceback: every problem becomes one
`ConfigError` line naming the file and the field path.
"""

from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from harness.config.profile import LaunchProfile
from harness.config.recipe import DatasetRecipe
from harness.config.sweep import SweepFile
from harness.errors import HarnessError
from harness.io import display_path
from harness.schema import deprecations


class ConfigError(HarnessError):
    """A configuration problem, rendered as one line: `file: field.path: message`."""

    def __init__(self, file: Path | str | None, message: str, field_path: str = ""):
        self.file = Path(file) if file is not None else None
        self.field_path = field_path
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = []
        if self.file is not None:
            parts.append(display_path(self.file))
        if self.field_path:
            parts.append(self.field_path)
        parts.append(self.message)
        return ": ".join(parts)



def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """The YAML document at `path` as a mapping, or a one-line ConfigError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(path, f"no such file {display_path(path)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, f"cannot read: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(path, f"{where}invalid YAML: {problem}") from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise ConfigError(path, f"invalid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, f"expected a mapping at the top level, got {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(path, f"keys must be strings, got {key!r}")
    return data


def _loc_to_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # pydantic adds the tag of a function validator as a loc part; it means nothing to a user
            if str(part).startswith(("function-", "lax-or-strict", "json-or-python")):
                continue
            out += ("." if out else "") + str(part)
    return out


def _first_error(path: Path, exc: ValidationError) -> ConfigError:
    err = exc.errors(include_url=False)[0]
    msg = str(err.get("msg", "invalid"))
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if err.get("type") == "extra_forbidden":
        msg = "unknown key (not part of this file's schema)"
    elif err.get("type") == "missing":
        msg = "required field is missing"
    elif "input" in err and err.get("type", "").endswith(("_type", "_parsing")):
        msg = f"{msg} (got {err['input']!r})"[:300]
    more = len(exc.errors()) - 1
    if more > 0:
        msg += f" (and {more} more problem{'s' if more > 1 else ''})"
    return ConfigError(path, msg.replace("\n", " "), _loc_to_path(tuple(err.get("loc", ()))))


# Files whose deprecated spellings were already reported by this process (each is said once).
_REPORTED: set[tuple[str, str]] = set()


def _validate(model: type[BaseModel], data: dict[str, Any], path: Path) -> Any:
    try:
        with deprecations() as notes:
            validated = model.model_validate(data, context={"base_dir": Path(path).resolve().parent})
    except ValidationError as exc:
        raise _first_error(path, exc) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise ConfigError(path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    for note in notes:
        if (str(path), note) not in _REPORTED:
            _REPORTED.add((str(path), note))
            print(f"{display_path(path)}: deprecated: {note}", file=sys.stderr)
    return validated


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge mappings; lists and scalars replace; an explicit null removes the key."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _launch_data(path: Path, chain: tuple[Path, ...], files: list[Path]) -> dict[str, Any]:
    data = read_yaml_mapping(path)
    files.append(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(path, "must be a path to another launch profile", "extends")
    parent_path = Path(os.path.normpath(path.resolve().parent / parent))
    if parent_path in chain:
        raise ConfigError(path, f"extends cycle through {display_path(parent_path)}", "extends")
    if not parent_path.exists():
        raise ConfigError(path, f"no such file {display_path(parent_path)}", "extends")
    return _merge(_launch_data(parent_path, (*chain, parent_path), files), data)


@dataclass(frozen=True)
class LoadedLaunch:
    path: Path
    profile: LaunchProfile
    files: tuple[Path, ...]  # the profile and everything it extends


@dataclass(frozen=True)
class LoadedRecipe:
    path: Path
    recipe: DatasetRecipe


@dataclass(frozen=True)
class LoadedSweep:
    path: Path
    sweep: SweepFile
    recipe: LoadedRecipe
    launches: dict[str, LoadedLaunch]  # by deployment name
    files: tuple[Path, ...] = field(default=())  # every config file read, for provenance

    def launch_for(self, deployment: str) -> LaunchProfile:
        return self.launches[deployment].profile

    @property
    def dataset_recipe(self) -> DatasetRecipe:
        return self.recipe.recipe


def load_launch(path: Path | str) -> LoadedLaunch:
    path = Path(path).resolve()
    files: list[Path] = []
    data = _launch_data(path, (path,), files)
    profile = _validate(LaunchProfile, data, path)
    return LoadedLaunch(path=path, profile=profile, files=tuple(files))


def load_recipe(path: Path | str) -> LoadedRecipe:
    path = Path(path).resolve()
    return LoadedRecipe(path=path, recipe=_validate(DatasetRecipe, read_yaml_mapping(path), path))


def load_sweep(path: Path | str) -> LoadedSweep:
    path = Path(path).resolve()
    sweep: SweepFile = _validate(SweepFile, read_yaml_mapping(path), path)
    recipe = load_recipe(sweep.dataset)
    launches: dict[str, LoadedLaunch] = {}
    files = [path, recipe.path]
    for i, dep in enumerate(sweep.deployments):
        loaded = load_launch(dep.launch)
        gpus = loaded.profile.serve.gpus
        if loaded.profile.engine == "vllm" and gpus != sweep.gpus_per_server:
            raise ConfigError(path, f"gpus_per_server is {sweep.gpus_per_server} but "
                              f"{display_path(loaded.path)} uses {gpus} GPUs (TP x DP x PP)",
                              f"deployments[{i}].launch")
        launches[dep.name] = loaded
        files.extend(f for f in loaded.files if f not in files)
    return LoadedSweep(path=path, sweep=sweep, recipe=recipe, launches=launches, files=tuple(files))

