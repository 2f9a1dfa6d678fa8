"""Change points over the whole history: steps and slow drifts that no night-to-night diff shows.

Method (docs/nightly.md explains why this and not an off-the-shelf E-divisive): binary segmentation
with two alternatives to "the segment has one level":
- step: the level changes at night k (two means);
- drift: the level is flat until night k-1, then moves by the same amount every night (a hinge).
Both are fitted by least squares at every k; the test statistic is the best share of the variance
explained, max over k and both shapes. Its significance is read off the same statistic on series
of pure normal noise of the same length: the statistic depends neither on the level nor on the
spread of the noise, so one seeded table per length serves every series, and the answer is the same
every time. (Shuffling the nights instead, a permutation test, cannot go below about 2/C(n, k) for a
step of k nights in n: 0.4% for 4 of 12 nights, too coarse once many series are tested together.)
A significant change that also moves the level by at least `min_relative_change` is kept, with the
night it starts and the nights that fit nearly as well; then the flat part(s) are searched again.

Dating: a change in what a server ran starts on a night whose build differs from the night before.
Where the records say which nights those are, the change is dated at the earliest of them among the
nights that fit nearly as well: the first build that can explain it, so that a bisect from the night
before it holds the cause (with 3% noise a 2% drift's best-fitting night is as often a night or two
late as right, and a bisect from a late night misses the cause). Where no build changed among those
nights (a machine, a driver, the data), the best-fitting night is the date.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Literal

import numpy as np

from harness.nightly.night_record import NightRecord
from harness.nightly.thresholds import METRIC_BETTER

Kind = Literal["step", "drift"]
DatedBy = Literal["build", "fit"]  # the first changed build among the nights that fit, or the best fit
# n * log(RSS_k / RSS_best) below this: night k fits nearly as well (the 95% point of chi-square, 1 dof)
_LOCATION_SLACK = 3.84


@dataclass(frozen=True)
class DetectorSettings:
    alpha: float = 0.005  # largest permutation p-value that counts as a change in a single series
    false_discovery_rate: float = 0.05  # over the many series of a history (Benjamini-Hochberg)
    null_draws: int = 4000  # noise series per length behind the p-values (smallest p: 1/4001)
    min_relative_change: float = 0.03  # smaller moves of the level are not reported, however certain
    min_segment: int = 3  # nights on each side of a change (a one-night blip is the gate's business)
    max_nights: int = 120  # the most recent nights searched (bounds the cost; a year is ~1 s per series)
    seed: int = 0


@dataclass(frozen=True)
class SeriesChange:
    index: int  # position of the first changed value (the date, see the module's docstring)
    kind: Kind
    before: float  # the level before
    after: float  # step: the level after; drift: the fitted value at the end of the segment
    relative_change: float  # (after - before) / |before|
    p_value: float
    earliest: int  # positions that fit nearly as well as `index`
    latest: int
    best: int  # position the change fits best at (`index` unless dated by a build)
    slope: float | None = None  # drift: change per night
    dated_by: DatedBy = "fit"

    def shifted(self, by: int) -> SeriesChange:
        return replace(self, index=self.index + by, earliest=self.earliest + by, latest=self.latest + by,
                       best=self.best + by)


def _fits(y: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Residual sums of squares for every row of y (runs x nights): constant, step at k, drift from k."""
    n = y.shape[1]
    centred = y - y.mean(axis=1, keepdims=True)
    rss0 = (centred**2).sum(axis=1)
    ks = np.arange(m, n - m + 1)  # k values on both sides; k = first position of the new level
    left = np.cumsum(centred, axis=1)[:, ks - 1]
    rss_step = rss0[:, None] - left**2 / ks - left**2 / (n - ks)  # the centred total is 0
    hinge = np.maximum(0, np.arange(n)[None, :] - ks[:, None] + 1).astype(float)  # 0 up to k-1, then 1, 2..
    hinge -= hinge.mean(axis=1, keepdims=True)
    rss_drift = rss0[:, None] - (centred @ hinge.T) ** 2 / (hinge**2).sum(axis=1)
    return rss0, ks, rss_step, rss_drift


def _explained(rss0: np.ndarray, rss_step: np.ndarray, rss_drift: np.ndarray) -> np.ndarray:
    """Best share of the variance explained by one change, per row."""
    return 1.0 - np.minimum(rss_step.min(axis=1), rss_drift.min(axis=1)) / np.maximum(rss0, 1e-300)


@lru_cache(maxsize=256)
def _null_table(n: int, m: int, draws: int, seed: int) -> np.ndarray:
    """The statistic on `draws` series of n standard normal values, sorted."""
    rss0, _, rss_step, rss_drift = _fits(np.random.default_rng([seed, n, m]).standard_normal((draws, n)), m)
    return np.sort(_explained(rss0, rss_step, rss_drift))


