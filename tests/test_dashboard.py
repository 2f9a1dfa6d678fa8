"""The nightly dashboard in a real headless Chromium: it loads from file:// alone, logs no error,
and shows one trend chart per (metric, deployment). `visit_offline` is shared with the end-to-end
nightly test (tests/test_nightly_e2e.py), which opens the dashboard of a simulated-engine history."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from synthetic_nights import HISPARSE, OFFLOAD, Change, synthetic_history

from harness.nightly.dashboard import build_dashboard
from harness.nightly.store import NightStore
from harness.nightly.thresholds import METRIC_BETTER

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]


def browser() -> str:
    for name in BROWSERS:
        if found := shutil.which(name):
            return found
    pytest.skip("no Chromium on this machine: apt-get install -y chromium chromium-driver")


def _history(root: Path) -> NightStore:
    store = NightStore(root / "history")
    report = root / "report.md"
    report.write_text("# night report\n")
    figure = root / "pareto.svg"
    figure.write_text('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>')
    changes = [Change("interactivity_tok_s_user", 5, per_night=-0.02, deployment=HISPARSE, concurrency=16),
               Change("total_tok_s_per_gpu", 9, factor=0.85, deployment=OFFLOAD)]
    for night in synthetic_history(12, changes=changes):
        store.add(night, report=report, figures=[figure])
    return store


class _Cdp:
    """The few DevTools protocol calls the test needs, over the page's websocket."""

    def __init__(self, ws) -> None:
        self.ws, self.next_id, self.events = ws, 0, []

    async def call(self, method: str, **params) -> dict:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            message = await asyncio.wait_for(self.ws.receive_json(), timeout=30)
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return message.get("result", {})
            self.events.append(message)

    async def wait_for(self, method: str, timeout_s: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout_s
        seen = len(self.events)
        while True:
            for event in self.events[seen:]:
                if event.get("method") == method:
                    return event
            seen = len(self.events)
            message = await asyncio.wait_for(self.ws.receive_json(), timeout=deadline - time.monotonic())
            self.events.append(message)


async def _visit(port: int, urls: list[str], screenshot: Path | None) -> tuple[list[dict], list[dict]]:
    """Load each url in turn; returns (DevTools events, what the script below read off each page).
    The first page is also saved as a PNG at `screenshot`, when given."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
            page = next(t for t in await resp.json() if t["type"] == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            cdp = _Cdp(ws)
            for domain in ("Network", "Runtime", "Log", "Page"):
                await cdp.call(f"{domain}.enable")
            found = []
            for url in urls:
                await cdp.call("Page.navigate", url=url)
                await cdp.wait_for("Page.loadEventFired")
                result = await cdp.call("Runtime.evaluate", returnByValue=True, expression="""JSON.stringify({
                    charts: [...document.querySelectorAll('svg.trend-chart')].map(
                        s => [s.dataset.metric, s.dataset.deployment, s.getBoundingClientRect().width]),
                    regressions: document.querySelectorAll('circle.regression').length,
                    changePoints: document.querySelectorAll('g.change-point').length,
                    links: [...document.querySelectorAll('a')].map(a => new URL(a.getAttribute('href'), document.baseURI).href),
                    title: document.title})""")
                found.append(json.loads(result["result"]["value"]))
                if screenshot is not None and url == urls[0]:
                    await cdp.call("Emulation.setDeviceMetricsOverride", width=1200, height=900,
                                   deviceScaleFactor=1, mobile=False)
                    shot = await cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
                    screenshot.write_bytes(base64.b64decode(shot["data"]))
            return cdp.events, found


def visit_offline(workdir: Path, urls: list[str], screenshot: Path | None = None) -> tuple[list[dict], list[dict]]:
    """Open each file:// url in a fresh headless Chromium (skips without one); (DevTools events, pages)."""
    chromium = browser()
    profile = workdir / "chromium-profile"
    proc = subprocess.Popen([chromium, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.is_file() and port_file.read_text().strip()):
            assert proc.poll() is None, f"{chromium} exited with {proc.returncode}"
            assert time.monotonic() < deadline, "Chromium did not open its DevTools port in 30 s"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        return asyncio.run(_visit(port, urls, screenshot))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def requested_urls(events: list[dict]) -> list[str]:
    return [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]


def console_errors(events: list[dict]) -> list[dict]:
    """Script exceptions, console.error calls, error log entries and failed loads."""
    return [e for e in events if e.get("method") in ("Runtime.exceptionThrown", "Network.loadingFailed")
            or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] == "error")
            or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]


@pytest.mark.slow
def test_dashboard_opens_offline_in_headless_chromium_with_a_chart_per_metric_and_deployment(tmp_path: Path) -> None:
    browser()
    store = _history(tmp_path)
    out = tmp_path / "site"
    result = build_dashboard(store, out)
    assert result.warnings == [] and result.night_pages == 12
    assert result.charts == len(METRIC_BETTER) * 2
    html = (out / "index.html").read_text()
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in html
    night = store.load().nights[-1].night_id
    events, pages = visit_offline(tmp_path, [(out / "index.html").as_uri(),
                                             (out / "nights" / f"{night}.html").as_uri()])
    requested = requested_urls(events)
    assert requested and all(u.startswith("file://") for u in requested), requested
    assert console_errors(events) == []
    index, night_page = pages
    charts = {(metric, dep) for metric, dep, width in index["charts"] if width > 0}
    assert len(index["charts"]) == len(charts) == len(METRIC_BETTER) * 2
    assert charts == {(m, d) for m in METRIC_BETTER for d in (HISPARSE, OFFLOAD)}
    assert index["regressions"] > 0 and index["changePoints"] >= 2  # the drift and the step are marked
    assert all(link.startswith("file://") for link in index["links"])
    assert any(link.endswith(f"nights/{night}.html") for link in index["links"])
    linked = [link for link in night_page["links"] if "/artifacts/" in link]
    assert linked and all(Path(link.removeprefix("file://")).is_file() for link in linked)


def test_nights_started_within_one_minute_are_told_apart_by_their_ids(tmp_path: Path) -> None:
    """A replayed or simulated history can start a night a second: the x labels fall back to the ids."""
    store = NightStore(tmp_path / "history")
    nights = synthetic_history(4)
    for i, night in enumerate(nights):
        store.add(night.model_copy(update={"started_at": f"2026-12-01T21:23:{10 + i:02d}Z"}))
    build_dashboard(store, tmp_path / "site")
    index = (tmp_path / "site" / "index.html").read_text()
    assert all(f">{n.night_id}</text></a>" in index for n in nights)
    assert "12-01 21:23</text>" not in index
