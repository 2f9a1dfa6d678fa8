"""Validation: the measured run's whole sweep simulated with the calibrated profile (`harness simulate`'s
own path, so the result is an ordinary simulated run folder with its report), then every point compared
with what the real engine measured: mean TPOT (the server's histogram), total throughput, occupancy,
preemptions. Points the fit did not use are held out; they are the test of the simulator."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from harness.calibrate.observed import ObservedRun, point_name
from harness.calibrate.session import ProfileChoice, sim_settings_for
from harness.errors import HarnessError
from harness.io import atomic_write_text
from harness.records import Record
from harness.results import iter_points
from harness.sim.profiles import ValidationRow
from harness.simulate import SimulateOptions, simulate_sweep

VALIDATION_JSON = "validation.json"  # in the simulated run folder, beside manifest.json
TOLERANCE = 0.20                      # the bound on held-out TPOT and throughput errors (the figure's band)
TARGET = 0.10                         # where held-out errors should be: the bound a quieter machine would assert


def spread(values: Sequence[float | None]) -> float | None:
    """max / min - 1 over the values given (the noise floor of one point measured several times); None
    with fewer than two."""
    vals = [v for v in values if v is not None and v > 0]
    return max(vals) / min(vals) - 1 if len(vals) > 1 else None


class ValidationReport(Record):
    """validation.json: what the report's predicted-vs-measured figure draws."""

    schema_version: int = 1
    measured_run: str
    calibrated_profile: str
    calibration_points: list[str] = Field(default_factory=list)
    rows: list[ValidationRow] = Field(default_factory=list)


@dataclass(frozen=True)
class ValidationOutcome:
    run_dir: Path
    report: ValidationReport


def _rows(run: ObservedRun, sim_dir: Path, calibration_points: Sequence[str]) -> list[ValidationRow]:
    simulated = {point_name(p.deployment, p.concurrency): p for p in iter_points(sim_dir)}
    rows = []
    for name, observed in run.points.items():
        sim = simulated.get(name)
        if sim is None or sim.metrics is None:
            raise HarnessError(f"{sim_dir}: the simulated sweep has no point {name}")
        measured = observed.record.metrics
        rows.append(ValidationRow(
            point=name, held_out=name not in calibration_points,
            tpot_ms_measured=observed.tpot_ms, tpot_ms_predicted=sim.metrics.server_tpot_ms,
            total_tok_s_measured=observed.total_tok_s,
            total_tok_s_predicted=sim.summary.total_throughput_tok_s if sim.summary else None,
            occupancy_measured=measured.occupancy_mean_running if measured else None,
            occupancy_predicted=sim.metrics.occupancy_mean_running,
            decode_batch_measured=measured.decode_batch_mean if measured else None,
            decode_batch_predicted=sim.metrics.decode_batch_mean,
            preemptions_measured=measured.preemptions if measured else None,
            preemptions_predicted=sim.metrics.preemptions))
    return rows


def validate_run(run: ObservedRun, profile_path: Path, calibration_points: Sequence[str], choice: ProfileChoice,
                 results_root: Path, run_id: str, progress: Callable[[str], None] = print) -> ValidationOutcome:
    """Simulate the run's sweep with the calibrated profile in place of each arm's hardware profile."""
    hardware = str(Path(profile_path).resolve())
    launches = {}
    for name, loaded in run.loaded.launches.items():
        sim = sim_settings_for(loaded.profile, choice).model_copy(update={"hardware_profile": hardware})
        launches[name] = dataclasses.replace(loaded, profile=loaded.profile.model_copy(update={"sim": sim}))
    sweep = dataclasses.replace(run.loaded, launches=launches)
    outcome = simulate_sweep(sweep, SimulateOptions(run_id=run_id, results_root=Path(results_root)), progress=progress)
    report = ValidationReport(measured_run=str(run.run_dir), calibrated_profile=hardware,
                              calibration_points=list(calibration_points),
                              rows=_rows(run, outcome.run_dir, calibration_points))
    atomic_write_text(outcome.run_dir / VALIDATION_JSON, json.dumps(report.model_dump(mode="json"), indent=2) + "\n")
    return ValidationOutcome(run_dir=outcome.run_dir, report=report)


def read_validation(run_dir: Path) -> ValidationReport | None:
    path = Path(run_dir) / VALIDATION_JSON
    if not path.is_file():
        return None
    try:
        return ValidationReport.model_validate_json(path.read_bytes())
    except ValueError as exc:
        raise HarnessError(f"{path}: unreadable validation: {str(exc).splitlines()[0]}") from None


def _pct(predicted: float | None, measured: float | None) -> str:
    rel = ValidationRow.rel(predicted, measured)
    return "-" if rel is None else f"{100 * rel:+.0f}%"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def validation_table(rows: Sequence[ValidationRow]) -> str:
    """The per-point comparison as aligned text (measured / predicted, error)."""
    header = ("point", "held out", "TPOT ms (meas/pred)", "err", "total tok/s (meas/pred)", "err",
              "occupancy (meas/pred)", "decode batch (meas/pred)", "preemptions (meas/pred)")
    lines = [header]
    for r in rows:
        lines.append((r.point, "yes" if r.held_out else "no (fit)",
                      f"{_num(r.tpot_ms_measured)} / {_num(r.tpot_ms_predicted)}", _pct(r.tpot_ms_predicted, r.tpot_ms_measured),
                      f"{_num(r.total_tok_s_measured, 0)} / {_num(r.total_tok_s_predicted, 0)}",
                      _pct(r.total_tok_s_predicted, r.total_tok_s_measured),
                      f"{_num(r.occupancy_measured, 1)} / {_num(r.occupancy_predicted, 1)}",
                      f"{_num(r.decode_batch_measured, 1)} / {_num(r.decode_batch_predicted, 1)}",
                      f"{_num(r.preemptions_measured, 0)} / {_num(r.preemptions_predicted, 0)}"))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)