def _best(y: np.ndarray, settings: DetectorSettings, build_changed: Sequence[bool] | None = None
          ) -> SeriesChange | None:
    """The best single change of `y`; build_changed[i]: position i ran another build than i - 1."""
    n = len(y)
    rss0, ks, rss_step, rss_drift = _fits(y[None, :], settings.min_segment)
    if rss0[0] <= 1e-12 * max(1.0, float(np.mean(y**2))) * n:
        return None  # a constant series has no change
    kind: Kind = "step" if rss_step.min() <= rss_drift.min() else "drift"
    rss = (rss_step if kind == "step" else rss_drift)[0]
    at = int(np.argmin(rss))
    k = int(ks[at])
    statistic = float(_explained(rss0, rss_step, rss_drift)[0])
    null = _null_table(n, settings.min_segment, settings.null_draws, settings.seed)
    exceed = len(null) - int(np.searchsorted(null, statistic - 1e-12, side="left"))
    p_value = (1 + exceed) / (len(null) + 1)
    # the nights that fit nearly as well under either shape: whether a change is a step or a drift is
    # itself uncertain, and a slow drift fits as a step a night or two later (or a drift a night earlier)
    either = np.minimum(rss_step[0], rss_drift[0])
    near = ks[n * np.log(np.maximum(either, 1e-300) / max(rss[at], 1e-300)) <= _LOCATION_SLACK]
    earliest, latest = int(near.min()), int(near.max())
    # the whole span, not just the nights that fit on their own: a bisect covers a range of builds
    suspects = [i for i in range(earliest, latest + 1) if build_changed is not None and build_changed[i]]
    dated = min(suspects) if suspects else k
    if dated != k:  # the shape and the levels are those that fit best from the dated night
        d = int(np.searchsorted(ks, dated))
        kind = "step" if rss_step[0, d] <= rss_drift[0, d] else "drift"
    before, after, slope = _levels(y, dated, kind)
    if before:
        relative = (after - before) / abs(before)
    else:
        relative = 0.0 if after == before else float(np.copysign(np.inf, after - before))
    return SeriesChange(dated, kind, before, after, relative, p_value, earliest, latest, k, slope,
                        dated_by="build" if suspects else "fit")


def _levels(y: np.ndarray, k: int, kind: Kind) -> tuple[float, float, float | None]:
    """Level before and after a change at k (a drift's: its fitted end), and a drift's slope per night."""
    if kind == "step":
        return float(np.mean(y[:k])), float(np.mean(y[k:])), None
    x = np.maximum(0, np.arange(len(y)) - k + 1).astype(float)
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(intercept + slope * x[-1]), float(slope)


def detect_changes(values: Sequence[float], settings: DetectorSettings | None = None,
                   build_changed: Sequence[bool] | None = None) -> list[SeriesChange]:
    """Every significant step or drift in `values` (in night order), earliest first.

    build_changed[i] (same length as values): value i was measured on another build than value i - 1;
    None: not known, every change is dated by its best fit."""
    settings = settings or DetectorSettings()
    y_all = np.asarray(values, dtype=float)
    offset = max(0, len(y_all) - settings.max_nights)
    y_all = y_all[offset:]
    builds = None if build_changed is None else [bool(b) for b in list(build_changed)[offset:]]
    if builds is not None and len(builds) != len(y_all):
        raise ValueError(f"build_changed has {len(builds)} entries for {len(y_all)} values")
    found: list[SeriesChange] = []
    todo = [(0, len(y_all))]
    while todo:
        start, end = todo.pop()
        if end - start < 2 * settings.min_segment:
            continue
        segment_builds = None if builds is None else [False] + builds[start + 1:end]
        change = _best(y_all[start:end], settings, segment_builds)
        if change is None or change.p_value > settings.alpha \
                or abs(change.relative_change) < settings.min_relative_change:
            continue
        found.append(change.shifted(start + offset))
        todo.append((start, start + change.index))  # the nights before its date: flat, or another change
        if change.kind == "step":  # after a drift the rest is the drift itself
            todo.append((start + change.best, end))
    return sorted(found, key=lambda c: c.index)


@dataclass(frozen=True)
class ChangePoint:
    """A change in one metric of one point, located at the night it starts."""

    deployment: str
    concurrency: int
    metric: str
    night_id: str  # the first night of the change
    earliest_night: str  # nights that fit nearly as well
    latest_night: str
    kind: Kind
    before: float
    after: float
    relative_change: float
    p_value: float
    worse: bool | None  # None: the metric has no better direction
    best_night: str | None = None  # the night the change fits best at (None: `night_id`)
    dated_by: DatedBy = "fit"

    @property
    def where(self) -> str:
        """The date and how sure it is, in words."""
        best = self.best_night or self.night_id
        if self.earliest_night == self.latest_night:
            return self.night_id
        span = f"nights {self.earliest_night} to {self.latest_night}, which fit nearly as well"
        if self.dated_by == "build" and best != self.night_id:
            return f"{self.night_id} (the first changed build in {span}; best fit {best})"
        return f"{self.night_id} ({span})"

    @property
    def text(self) -> str:
        return (f"{self.deployment} c{self.concurrency} {self.metric}: {self.kind} from {self.where}, "
                f"{self.levels}")

    @property
    def short(self) -> str:
        """The series and its levels, for a line under its group (which says where and when)."""
        return f"c{self.concurrency} {self.metric}: {self.levels}"

    @property
    def levels(self) -> str:
        verdict = "" if self.worse is None else (", worse" if self.worse else ", better")
        return (f"{self.before:,.4g} -> {self.after:,.4g} ({self.relative_change:+.1%}{verdict}, "
                f"p={self.p_value:.2g})")


