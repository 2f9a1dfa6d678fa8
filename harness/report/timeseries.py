"""A deployment's /metrics scrapes over a whole run, as series a time-series figure draws.

All the points of one deployment ran against one server, so their scrapes.jsonl files
join into one timeline. Gauges are combined across label sets per scrape (request
counts add up, usage fractions are averaged); counter rates are taken between
successive good scrapes per label set, and a counter that went down (a server
restart) counts its new value from zero, as the point metrics do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from harness import vllm_names as names
from harness.metrics.scrape import read_scrapes
from harness.records import PointRecord
from harness.results import RunPaths, iter_points
from harness.telemetry import GPU_JSONL, read_gpu_jsonl

RUNNING = names.RUNNING
WAITING = names.WAITING
KV_USAGE = (names.KV_USAGE, names.KV_USAGE_OLD)  # the second: older vLLM
HOST_USAGE = {names.OFFLOAD_CPU_USAGE: "offload CPU pool", names.HISPARSE_HOST_USAGE: "HiSparse host pool"}
RATES = {names.OFFLOAD_LOAD_BYTES: "offload load (host→GPU)", names.OFFLOAD_STORE_BYTES: "offload store (GPU→host)",
         names.HISPARSE_H2D_BYTES: "HiSparse host→GPU"}

LabelKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Series:
    label: str
    t_s: list[float]  # seconds since the timeline's origin
    values: list[float]


@dataclass(frozen=True)
class PointWindow:
    concurrency: int
    status: str
    start_s: float  # seconds since the timeline's origin
    end_s: float


@dataclass
class DeploymentTimeline:
    """What the time-series figure of one deployment shows; absent metrics are absent series."""

    deployment: str
    origin_unix_s: float
    requests: list[Series] = field(default_factory=list)  # running, waiting
    kv_usage: list[Series] = field(default_factory=list)  # fractions 0..1
    transfer_gb_s: list[Series] = field(default_factory=list)
    gpu_power_w: list[Series] = field(default_factory=list)  # NVML, the server's GPUs summed (gpu.jsonl)
    windows: list[PointWindow] = field(default_factory=list)
    scrapes_failed_t_s: list[float] = field(default_factory=list)
    counter_resets_t_s: list[float] = field(default_factory=list)  # a counter went down: server restart

    @property
    def empty(self) -> bool:
        return not (self.requests or self.kv_usage or self.transfer_gb_s)


@dataclass(frozen=True)
class _Snapshot:
    t: float
    series: dict[str, dict[LabelKey, float]]


def _snapshots(paths: list[Path]) -> tuple[list[_Snapshot], list[float]]:
    grouped: dict[tuple[str, int, float], list] = {}
    for path in paths:
        for record in read_scrapes(path):
            grouped.setdefault((str(path), record.scrape, record.t), []).append(record)
    snapshots: list[_Snapshot] = []
    failed_t: list[float] = []
    for (_, _, t), records in grouped.items():
        if any(r.error is not None for r in records):
            failed_t.append(t)
            continue
        series: dict[str, dict[LabelKey, float]] = {}
        for r in records:
            if r.name is not None and r.value is not None and math.isfinite(r.value):
                series.setdefault(r.name, {})[tuple(sorted(r.labels.items()))] = r.value
        snapshots.append(_Snapshot(t, series))
    snapshots.sort(key=lambda s: s.t)
    return snapshots, sorted(failed_t)


def _gauge(snapshots: list[_Snapshot], names: tuple[str, ...], origin: float, label: str,
           average: bool) -> Series | None:
    t_s: list[float] = []
    values: list[float] = []
    for snap in snapshots:
        found = next((snap.series[n] for n in names if n in snap.series), None)
        if found:
            t_s.append(snap.t - origin)
            total = sum(found.values())
            values.append(total / len(found) if average else total)
    return Series(label, t_s, values) if t_s else None


def _rate(snapshots: list[_Snapshot], name: str, origin: float, label: str, scale: float) -> Series | None:
    t_s: list[float] = []
    values: list[float] = []
    previous: _Snapshot | None = None
    for snap in snapshots:
        if name not in snap.series:
            continue
        if previous is not None and snap.t > previous.t:
            delta = 0.0
            for key, value in snap.series[name].items():
                before = previous.series[name].get(key, 0.0)
                delta += value - before if value >= before else value
            # a rate belongs to the interval: draw it at the interval's middle
            t_s.append((previous.t + snap.t) / 2 - origin)
            values.append(delta / (snap.t - previous.t) * scale)
        previous = snap
    return Series(label, t_s, values) if t_s else None


def _reset_times(snapshots: list[_Snapshot], origin: float) -> list[float]:
    times: list[float] = []
    last: dict[tuple[str, LabelKey], float] = {}
    for snap in snapshots:
        went_down = False
        for name, by_labels in snap.series.items():
            if not name.endswith(("_total", "_count", "_sum")):
                continue
            for key, value in by_labels.items():
                before = last.get((name, key))
                went_down |= before is not None and value < before
                last[(name, key)] = value
        if went_down:
            times.append(snap.t - origin)
    return times


def _windows(points: list[PointRecord], origin: float) -> list[PointWindow]:
    return [PointWindow(p.concurrency, p.status, p.started_unix_s - origin, p.ended_unix_s - origin)
            for p in points if p.started_unix_s is not None and p.ended_unix_s is not None]


def load_timeline(run_dir: Path, deployment: str, points: list[PointRecord] | None = None) -> DeploymentTimeline:
    """The joined scrapes of every point of `deployment` in the run."""
    paths = RunPaths(Path(run_dir))
    if points is None:
        points = [p for p in iter_points(run_dir) if p.deployment == deployment]
    files = sorted(paths.root.glob(f"points/{deployment}/[cp][0-9]*/scrapes.jsonl"))
    snapshots, failed_t = _snapshots(files)
    starts = [p.started_unix_s for p in points if p.started_unix_s is not None]
    origin = min(starts + [s.t for s in snapshots[:1]] + failed_t[:1], default=0.0)
    timeline = DeploymentTimeline(deployment, origin, windows=_windows(points, origin),
                                  scrapes_failed_t_s=[t - origin for t in failed_t],
                                  counter_resets_t_s=_reset_times(snapshots, origin))
    for series in (_gauge(snapshots, (RUNNING,), origin, "running", average=False),
                   _gauge(snapshots, (WAITING,), origin, "waiting", average=False)):
        if series is not None:
            timeline.requests.append(series)
    gpu_kv = _gauge(snapshots, KV_USAGE, origin, "GPU KV cache", average=True)
    if gpu_kv is not None:
        timeline.kv_usage.append(gpu_kv)
    for name, label in HOST_USAGE.items():
        series = _gauge(snapshots, (name,), origin, label, average=True)
        if series is not None:
            timeline.kv_usage.append(series)
    for name, label in RATES.items():
        series = _rate(snapshots, name, origin, label, scale=1e-9)
        if series is not None:
            timeline.transfer_gb_s.append(series)
    gpu_rows = [r for f in sorted(paths.root.glob(f"points/{deployment}/[cp][0-9]*/{GPU_JSONL}")) for r in read_gpu_jsonl(f)]
    if gpu_rows:
        timeline.transfer_gb_s.append(_gpu_sum(gpu_rows, "pcie_rx_gb_s", origin, "PCIe host→GPU (NVML)"))
        timeline.gpu_power_w.append(_gpu_sum(gpu_rows, "power_w", origin, "power, server GPUs (NVML)"))
    return timeline


def _gpu_sum(rows: list[dict], key: str, origin: float, label: str) -> Series:
    """One NVML value summed over the server's GPUs at each sampling time."""
    by_t: dict[float, float] = {}
    for row in rows:
        by_t[row["t"]] = by_t.get(row["t"], 0.0) + float(row.get(key) or 0.0)
    times = sorted(by_t)
    return Series(label, [t - origin for t in times], [by_t[t] for t in times])
