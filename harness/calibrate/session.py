"""A calibration from start to profile: the targets of a run or a measurement table, the coefficients read
straight off the data (MTP acceptance, how long a re-sent reply is), the fit, and the calibrated hardware
profile with the source of every coefficient."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from harness.calibrate.coefficients import COEFFICIENTS, parse_fit
from harness.calibrate.fit import FitResult, Target, fit
from harness.calibrate.observed import ObservedRun, parse_point_names
from harness.calibrate.predict import PointSetup, recipe_shapes
from harness.calibrate.table import MeasurementTable, table_targets
from harness.config import DatasetRecipe, LaunchProfile
from harness.config.sim import SimSettings
from harness.errors import HarnessError
from harness.io import display_path
from harness.sim.engine_config import draft_acceptance_for_mean
from harness.sim.profiles import (
    Calibration,
    HardwareProfile,
    ModelProfile,
    load_hardware_profile,
    load_model_profile,
)
from harness.sim.virtual import GENERATION_PROMPT_TOKENS, TEMPLATE_PREFIX_TOKENS, shapes_from_recipe

# the engine's own quantities, and how much each counts (docs/calibration.md: why not the client's TPOT)
RUN_QUANTITIES = (("tpot_ms", 1.0), ("prefill_ms", 0.5))


@dataclass(frozen=True)
class ProfileChoice:
    """Which simulator profiles describe the run's arms (default: each launch profile's `sim:` section)."""

    model_profile: str | None = None
    hardware_profile: str | None = None


@dataclass(frozen=True)
class Calibrated:
    profile: HardwareProfile
    result: FitResult


def sim_settings_for(profile: LaunchProfile, choice: ProfileChoice) -> SimSettings:
    sim = profile.sim or SimSettings()
    update = {k: v for k, v in (("model_profile", choice.model_profile),
                                ("hardware_profile", choice.hardware_profile)) if v is not None}
    return sim.model_copy(update=update)


def run_setups(run: ObservedRun, names: Sequence[str], choice: ProfileChoice,
               hardware_path: str | None = None) -> dict[str, PointSetup]:
    """Each named point as the sweep ran it, described by the chosen simulator profiles."""
    setups = {}
    recipe = run.loaded.dataset_recipe
    for name in names:
        deployment, spec, offset = run.point_spec(name)
        launch = run.loaded.launch_for(deployment)
        sim = sim_settings_for(launch, choice)
        if hardware_path is not None:
            sim = sim.model_copy(update={"hardware_profile": hardware_path})
        setups[name] = PointSetup(name=name, profile=launch.model_copy(update={"sim": sim}),
                                  model=load_model_profile(sim.model_profile),
                                  shapes=recipe_shapes(recipe, offset, spec.conversations), concurrency=spec.concurrency,
                                  conversations=spec.conversations, max_tokens=run.loaded.sweep.client.max_tokens)
    return setups


def _recipe_mean_prompt(recipe: DatasetRecipe, reply_tokens: float) -> float:
    """The mean prompt of a conversation's turns when each re-sent reply takes `reply_tokens` tokens."""
    turns = shapes_from_recipe(recipe, 1)[0].turn_tokens
    prompts, history = [], float(TEMPLATE_PREFIX_TOKENS)
    for turn in turns:
        prompt = history + turn + GENERATION_PROMPT_TOKENS
        prompts.append(prompt)
        history = prompt + reply_tokens
    return statistics.fmean(prompts)


def reply_history_ratio(run: ObservedRun, names: Sequence[str]) -> float | None:
    """Tokens a re-sent reply takes per generated token, from the prompts EvalScope recorded: the mean
    prompt is linear in it, so one measured mean gives it (multi-turn runs with fixed-length replies)."""
    recipe = run.loaded.dataset_recipe
    output = run.loaded.sweep.client.max_tokens
    clients = [run.points[n].client for n in names]
    if recipe.num_turns < 2 or any(c is None or set(c.completion_tokens) != {output} for c in clients):
        return None
    measured = statistics.fmean(c.mean_prompt_tokens for c in clients if c is not None)
    at_zero, at_one = _recipe_mean_prompt(recipe, 0.0), _recipe_mean_prompt(recipe, float(output))
    return (measured - at_zero) / (at_one - at_zero)


