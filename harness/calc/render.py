"""Text forms of calculator results: the table `harness calc` prints, and sequence grids."""

from __future__ import annotations

import math

from harness.calc.formulas import CalcError, CalcResult

PLOT_STEP_TOKENS = 1024  # the page draws its chart every 1,024 tokens
LIMITER_WORDS = {"baseline": "full residency", "gpu": "HBM", "host": "host pool",
                 "max_num_seqs": "max_num_seqs"}


def parse_seq_range(text: str) -> tuple[int, int]:
    """`8192:1048576` -> (8192, 1048576); `128K:1M` works too (K = 1,024 tokens)."""
    parts = text.split(":")
    if len(parts) != 2:
        raise CalcError(f"--seq-range {text!r}: write START:END in tokens, e.g. 8192:1048576")
    lo, hi = (parse_tokens(p, "--seq-range") for p in parts)
    if lo >= hi:
        raise CalcError(f"--seq-range {text!r}: START must be below END")
    return lo, hi


def parse_tokens(text: str, what: str) -> int:
    units = {"k": 1024, "m": 1024**2}
    raw = text.strip().lower().replace(",", "").replace("_", "")
    scale = units.get(raw[-1:], 1)
    digits = raw[:-1] if scale != 1 else raw
    try:
        value = float(digits) * scale
    except ValueError:
        raise CalcError(f"{what}: cannot read {text!r} as a token count") from None
    if not math.isfinite(value) or value <= 0 or not value.is_integer():
        raise CalcError(f"{what}: {text!r} must be a positive whole number of tokens")
    return int(value)


def table_grid(lo: int, hi: int) -> list[int]:
    """Rows for a printed range: the ends plus powers of two and their midpoints (x1.5) between."""
    points = {lo, hi}
    power = 2 ** math.floor(math.log2(lo))
    while power <= hi:
        for value in (power, power * 3 // 2):
            if lo <= value <= hi:
                points.add(value)
        power *= 2
    return sorted(points)


def plot_grid(lo: int, hi: int) -> list[int]:
    """Dense points for a chart: every 1,024 tokens from lo, plus every 64-token block up to 16K
    (short lengths are far apart on a log axis), and hi itself."""
    points = set(range(lo, hi + 1, PLOT_STEP_TOKENS)) | {hi}
    points |= {v for v in range(64, min(hi, 16384) + 1, 64) if v >= lo}
    return sorted(points)


def _count(value: int) -> str:
    return f"{value:,}"


def _gib(value: float) -> str:
    return f"{value:,.1f} GiB" if not float(value).is_integer() else f"{int(value):,} GiB"


def format_result(result: CalcResult) -> str:
    """The readable table for one sequence length."""
    inp = result.inputs
    multiplier = (f"{result.multiplier:.2f}x" if result.multiplier is not None
                  else ("unbounded (baseline fits none)" if result.hisparse_total else "-"))
    pool_note = " (default: the minimum, clamped to 16..4096)" if result.host_pool_is_default else ""
    ep = "on" if inp.expert_parallel else "off"
    rows: list[tuple[str, str]] = [
        ("sequence length", f"{inp.seq_len:,} tokens ({result.blocks_per_request:,} blocks of 64)"),
        ("GPU", f"{result.gpu}, {result.hbm_per_gpu_gib:.2f} GiB HBM; {result.gpus} GPUs = "
                f"TP{result.tp} x DP{result.dp}, expert parallel {ep}"),
        ("KV dtype / layout", f"{inp.kv_dtype} / {result.layout_description}"),
        ("weights per GPU", f"{result.weights_per_gpu_gib:.2f} GiB"),
        ("KV HBM per GPU", _gib(result.kv_hbm_per_gpu_gib)
         + (" (given)" if inp.kv_hbm_gib is not None else
            f" (= {inp.gpu_memory_utilization:g} x HBM - weights - {inp.runtime_reserve_gib:g} GiB reserve)")),
        ("hot rows per request", f"{result.hot_rows:,} x {inp.hot_groups} groups, "
                                 f"{inp.retained_pages} retained pages per group"),
        ("max_num_seqs per DP", _count(inp.max_num_seqs)),
        ("", ""),
        ("baseline concurrency", f"{_count(result.baseline_total)}  ({_count(result.baseline_per_dp)} per DP)"),
        ("HiSparse GPU limit", f"{_count(result.hisparse_gpu_limit_per_dp)} per DP"),
        ("HiSparse host limit", f"{_count(result.host_limit_per_dp)} per DP"),
        ("HiSparse concurrency", f"{_count(result.hisparse_total)}  ({_count(result.hisparse_per_dp)} per DP, "
                                 f"limited by {LIMITER_WORDS[result.hisparse_limiter]})"),
        ("multiplier", multiplier),
        ("", ""),
        ("min HiSparse host pool", f"{_count(result.min_host_pool_per_dp_gib)} GiB per DP replica"),
        ("HiSparse host pool", f"{_gib(result.host_pool_gib)} per DP replica{pool_note}"),
        ("indexer offload pool", f"{_gib(inp.indexer_offload_gib)} total, holds "
                                 f"{_count(result.indexer_offload_coverage)} full indexer histories"),
        ("physical host RAM", f"{_gib(result.physical_host_gib)} pinned ({result.host_pool_copies} HiSparse "
                              f"pool cop{'y' if result.host_pool_copies == 1 else 'ies'} + offload)"
         + (f" of {_gib(inp.host_ram_gib)} host RAM" if inp.host_ram_gib is not None else "")),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}".rstrip() for label, value in rows]
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines)


def format_range(results: list[CalcResult], crossover: int | None) -> str:
    """One row per sequence length, both modes, and where HiSparse starts to win."""
    header = ("seq len", "baseline", "HiSparse", "x", "limited by", "min host pool/DP")
    rows = []
    for r in results:
        mult = f"{r.multiplier:.2f}" if r.multiplier is not None else ("inf" if r.hisparse_total else "-")
        rows.append((f"{r.inputs.seq_len:,}", _count(r.baseline_total), _count(r.hisparse_total), mult,
                     LIMITER_WORDS[r.hisparse_limiter], f"{r.min_host_pool_per_dp_gib:,} GiB"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    fmt_row = lambda row: "  ".join(  # noqa: E731
        cell.ljust(w) if i == 4 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
    lines = [fmt_row(header), fmt_row(tuple("-" * w for w in widths))] + [fmt_row(row) for row in rows]
    if results:
        first = results[0]
        lines.append(f"totals across DP{first.dp}; {first.layout_description}; host pool: "
                     + ("the minimum at each length" if first.host_pool_is_default
                        else f"{_gib(first.host_pool_gib)} per DP replica"))
    if crossover is None:
        lines.append("crossover: HiSparse never beats the baseline in this range")
    elif results and crossover <= results[0].inputs.seq_len:
        lines.append(f"crossover: HiSparse holds more requests than the baseline across the whole range "
                     f"(from {crossover:,} tokens)")
    else:
        lines.append(f"crossover: HiSparse holds more requests than the baseline from {crossover:,} tokens")
    return "\n".join(lines)
