"""Point labels that sit by their own point and never cover one another (greedy, in display space).

The figure is laid out first (constrained layout resizes the axes at draw time, which would move
the points under labels placed before it), each label's real text extent is measured, and every
label tries candidate offsets around its point, nearest first. A candidate is refused when it
overlaps a label already placed, leaves the axes, or lies nearer to another point than to its
own; among the rest the one covering least of the markers and lines wins. Points closer together
than a marker's width cannot be told apart, so they share one label ("c24/c32").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.text import Annotation

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in display pixels
# right-above first (the usual place), then round the circle; nearer rings before farther ones
_DIRECTIONS = tuple((math.cos(a), math.sin(a)) for a in np.radians(
    [30, -30, 150, -150, 90, -90, 0, 180, 60, -60, 120, -120, 15, -15, 165, -165, 45, -45, 135, -135, 75, -75,
     105, -105]))
_RADII_PT = (1.0, 4.0, 8.0, 13.0, 19.0, 27.0, 37.0, 50.0)
_GAP_PX = 3.0  # between two labels: text extents differ by a pixel or two at another dpi


@dataclass(frozen=True)
class Label:
    x: float  # data coordinates of the point
    y: float
    text: str
    colour: str


@dataclass(frozen=True)
class PlacedLabel:
    text: str
    points: list[tuple[float, float]]  # display pixels of the point(s) the label names
    box: Box
    annotation: Annotation


def _overlap(a: Box, b: Box) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


def _distance(box: Box, point: tuple[float, float]) -> float:
    dx = max(box[0] - point[0], 0.0, point[0] - box[2])
    dy = max(box[1] - point[1], 0.0, point[1] - box[3])
    return math.hypot(dx, dy)


def _groups(labels: Sequence[Label], pixels: np.ndarray, merge_px: float) -> list[list[int]]:
    """Labels whose points lie within merge_px of one another (transitively), in input order."""
    parent = list(range(len(labels)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(labels)):
        for j in range(i):
            if np.hypot(*(pixels[i] - pixels[j])) <= merge_px:
                parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(labels)):
        groups.setdefault(root(i), []).append(i)
    return list(groups.values())


def _group_text(labels: Sequence[Label], group: list[int]) -> tuple[str, str]:
    texts = list(dict.fromkeys(labels[i].text for i in group))
    colours = {labels[i].colour for i in group}
    return "/".join(texts), (labels[group[0]].colour if len(colours) == 1 else "#333333")


def _line_boxes(ax: Axes, lines: Sequence[tuple[Sequence[float], Sequence[float]]]) -> list[Box]:
    boxes = []
    for xs, ys in lines:
        pts = ax.transData.transform(np.column_stack([xs, ys]))
        for (x0, y0), (x1, y1) in zip(pts[:-1], pts[1:], strict=True):
            steps = max(1, int(np.hypot(x1 - x0, y1 - y0) // 5))
            for f in np.linspace(0.0, 1.0, steps + 1):
                x, y = x0 + f * (x1 - x0), y0 + f * (y1 - y0)
                boxes.append((x - 2.0, y - 2.0, x + 2.0, y + 2.0))
    return boxes


def place_labels(ax: Axes, labels: Sequence[Label], fontsize: float, bold: bool = False,
                 lines: Sequence[tuple[Sequence[float], Sequence[float]]] = (),
                 marker_radius_pt: float = 8.0) -> list[PlacedLabel]:
    """Annotate `labels` on `ax` (its limits already set); returns where each label went."""
    if not labels:
        return []
    fig = ax.figure
    if not hasattr(fig.canvas, "get_renderer"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.canvas.draw()  # lay the figure out: from here on, data -> pixels is final
    renderer = fig.canvas.get_renderer()
    px_per_pt = fig.dpi / 72.0
    pixels = ax.transData.transform(np.array([(lab.x, lab.y) for lab in labels], dtype=float))
    marker = marker_radius_pt * px_per_pt
    groups = _groups(labels, pixels, merge_px=marker)
    frame = ax.get_window_extent(renderer)
    frame_box = (frame.x0 + _GAP_PX, frame.y0 + _GAP_PX, frame.x1 - _GAP_PX, frame.y1 - _GAP_PX)
    markers = [(x - marker, y - marker, x + marker, y + marker) for x, y in pixels]
    obstacles = markers + _line_boxes(ax, lines)
    walls: list[Box] = []  # never covered: the legend
    legend = ax.get_legend()
    if legend is not None:
        box = legend.get_window_extent(renderer)
        # freeze a "best" legend where it is: at the next draw it would move to avoid the labels
        legend.set_loc(tuple(ax.transAxes.inverted().transform((box.x0, box.y0))))
        walls.append((box.x0, box.y0, box.x1, box.y1))
    centres = [pixels[g].mean(axis=0) for g in groups]
    # the most crowded points choose first: they have the fewest good places
    order = sorted(range(len(groups)), key=lambda gi: sorted(
        np.hypot(*(centres[gi] - centres[gj])) for gj in range(len(groups)) if gj != gi)[:1] or [math.inf])
    placed: list[PlacedLabel] = []
    for gi in order:
        group = groups[gi]
        text, colour = _group_text(labels, group)
        anchor = labels[group[0]]
        ann = ax.annotate(text, (anchor.x, anchor.y), textcoords="offset points", xytext=(0, 0),
                          fontsize=fontsize, color=colour, fontweight="bold" if bold else "normal",
                          ha="left", va="bottom", annotation_clip=False, gid=f"label:{text}")
        ann.set_in_layout(False)  # a label must not resize the axes under the points
        extent = ann.get_window_extent(renderer)
        width, height = extent.width, extent.height
        own = [tuple(pixels[i]) for i in group]
        others = [tuple(pixels[i]) for i in range(len(labels)) if i not in group]
        px0, py0 = pixels[group[0]]
        cx, cy = centres[gi]
        best: tuple[float, Box] | None = None
        for radius in _RADII_PT:
            r = (marker_radius_pt + radius) * px_per_pt
            for dx, dy in _DIRECTIONS:
                # the box's nearest corner or edge sits on the circle of radius r round the group
                left = cx + dx * r - (width if dx < -0.3 else (width / 2 if abs(dx) <= 0.3 else 0.0))
                bottom = cy + dy * r - (height if dy < -0.3 else (height / 2 if abs(dy) <= 0.3 else 0.0))
                box = (left, bottom, left + width, bottom + height)
                cost = radius * 0.5 + sum(_overlap(box, o) for o in obstacles) * 0.05
                padded = (box[0] - _GAP_PX, box[1] - _GAP_PX, box[2] + _GAP_PX, box[3] + _GAP_PX)
                if any(_overlap(padded, p.box) > 0 for p in placed) or any(_overlap(box, w) > 0 for w in walls):
                    cost += 1e6
                if _overlap(box, frame_box) < width * height - 1e-6:
                    cost += 1e5
                if others and min(_distance(box, p) for p in others) <= min(_distance(box, p) for p in own) + 1:
                    cost += 1e5
                if best is None or cost < best[0]:
                    best = (cost, box)
            if best is not None and best[0] < 1e5 and best[0] <= radius * 0.5 + 1.0:
                break  # a clean place at this distance: farther ones can only be worse
        assert best is not None
        box = best[1]
        # in points, so the label keeps its place when the figure is saved at another dpi
        ann.set_position(((box[0] - px0) / px_per_pt, (box[1] - py0) / px_per_pt))
        placed.append(PlacedLabel(text, own, box, ann))
    return placed
