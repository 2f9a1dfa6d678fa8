"""The fit: SciPy's bounded least squares over the free coefficients of a hardware profile.

Each target is one measured quantity at one setup; its residual is weight x log(predicted / measured), so
a 10% miss costs the same at 2 ms as at 200 ms. The coefficients are searched as z = log(value / prior):
one unit of z is the same relative change for every coefficient, and a weak penalty `prior_weight` x z
keeps a coefficient the data cannot tell apart from another (per-step vs per-request cost when two points
differ little) at its prior instead of wandering. The simulator is a discrete-event model, so the
Jacobian's finite differences use relative steps of a few percent, not machine epsilon.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from harness.calibrate.coefficients import COEFFICIENTS, start_values, with_values
from harness.calibrate.predict import PointSetup, Prediction, predict
from harness.errors import HarnessError
from harness.sim.profiles import CoefficientFit, HardwareProfile

MISSING_RESIDUAL = 5.0   # a quantity the simulator could not produce (e.g. no request finished)
DIFF_STEP = 0.03         # relative finite-difference step in z
PRIOR_WEIGHT = 0.1


@dataclass(frozen=True)
class Target:
    setup: PointSetup
    quantity: str       # a Prediction field: tpot_ms, prefill_ms, total_tok_s, hisparse_hit_rate, ...
    measured: float
    weight: float = 1.0


@dataclass(frozen=True)
class FitResult:
    hardware: HardwareProfile
    names: tuple[str, ...]
    values: tuple[float, ...]
    cost: float
    rows: tuple[CoefficientFit, ...]
    evaluations: int
    converged: bool
    message: str

    @property
    def method(self) -> str:
        return (f"scipy.optimize.least_squares (trf, bounded) over log(value / prior) of {', '.join(self.names)}; "
                f"residuals weight x log(predicted / measured) per target; prior penalty {PRIOR_WEIGHT} x "
                f"log(value / prior); finite-difference step {DIFF_STEP}; {self.evaluations} simulations of "
                f"every setup; {'converged' if self.converged else 'stopped'}: {self.message}")


def _predict_all(setups: dict[str, PointSetup], hardware: HardwareProfile) -> dict[str, Prediction]:
    return {name: predict(setup, hardware) for name, setup in setups.items()}


def _residual(target: Target, predictions: dict[str, Prediction]) -> float:
    value = predictions[target.setup.name].value(target.quantity)
    if value is None or value <= 0 or target.measured <= 0:
        return target.weight * MISSING_RESIDUAL
    return target.weight * math.log(value / target.measured)


def fit(targets: Sequence[Target], base: HardwareProfile, names: Sequence[str], *,
        prior_weight: float = PRIOR_WEIGHT, max_evaluations: int = 60,
        progress: Callable[[str], None] | None = None) -> FitResult:
    if not any(t.weight > 0 for t in targets):
        raise HarnessError("nothing to fit: no measured quantity at any calibration point")
    names = tuple(names)
    setups = {t.setup.name: t.setup for t in targets}
    prior = np.array(start_values(base, names))
    lower = np.array([math.log(COEFFICIENTS[n].lower / p) for n, p in zip(names, prior, strict=True)])
    upper = np.array([math.log(COEFFICIENTS[n].upper / p) for n, p in zip(names, prior, strict=True)])
    z0 = np.clip(np.zeros(len(names)), lower + 1e-9, upper - 1e-9)
    cache: dict[tuple[float, ...], np.ndarray] = {}

    def residuals(z: np.ndarray) -> np.ndarray:
        key = tuple(round(float(v), 9) for v in z)
        if key not in cache:
            hardware = with_values(base, names, prior * np.exp(z))
            predictions = _predict_all(setups, hardware)
            data = [_residual(t, predictions) for t in targets]
            cache[key] = np.array(data + list(prior_weight * z))
            if progress is not None and len(cache) % 10 == 0:
                progress(f"calibrate: {len(cache)} evaluations, cost {0.5 * float(np.sum(cache[key] ** 2)):.4f}")
        return cache[key]

    # imported here: every sweep and report start imports this module (the report's validation figure), and
    # scipy.optimize is about a quarter of that start's import time; only a calibration fits
    from scipy.optimize import least_squares

    result = least_squares(residuals, z0, bounds=(lower, upper), method="trf", diff_step=DIFF_STEP,
                           max_nfev=max_evaluations)
    values = tuple(float(v) for v in prior * np.exp(result.x))
    hardware = with_values(base, names, values)
    predictions = _predict_all(setups, hardware)
    rows = []
    for t in targets:
        predicted = predictions[t.setup.name].value(t.quantity)
        rows.append(CoefficientFit(point=t.setup.name, quantity=t.quantity, measured=t.measured,
                                   predicted=float("nan") if predicted is None else predicted,
                                   rel_error=float("nan") if predicted is None else (predicted - t.measured) / t.measured,
                                   weight=t.weight))
    return FitResult(hardware=hardware, names=names, values=values, cost=float(result.cost), rows=tuple(rows),
                     evaluations=len(cache), converged=bool(result.success), message=str(result.message))
