"""GPU telemetry through NVML (harness/telemetry.py). This machine has no GPU and no NVIDIA driver: the
absent path runs for real (the binding is installed, its library is not found); the present path runs
with an in-process fake NVML module beside it, as the sampler would see two H200s."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes import FakeLauncher, FakeLoadGenerator
from test_runner_policy import sweep

from harness.report.plots import build_timeseries_figure
from harness.report.timeseries import load_timeline
from harness.results import iter_points
from harness.telemetry import UNAVAILABLE, GpuSampler, load_nvml, read_gpu_jsonl, summarise


class FakeNvml:
    """The NVML calls the sampler makes; GPU i draws 100 + i W and receives 2 GB/s over PCIe."""

    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1

    def __init__(self, count: int = 2):
        self.count, self.inits = count, 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return int(uuid.rsplit("-", 1)[1])

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=50 + 10 * h)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=(100 + h) * 2**30)

    def nvmlDeviceGetPowerUsage(self, h):
        return (100 + h) * 1000  # mW

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        return 2_000_000 if counter == self.NVML_PCIE_UTIL_RX_BYTES else 500_000  # KB/s


def test_without_a_driver_the_binding_reports_unavailable(tmp_path):
    nvml, why = load_nvml()
    assert nvml is None and why.startswith("NVML:")  # the real pynvml: "NVML Shared Library Not Found"
    summary = GpuSampler(tmp_path / "gpu.jsonl", 0.1).start().stop()
    assert summary.status == UNAVAILABLE and summary.reason == why and summary.mean_power_w is None
    assert not (tmp_path / "gpu.jsonl").exists()  # nothing invented


def test_without_the_binding_it_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert load_nvml() == (None, "the NVML binding (nvidia-ml-py) is not installed")


def test_the_server_gpus_are_sampled_into_gpu_jsonl_and_summarised(tmp_path):
    out = tmp_path / "gpu.jsonl"
    sampler = GpuSampler(out, 0.05, visible_devices="GPU-x-1", nvml=FakeNvml(count=4)).start()
    time.sleep(0.3)
    summary = sampler.stop()
    rows = read_gpu_jsonl(out)
    assert {r["gpu"] for r in rows} == {"GPU-x-1"} and summary.samples == len(rows) >= 3
    assert summary.status == "ok" and summary.mean_power_w == pytest.approx(101.0)
    assert summary.mean_pcie_h2d_gb_s == pytest.approx(2.0) and summary.mean_pcie_d2h_gb_s == pytest.approx(0.5)
    both = summarise([{**r, "gpu": g} for r in rows[:1] for g in ("0", "1")])
    assert both.mean_power_w == pytest.approx(2 * 101.0) and both.mean_util_pct == pytest.approx(60.0)


def test_a_point_records_unavailable_telemetry_and_goes_on(tmp_path):
    outcome = sweep(tmp_path, FakeLauncher(), FakeLoadGenerator(), arms=("a",))
    assert outcome.status == "ok"
    for point in iter_points(outcome.run_dir):
        assert point.gpu.status == UNAVAILABLE and point.gpu.reason.startswith("NVML:")


def test_the_time_series_figure_gets_pcie_and_power_where_there_were_gpus(tmp_path):
    outcome = sweep(tmp_path, FakeLauncher(), FakeLoadGenerator(), arms=("a",))
    point_dir = Path(outcome.run_dir) / "points/a/c2"
    sampler = GpuSampler(point_dir / "gpu.jsonl", 0.05, nvml=FakeNvml(count=2)).start()
    time.sleep(0.2)
    sampler.stop()
    timeline = load_timeline(outcome.run_dir, "a")
    assert [s.label for s in timeline.gpu_power_w] == ["power, server GPUs (NVML)"]
    assert timeline.gpu_power_w[0].values[0] == pytest.approx(201.0)
    assert "PCIe host→GPU (NVML)" in [s.label for s in timeline.transfer_gb_s]
    assert len(build_timeseries_figure(timeline).axes) == 4
