"""The free coefficients of the simulated engine: where each lives (all in the hardware profile), its
bounds, and which of them a set of measurements can move."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from harness.errors import HarnessError
from harness.sim.profiles import HardwareProfile


@dataclass(frozen=True)
class Coefficient:
    name: str
    lower: float
    upper: float
    start: float      # where the fit starts when the base profile holds 0 (no prior to start from)
    meaning: str


COEFFICIENTS: dict[str, Coefficient] = {c.name: c for c in (
    Coefficient("step_overhead_s", 1e-5, 1.0, 1e-3, "fixed host cost per step (scheduling, launches, "
                "all-reduces)"),
    Coefficient("step_overhead_per_seq_s", 1e-7, 0.05, 2e-5, "host cost per scheduled request per step"),
    Coefficient("prefill_step_overhead_s", 1e-5, 1.0, 1e-3, "extra fixed cost of a step carrying a prompt "
                "chunk"),
    Coefficient("hbm_efficiency", 1e-3, 1.0, 0.5, "fraction of the memory bandwidth a step reaches"),
    Coefficient("flops_efficiency", 1e-4, 1.0, 0.3, "fraction of the peak FLOPs a step reaches (prefill cost "
                "per token)"),
    Coefficient("h2d_bytes_per_s", 1e8, 1e12, 2.5e10, "host-to-device copy rate (offload loads, HiSparse "
                "misses)"),
    Coefficient("hisparse_miss_rate", 1e-4, 1.0, 0.05, "share of host-only top-K rows a warm hot buffer misses"),
)}
# what a run's engine quantities can identify without offload or HiSparse traffic
DEFAULT_FIT = ("step_overhead_s", "step_overhead_per_seq_s", "prefill_step_overhead_s", "hbm_efficiency",
               "flops_efficiency")


def parse_fit(text: str | None, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """`--fit a,b` (default: the step-time coefficients, plus `extra` the data can identify)."""
    if text is None:
        return (*DEFAULT_FIT, *[e for e in extra if e not in DEFAULT_FIT])
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in COEFFICIENTS]
    if unknown or not names:
        raise HarnessError(f"--fit {text}: unknown coefficient {', '.join(unknown) or '(none given)'}; choose "
                           f"from {', '.join(COEFFICIENTS)}")
    return names


def start_values(base: HardwareProfile, names: Sequence[str]) -> list[float]:
    """The base profile's values (its prior), or each coefficient's start where the base has none."""
    values = []
    for name in names:
        value = getattr(base, name)
        spec = COEFFICIENTS[name]
        values.append(min(max(value if value else spec.start, spec.lower), spec.upper))
    return values


def with_values(base: HardwareProfile, names: Sequence[str], values: Sequence[float]) -> HardwareProfile:
    return base.model_copy(update=dict(zip(names, (float(v) for v in values), strict=True)))
