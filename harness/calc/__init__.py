"""The blog's concurrency calculator: baseline GPU-resident KV vs Hybrid HiSparse (docs/facts.md §4)."""

from harness.calc.formulas import (
    BLOCK_BYTES,
    GPU_HBM_GB,
    CalcError,
    CalcInputs,
    CalcResult,
    calculate,
    calculate_range,
    find_crossover,
)
from harness.calc.sizing import inputs_for_launch, pinned_host_gib, sizing_for_launch, sizing_warnings

__all__ = ["BLOCK_BYTES", "GPU_HBM_GB", "CalcError", "CalcInputs", "CalcResult", "calculate",
           "calculate_range", "find_crossover", "inputs_for_launch", "pinned_host_gib", "sizing_for_launch",
           "sizing_warnings"]
