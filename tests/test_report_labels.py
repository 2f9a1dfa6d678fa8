"""Pareto point labels: each by its own point, none covering another, on the figure as drawn."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from harness.report.figures import FIGURE_DPI
from harness.report.plots import build_occupancy_figure, build_pareto_figure

# The simulated blog sweep (harness simulate sweeps/tp8.yaml): the offload arm's c8-c32 sit within a
# few pixels of one another, and the HiSparse arm's c24 and c32 nearly coincide next to its c16.
BLOG_SIM = {
    "tp8-hisparse384-native128": [(1, 10277, 255.5), (8, 24398, 75.5), (16, 28375, 43.9), (24, 29447, 36.4),
                                  (32, 29519, 36.0)],
    "tp8-offload512": [(1, 10277, 255.5), (8, 21194, 132.2), (16, 21158, 130.8), (24, 21194, 130.8),
                       (32, 21216, 129.7)],
}
# tighter still, but every point a marker's width apart from the next
CLUSTER = {
    "arm-a": [(1, 9000, 120.0), (8, 20000, 60.0), (16, 21000, 57.0), (24, 21600, 55.5), (32, 22000, 54.5)],
    "arm-b": [(1, 9500, 118.0), (8, 19600, 62.0), (16, 20600, 59.5), (24, 21300, 58.5), (32, 21900, 58.5)],
}


def _frame(arms: dict[str, list[tuple[int, float, float]]]) -> pd.DataFrame:
    rows = [{"run_id": "run", "deployment": dep, "concurrency": c, "status": "ok", "simulated": True,
             "gpu_model": "H200", "gpus_per_server": 8, "total_tok_s_per_gpu": x, "interactivity_tok_s_user": y}
            for dep, points in arms.items() for c, x, y in points]
    return pd.DataFrame(rows).astype({"simulated": "boolean", "concurrency": "Int64", "gpus_per_server": "Int64"})


def _drawn_labels(fig):
    fig.set_dpi(FIGURE_DPI)  # as save_figure writes it
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    labels = [t for t in ax.texts if str(t.get_gid() or "").startswith("label:")]
    return ax, [(t.get_text(), t.get_color(), t.get_window_extent(renderer)) for t in labels]


def _box_distance(box, x: float, y: float) -> float:
    return math.hypot(max(box.x0 - x, 0.0, x - box.x1), max(box.y0 - y, 0.0, y - box.y1))


@pytest.mark.parametrize("arms", [BLOG_SIM, CLUSTER], ids=["blog-sim", "cluster"])
def test_pareto_labels_do_not_overlap_and_sit_nearest_their_own_points(arms) -> None:
    fig = build_pareto_figure(_frame(arms))
    ax, labels = _drawn_labels(fig)
    colours = {line.get_gid().split(":", 1)[1]: line.get_color() for line in ax.lines
               if str(line.get_gid() or "").startswith("pareto:")}
    points = {(dep, c): tuple(ax.transData.transform((x, y))) for dep, pts in arms.items() for c, x, y in pts}
    named: set[tuple[str, int]] = set()
    for i, (text, colour, box) in enumerate(labels):
        for other_text, _, other in labels[i + 1:]:
            assert not box.overlaps(other), f"labels {text!r} and {other_text!r} overlap"
        assert ax.get_window_extent().contains(box.x0, box.y0) and ax.get_window_extent().contains(box.x1, box.y1)
        parallels = {int(part[1:]) for part in text.split("/")}
        deps = [d for d, c in colours.items() if c == colour] or list(arms)  # grey: points of several arms
        own = {(d, c) for d in deps for c in parallels if (d, c) in points}
        assert own, f"label {text!r} names no point"
        named |= own
        nearest_own = min(_box_distance(box, *points[p]) for p in own)
        others = [(_box_distance(box, *xy), p) for p, xy in points.items() if p not in own]
        closest_other, which = min(others)
        assert nearest_own < closest_other, f"label {text!r} is nearer {which} than its own point"
        assert nearest_own < 60, f"label {text!r} is {nearest_own:.0f} px from its point"
    assert named == set(points), "every point is named by a label"


def test_coincident_points_share_one_label_and_distinct_points_keep_their_own() -> None:
    _, labels = _drawn_labels(build_pareto_figure(_frame(BLOG_SIM)))
    texts = sorted(text for text, _, _ in labels)
    assert texts == sorted(["c1", "c8", "c16", "c24/c32", "c8/c16/c24/c32"])
    _, labels = _drawn_labels(build_pareto_figure(_frame(CLUSTER)))
    assert len(labels) == 10  # a marker's width apart: nothing merged


def test_occupancy_labels_do_not_overlap() -> None:
    df = _frame(BLOG_SIM).assign(occupancy_mean_running=[1.0, 8.0, 15.5, 18.0, 19.2, 1.0, 4.0, 3.8, 4.1, 4.2])
    _, labels = _drawn_labels(build_occupancy_figure(df))
    assert len(labels) >= 9
    for i, (text, _, box) in enumerate(labels):
        assert not any(box.overlaps(other) for _, _, other in labels[i + 1:]), text
