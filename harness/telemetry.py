"""GPU telemetry: each server GPU's utilisation, memory, power and PCIe throughput, sampled through the
NVIDIA Management Library's Python binding (`nvidia-ml-py`, imported as `pynvml`) at the scrape
interval, in the process that owns the server (the driver for the local launcher, the Ray actor on the
server's node), into the point's gpu.jsonl, and summarised for point.json.

Where NVML is absent (no binding, no driver, no GPU) the point records "unavailable" with the reason and
the run goes on; nothing is estimated in its place. Tests pass an in-process fake module object with
the same functions (`nvml=`), so the sampling and summarising run without a GPU.

PCIe: NVML reports KB/s over a 20 ms sample; RX is what the GPU received, i.e. host-to-device.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from harness.records import GpuTelemetry

UNAVAILABLE = "unavailable"
GPU_JSONL = "gpu.jsonl"  # a point's samples, beside its scrapes.jsonl
_KB_S_TO_GB_S = 1e3 / 1e9


def load_nvml(nvml: Any = None) -> tuple[Any, str | None]:
    """(an initialised NVML module, None) or (None, why not)."""
    if nvml is None:
        try:
            import pynvml as nvml  # the heavy part is the driver library, loaded by nvmlInit
        except ImportError:
            return None, "the NVML binding (nvidia-ml-py) is not installed"
    try:
        nvml.nvmlInit()
        if nvml.nvmlDeviceGetCount() < 1:
            return None, "NVML sees no GPU"
    except Exception as exc:  # NVMLError and the library-not-found error it wraps
        return None, f"NVML: {' '.join(str(exc).split()) or type(exc).__name__}"
    return nvml, None


def _handles(nvml: Any, visible: str | None) -> list[tuple[str, Any]]:
    """The server's GPUs: CUDA_VISIBLE_DEVICES as indices or UUIDs, else every GPU NVML sees."""
    if not visible:
        return [(str(i), nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    out = []
    for item in (v.strip() for v in visible.split(",") if v.strip()):
        handle = (nvml.nvmlDeviceGetHandleByIndex(int(item)) if item.isdigit()
                  else nvml.nvmlDeviceGetHandleByUUID(item))
        out.append((item, handle))
    return out


def _sample_once(nvml: Any, handles: list[tuple[str, Any]], t: float) -> list[dict[str, Any]]:
    rows = []
    for name, h in handles:
        rows.append({
            "t": t, "gpu": name,
            "util_pct": float(nvml.nvmlDeviceGetUtilizationRates(h).gpu),
            "mem_used_bytes": int(nvml.nvmlDeviceGetMemoryInfo(h).used),
            "power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,  # mW
            "pcie_rx_gb_s": nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES) * _KB_S_TO_GB_S,
            "pcie_tx_gb_s": nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES) * _KB_S_TO_GB_S,
        })
    return rows


def summarise(rows: list[dict[str, Any]]) -> GpuTelemetry:
    """Means over the samples of the server's GPUs added up (power, PCIe) or averaged (utilisation)."""
    if not rows:
        return GpuTelemetry(status=UNAVAILABLE, reason="no sample was taken")
    by_t: dict[float, list[dict[str, Any]]] = {}
    for row in rows:
        by_t.setdefault(row["t"], []).append(row)
    steps = list(by_t.values())
    return GpuTelemetry(
        status="ok", gpus=sorted({r["gpu"] for r in rows}), samples=len(steps),
        mean_power_w=statistics.fmean(sum(r["power_w"] for r in s) for s in steps),
        mean_pcie_h2d_gb_s=statistics.fmean(sum(r["pcie_rx_gb_s"] for r in s) for s in steps),
        mean_pcie_d2h_gb_s=statistics.fmean(sum(r["pcie_tx_gb_s"] for r in s) for s in steps),
        mean_util_pct=statistics.fmean(r["util_pct"] for r in rows),
        max_memory_used_gib=max(r["mem_used_bytes"] for r in rows) / 2**30)


class GpuSampler:
    """Samples the server's GPUs every `interval_s` into `out_path` (gpu.jsonl) until stop()."""

    def __init__(self, out_path: Path, interval_s: float, visible_devices: str | None = None, nvml: Any = None):
        self.out_path, self.interval_s = Path(out_path), interval_s
        self._visible, self._nvml_in = visible_devices, nvml
        self._rows: list[dict[str, Any]] = []
        self._reason: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> GpuSampler:
        nvml, self._reason = load_nvml(self._nvml_in)
        if nvml is None:
            return self
        try:
            handles = _handles(nvml, self._visible)
        except Exception as exc:
            self._reason = f"NVML: cannot open the server's GPUs {self._visible}: {exc}"
            return self
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._loop, args=(nvml, handles), name="gpu-telemetry", daemon=True)
        self._thread.start()
        return self

    def _loop(self, nvml: Any, handles: list[tuple[str, Any]]) -> None:
        with self.out_path.open("a", encoding="utf-8") as out:
            while True:
                try:
                    rows = _sample_once(nvml, handles, time.time())
                except Exception as exc:  # a GPU fell off the bus: stop sampling, say why
                    self._reason = f"NVML sampling stopped: {exc}"
                    return
                self._rows += rows
                out.write("".join(json.dumps(r) + "\n" for r in rows))
                out.flush()
                if self._stop.wait(self.interval_s):
                    return

    def stop(self) -> GpuTelemetry:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if not self._rows:
            return GpuTelemetry(status=UNAVAILABLE, reason=self._reason or "no sample was taken")
        summary = summarise(self._rows)
        return summary.model_copy(update={"reason": self._reason}) if self._reason else summary


def read_gpu_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    try:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by a kill
    except OSError:
        return []
    return rows