def _direct_run_values(run: ObservedRun, names: Sequence[str], setups: dict[str, PointSetup]) -> dict[str, tuple[float, str]]:
    values: dict[str, tuple[float, str]] = {}
    ratio = reply_history_ratio(run, names)
    if ratio is not None:
        values["reply_history_ratio"] = (round(ratio, 4), "measured: EvalScope's recorded prompt tokens "
                                         f"(benchmark_data.db) at {', '.join(names)} against the recipe's turns")
    lengths = [run.points[n].record.metrics.mtp_acceptance_length for n in names
               if run.points[n].record.metrics and run.points[n].record.metrics.mtp_acceptance_length]
    ks = {s.profile.speculative.num_speculative_tokens for s in setups.values() if s.profile.speculative}
    if lengths and len(ks) == 1:
        mean_length = statistics.fmean(lengths)
        values["mtp_draft_acceptance"] = (round(draft_acceptance_for_mean(mean_length, ks.pop()), 4),
                                          f"measured: spec-decode counters, mean acceptance length {mean_length:.3f}")
    return values


def _models(setups: dict[str, PointSetup]) -> ModelProfile:
    models = {s.model.name: s.model for s in setups.values()}
    if len(models) != 1:
        raise HarnessError(f"the calibration points use different model profiles ({', '.join(models)}); "
                           "calibrate one model at a time (--points)")
    return next(iter(models.values()))


def calibrate_run(run: ObservedRun, points: str | None, fit_names: str | None, choice: ProfileChoice,
                  progress: Callable[[str], None]) -> Calibrated:
    names = parse_point_names(points, run) if points else list(run.points)
    setups = run_setups(run, names, choice)
    _models(setups)
    hardware_names = {s.profile.sim.hardware_profile for s in setups.values() if s.profile.sim}
    if len(hardware_names) != 1:
        raise HarnessError(f"the calibration points name different hardware profiles ({', '.join(hardware_names)})")
    base = load_hardware_profile(hardware_names.pop())
    direct = _direct_run_values(run, names, setups)
    base = base.model_copy(update={k: v for k, (v, _) in direct.items()})
    hit_rates = any(run.points[n].value("hisparse_hit_rate") for n in names)
    extra = ["hisparse_miss_rate", "h2d_bytes_per_s"] if hit_rates else []
    targets = [Target(setups[n], q, run.points[n].value(q), w) for n in names for q, w in RUN_QUANTITIES
               if run.points[n].value(q)]
    if hit_rates:
        targets += [Target(setups[n], "hisparse_hit_rate", run.points[n].value("hisparse_hit_rate"))
                    for n in names if run.points[n].value("hisparse_hit_rate")]
    result = fit(targets, base, parse_fit(fit_names, extra), progress=progress)
    source = display_path(run.run_dir)
    calibration = Calibration(
        source=source, source_kind="run", run_id=run.manifest.run_id, sweep=run.manifest.sweep_path, points=names,
        method=result.method, fitted=list(result.names), direct={k: why for k, (_, why) in direct.items()},
        cost=result.cost, fit=list(result.rows), created_at=datetime.now(UTC).isoformat(timespec="seconds"))
    return Calibrated(profile=_finish(result, base, calibration, f"run {run.manifest.run_id} ({', '.join(names)})",
                                      direct), result=result)


def calibrate_table(table: MeasurementTable, source: Path, fit_names: str | None,
                    progress: Callable[[str], None]) -> Calibrated:
    base = load_hardware_profile(table.hardware_profile)
    targets = table_targets(table)
    result = fit(targets, base, parse_fit(fit_names), progress=progress)
    calibration = Calibration(
        source=display_path(source), source_kind="measurements", points=[m.id for m in table.measurements],
        method=result.method, fitted=list(result.names), cost=result.cost, fit=list(result.rows),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"))
    return Calibrated(profile=_finish(result, base, calibration, f"{display_path(source)} "
                                      f"({len(table.measurements)} public measurements)", {}), result=result)


def _finish(result: FitResult, base: HardwareProfile, calibration: Calibration, what: str,
            direct: dict[str, tuple[float, str]]) -> HardwareProfile:
    sources = dict(base.sources)
    for name in result.names:
        sources[name] = f"calibrated: least squares on {what}; {COEFFICIENTS[name].meaning}"
    for name, (_, why) in direct.items():
        sources[name] = why
    return result.hardware.model_copy(update={"sources": sources, "calibration": calibration})
