"""The calculator's chart: total concurrency against sequence length, both modes (log2 x axis)."""

from __future__ import annotations

import io
from pathlib import Path

from harness.calc.formulas import CalcError, CalcResult
from harness.io import atomic_write_bytes

HISPARSE_COLOR = "#008768"  # the page's colours, so the chart reads like the blog's
BASELINE_COLOR = "#828282"
CROSSOVER_COLOR = "#2a7ae2"
FORMATS = {".png": "png", ".svg": "svg"}


def _format_tokens(tokens: float) -> str:
    """Axis labels as on the page: 8K, 128K, 1M (K = 1,024 tokens)."""
    if tokens >= 1024**2:
        return f"{tokens / 1024**2:.1f}".removesuffix(".0") + "M"
    if tokens >= 1024:
        return f"{tokens / 1024:.{1 if tokens < 10 * 1024 else 0}f}".removesuffix(".0") + "K"
    return f"{tokens:,.0f}"


def _subtitle(first: CalcResult) -> str:
    inp = first.inputs
    pool = ("minimum non-limiting host pool at each length" if first.host_pool_is_default
            else f"host pool {first.host_pool_gib:g} GiB per DP replica")
    return (f"{inp.kv_dtype} KV, {first.layout} layout, {first.kv_hbm_per_gpu_gib:g} GiB KV HBM per GPU, "
            f"{first.hot_rows:,} hot rows, max_num_seqs {inp.max_num_seqs:,}; {pool}")


def chart_format(path: Path) -> str:
    """`png` or `svg` from the file name, checked before any work is done."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise CalcError(f"--plot {path}: the file must end in .png or .svg")
    return fmt


def plot_concurrency(results: list[CalcResult], crossover: int | None, path: Path | str) -> Path:
    """Draw baseline and HiSparse totals against sequence length into a PNG or SVG (by suffix)."""
    path = Path(path)
    fmt = chart_format(path)
    if len(results) < 2:
        raise CalcError("a chart needs at least two sequence lengths")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

    seq = [r.inputs.seq_len for r in results]
    baseline = [r.baseline_total for r in results]
    hisparse = [r.hisparse_total for r in results]
    first = results[0]
    fig, ax = plt.subplots(figsize=(9.5, 5.4), dpi=150)
    try:
        only = [s for s, b, h in zip(seq, baseline, hisparse, strict=True) if b == 0 and h > 0]
        if only:
            ax.axvspan(only[0], seq[-1] if only[-1] == seq[-1] else only[-1], color=HISPARSE_COLOR,
                       alpha=0.08, lw=0, label="HiSparse only (baseline fits no request)")
        # HiSparse never falls below the baseline (it keeps full residency where that holds more), so
        # the baseline is drawn thinner on top: where the two agree it shows inside the HiSparse line.
        ax.step(seq, hisparse, where="post", color=HISPARSE_COLOR, lw=3.4, label="Hybrid HiSparse", zorder=3)
        ax.step(seq, baseline, where="post", color=BASELINE_COLOR, lw=1.6, label="GPU-resident KV (baseline)",
                zorder=4)
        top = max(4, *baseline, *hisparse) * 1.12
        ax.set_ylim(0, top)
        ax.set_xscale("log", base=2)
        ax.set_xlim(seq[0], seq[-1])
        lo_exp, hi_exp = seq[0].bit_length() - 1, seq[-1].bit_length()
        ticks = [2**e for e in range(lo_exp, hi_exp + 1) if seq[0] <= 2**e <= seq[-1]]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _format_tokens(v)))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
        ax.grid(True, which="major", color="#e4e4e4", lw=0.8)
        ax.set_axisbelow(True)
        if crossover is not None:
            at_start = crossover <= seq[0]
            y_text = top * 0.93
            ax.axvline(crossover, color=CROSSOVER_COLOR, ls="--", lw=1.3,
                       label="crossover (HiSparse starts to win)", zorder=5)
            text = ("HiSparse ahead across the range" if at_start
                    else f"HiSparse ahead from\n{crossover:,} tokens ({_format_tokens(crossover)})")
            ax.annotate(text, xy=(crossover, y_text), xytext=(6, 0), textcoords="offset points",
                        color=CROSSOVER_COLOR, fontsize=9, va="top")
        else:
            ax.text(0.98, 0.95, "HiSparse never beats the baseline in this range", transform=ax.transAxes,
                    ha="right", va="top", fontsize=9, color="#555555")
        ax.set_xlabel("Sequence length per request (tokens, log2 scale; K = 1,024)")
        ax.set_ylabel(f"Total concurrent requests (DP{first.dp})")
        ax.set_title(f"GLM-5.3 on {first.gpus}x {first.gpu} (TP{first.tp} x DP{first.dp}, expert parallel "
                     f"{'on' if first.inputs.expert_parallel else 'off'}): concurrency vs sequence length",
                     fontsize=11, loc="left")
        fig.text(0.01, 0.005, _subtitle(first) + ". Planning estimate, not a serving limit.",
                 fontsize=7.5, color="#555555", ha="left", va="bottom")
        ax.legend(loc="upper right", fontsize=8.5, framealpha=0.95)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt)
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path