@dataclass(frozen=True)
class ChangeGroup:
    """The change points of one deployment with the same date, shape and range: most often one cause
    (a build, the machine) seen at several points and in several metrics, so it reads as one line."""

    deployment: str
    members: tuple[ChangePoint, ...]

    @property
    def night_id(self) -> str:
        return self.members[0].night_id

    @property
    def text(self) -> str:
        first = self.members[0]
        if len(self.members) == 1:
            return first.text
        points = ", ".join(f"c{p}" for p in sorted({c.concurrency for c in self.members}))
        moves: dict[str, list[float]] = {}
        for c in self.members:
            moves.setdefault(c.metric, []).append(c.relative_change)
        moved = ", ".join(f"{metric} {min(r):+.1%}" + ("" if f"{min(r):+.1%}" == f"{max(r):+.1%}" else
                                                       f" to {max(r):+.1%}") for metric, r in moves.items())
        verdicts = {c.worse for c in self.members} - {None}
        verdict = {frozenset({True}): "worse, ", frozenset({False}): "better, "}.get(frozenset(verdicts),
                                                                                  "mixed, " if verdicts else "")
        return (f"{self.deployment} {points}: {first.kind} from {first.where}: {moved} "
                f"({verdict}p<={max(c.p_value for c in self.members):.2g})")


def grouped(changes: Sequence[ChangePoint]) -> list[ChangeGroup]:
    """One group per (deployment, date, shape, range), in the order their first member comes."""
    groups: dict[tuple[str, str, str, str], list[ChangePoint]] = {}
    for c in changes:
        groups.setdefault((c.deployment, c.night_id, c.kind, c.where), []).append(c)
    return [ChangeGroup(key[0], tuple(members)) for key, members in groups.items()]


def _trimmed(values: Sequence[float], settings: DetectorSettings) -> np.ndarray:
    return np.asarray(values, dtype=float)[-settings.max_nights:]


def _first_p_value(values: Sequence[float], settings: DetectorSettings) -> float:
    """p-value of the best single change of a whole series (1.0 when too short or constant)."""
    y = _trimmed(values, settings)
    if len(y) < 2 * settings.min_segment:
        return 1.0
    change = _best(y, settings)
    return 1.0 if change is None else change.p_value


def _benjamini_hochberg(p_values: Sequence[float], rate: float) -> float:
    """The largest p-value that still counts when `rate` of the changes reported may be false."""
    ranked = sorted(p_values)
    passing = [p for i, p in enumerate(ranked, start=1) if p <= rate * i / len(ranked)]
    return max(passing, default=0.0)


def history_change_points(nights: Sequence[NightRecord], metrics: Sequence[str] = tuple(METRIC_BETTER),
                          settings: DetectorSettings | None = None) -> list[ChangePoint]:
    """Change points of every (deployment, concurrency, metric), each over the nights comparable with
    one another (same sweep, GPUs and engine): a change of hardware is not a change point.

    A history has dozens of series, so a per-series 0.5% would still flag a clean history now and
    then; the threshold is instead the Benjamini-Hochberg one over every series of the history.
    """
    settings = settings or DetectorSettings()
    ordered = sorted(nights, key=lambda n: n.order)
    groups: dict[object, list[NightRecord]] = {}
    for night in ordered:
        groups.setdefault(night.key, []).append(night)
    series: list[tuple[str, int, str, list[str], list[float], list[bool]]] = []
    for group in groups.values():
        for dep, concurrency in sorted({p for n in group for p in n.points()}):
            for metric in metrics:
                pairs = [(n, v) for n in group if (v := n.value(dep, concurrency, metric)) is not None]
                builds = [n.build_of(dep) for n, _ in pairs]
                changed = [i > 0 and builds[i] != builds[i - 1] for i in range(len(builds))]
                series.append((dep, concurrency, metric, [n.night_id for n, _ in pairs], [v for _, v in pairs],
                               changed))
    if not series:
        return []
    threshold = _benjamini_hochberg([_first_p_value(values, settings) for *_, values, _ in series],
                                    settings.false_discovery_rate)
    strict = replace(settings, alpha=min(settings.alpha, threshold))
    out: list[ChangePoint] = []
    for dep, concurrency, metric, ids, values, changed in series:
        if threshold <= 0:
            break
        for c in detect_changes(values, strict, changed):
            better = METRIC_BETTER.get(metric)
            worse = None if better is None else (c.after < c.before if better == "higher" else c.after > c.before)
            out.append(ChangePoint(dep, concurrency, metric, ids[c.index], ids[c.earliest], ids[c.latest], c.kind,
                                   c.before, c.after, c.relative_change, c.p_value, worse,
                                   best_night=ids[c.best], dated_by=c.dated_by))
    return out
