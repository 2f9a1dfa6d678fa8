"""Writing a figure: PNG and SVG, each atomically, at one resolution for every figure of a run."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from harness.io import atomic_write_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIGURE_DPI = 150


def save_figure(fig: Figure, out_dir: Path, stem: str) -> list[Path]:
    """PNG and SVG of `fig`, each written atomically."""
    paths = []
    for fmt in ("png", "svg"):
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, dpi=FIGURE_DPI)
        path = Path(out_dir) / f"{stem}.{fmt}"
        atomic_write_bytes(path, buffer.getvalue())
        paths.append(path)
    return paths
