"""`harness calibrate RUN|TABLE --out PROFILE`: fit the simulated engine's coefficients to a measured run
(or a table of public measurements), write the calibrated profile; `--validate` simulates the run's
whole sweep with it and compares every point."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from harness.calibrate.observed import parse_point_names, read_run
from harness.calibrate.output import write_profile
from harness.calibrate.session import ProfileChoice, calibrate_run, calibrate_table
from harness.calibrate.table import load_table
from harness.calibrate.validate import validate_run, validation_table
from harness.commands import common
from harness.commands.common import CommandArgs, option, positional, progress
from harness.errors import HarnessError
from harness.io import display_path
from harness.session import close_run
from harness.sim.profiles import CoefficientFit


@dataclass(frozen=True)
class CalibrateArgs(CommandArgs):
    source: Path = positional("a measured run folder (results/<run>), or a table of public measurements (.yaml, "
                              "e.g. harness/data/measurements/h200-public.yaml)", type=Path)
    out: Path = option("--out", "the calibrated profile to write (.yaml)", type=Path, metavar="FILE", required=True)
    points: str | None = option("--points", "the run's points to fit, e.g. cpu-baseline:c1,cpu-baseline:c4 "
                                "(default: every ok point); the others are held out")
    fit: str | None = option("--fit", "coefficients to fit, comma-separated (default: the step-time ones, plus "
                             "HiSparse's where the run has its counters)")
    model_profile: str | None = option("--model-profile", "the simulator's model profile for the run's arms "
                                       "(default: each launch profile's sim.model_profile)")
    hardware_profile: str | None = option("--hardware-profile", "the hardware profile to start from (default: "
                                          "each launch profile's sim.hardware_profile)")
    validate: bool = option("--validate", "simulate the run's whole sweep with the calibrated profile, compare "
                            "every point, and write the comparison into the profile", action="store_true",
                            default=False)
    run_id: str | None = common.run_id("the validation run's folder name (default: <run>-validate)")
    results_dir: Path = common.results_dir()


def register(parser: argparse.ArgumentParser) -> None:
    CalibrateArgs.register(parser, run)


def _fit_lines(rows: list[CoefficientFit]) -> list[str]:
    return [f"  {r.point:28s} {r.quantity:12s} measured {r.measured:12.4g}  predicted {r.predicted:12.4g}  "
            f"{100 * r.rel_error:+6.1f}%" + ("" if r.weight else "  (compared, not fitted)") for r in rows]


def run(args: CalibrateArgs) -> int:
    source: Path = args.source
    if args.out.suffix not in (".yaml", ".yml"):
        raise HarnessError(f"--out {args.out}: a calibrated profile is a .yaml file")
    if source.is_file():
        if args.validate or args.points:
            raise HarnessError(f"{source}: --validate and --points need a measured run folder, not a table")
        calibrated = calibrate_table(load_table(source), source, args.fit, progress)
        run_data = None
    else:
        run_data = read_run(source)
        choice = ProfileChoice(model_profile=args.model_profile, hardware_profile=args.hardware_profile)
        calibrated = calibrate_run(run_data, args.points, args.fit, choice, progress)
    profile, result = calibrated.profile.model_copy(update={"name": args.out.stem}), calibrated.result
    write_profile(profile, args.out)
    print("calibrate: " + ", ".join(f"{n} = {v:.4g}" for n, v in zip(result.names, result.values, strict=True)))
    for name, why in (profile.calibration.direct.items() if profile.calibration else ()):
        print(f"calibrate: {name} = {getattr(profile, name):.4g} ({why})")
    print(f"calibrate: fit error per point ({result.evaluations} simulations, cost {result.cost:.4f}):")
    print("\n".join(_fit_lines(list(result.rows))))
    print(f"calibrate: wrote {display_path(args.out)}")
    if not args.validate or run_data is None:
        return 0
    points = parse_point_names(args.points, run_data) if args.points else list(run_data.points)
    run_id = args.run_id or f"{run_data.manifest.run_id}-validate"
    outcome = validate_run(run_data, args.out, points, choice, args.results_dir, run_id, progress)
    assert profile.calibration is not None
    calibration = profile.calibration.model_copy(update={"validation": outcome.report.rows,
                                                         "validation_run": display_path(outcome.run_dir)})
    write_profile(profile.model_copy(update={"calibration": calibration}), args.out)
    print(validation_table(outcome.report.rows))
    for line in close_run(outcome.run_dir, outputs=True, progress=progress).lines():
        print(line)
    print(f"calibrate: validation run {display_path(outcome.run_dir)} (SIMULATED); comparison written into "
          f"{display_path(args.out)}")
    return 0
