"""The /metrics scraper against a real HTTP server on 127.0.0.1 serving fixture text."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.metrics.derive import derive_point_metrics
from harness.metrics.scrape import ScrapeError, Scraper, ScrapeRecord, read_scrapes, scrape_once

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
GOOD = (FIXTURES / "vllm_dp2.prom").read_text()
MALFORMED = (FIXTURES / "malformed.prom").read_text()
NEVER = 3600.0  # an interval no test waits for: only the start and stop scrapes happen


@dataclass
class MetricsServer:
    """What /metrics answers is switchable while the server runs."""

    url: str
    body: str = GOOD
    status: int = 200
    requests: int = 0


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    state = MetricsServer(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            state.requests += 1
            data = state.body.encode()
            self.send_response(state.status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


def _scrape_indices(records: list[ScrapeRecord]) -> list[int]:
    return sorted({r.scrape for r in records})


def test_scrape_once_parses_and_filters(server):
    samples = scrape_once(server.url, ["vllm:"], timeout_s=5)
    assert len(samples) == 24
    assert len(scrape_once(server.url, [], timeout_s=5)) == 25


def test_scrape_once_errors_are_one_line(server):
    server.status = 500
    with pytest.raises(ScrapeError, match="HTTP 500"):
        scrape_once(server.url, ["vllm:"], timeout_s=5)
    with pytest.raises(ScrapeError) as info:
        scrape_once("http://127.0.0.1:9/metrics", ["vllm:"], timeout_s=2)
    assert "ConnectionError" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.timeout(60)
def test_start_and_stop_scrapes_and_stop_is_prompt(server, tmp_path):
    out = tmp_path / "c8" / "scrapes.jsonl"
    scraper = Scraper(server.url, out, interval_s=NEVER, keep_prefixes=["vllm:"], timeout_s=5)
    scraper.start()
    # stop() must not wait out the hour-long interval (the test timeout would fire)
    assert scraper.stop() == 2
    records = read_scrapes(out)
    assert _scrape_indices(records) == [0, 1]
    assert len(records) == 2 * 24
    first = json.loads(out.read_text().splitlines()[0])
    assert set(first) == {"t", "scrape", "name", "labels", "value"}
    assert all(r.name.startswith("vllm:") for r in records)


@pytest.mark.timeout(60)
def test_periodic_scrapes_append_and_flush_each_scrape(server, tmp_path):
    out = tmp_path / "scrapes.jsonl"
    with Scraper(server.url, out, interval_s=0.05, keep_prefixes=["vllm:"], timeout_s=5) as scraper:
        while scraper.scrapes_taken < 4:
            time.sleep(0.01)
        # flushed per scrape: readable while the scraper still runs
        assert len(_scrape_indices(read_scrapes(out))) >= 4
    records = read_scrapes(out)
    indices = _scrape_indices(records)
    assert indices == list(range(scraper.scrapes_taken)) and len(indices) >= 5
    assert all(sum(1 for r in records if r.scrape == i) == 24 for i in indices)
    times = [min(r.t for r in records if r.scrape == i) for i in indices]
    assert times == sorted(times)


@pytest.mark.timeout(60)
def test_malformed_and_failed_scrapes_are_recorded_not_fatal(server, tmp_path):
    out = tmp_path / "scrapes.jsonl"
    scraper = Scraper(server.url, out, interval_s=0.05, keep_prefixes=["vllm:"], timeout_s=5).start()
    server.body = MALFORMED
    while scraper.scrapes_failed < 2:
        time.sleep(0.01)
    server.body, server.status = "oops", 503
    target = scraper.scrapes_taken + 2
    while scraper.scrapes_taken < target:
        time.sleep(0.01)
    server.body, server.status = GOOD, 200
    scraper.stop()
    records = read_scrapes(out)
    errors = [r for r in records if r.failed]
    assert any("malformed Prometheus exposition text" in r.error for r in errors)
    assert any("HTTP 503" in r.error for r in errors)
    assert all(r.name is None and "\n" not in r.error for r in errors)
    last = max(r.scrape for r in records)
    assert not any(r.failed for r in records if r.scrape == last)  # scraping went on after them
    assert json.loads(out.read_text().splitlines()[24]).keys() == {"t", "scrape", "error"}


def test_interrupt_skips_the_final_scrape(server, tmp_path):
    out = tmp_path / "scrapes.jsonl"
    with pytest.raises(KeyboardInterrupt), Scraper(server.url, out, interval_s=NEVER):
        raise KeyboardInterrupt
    assert _scrape_indices(read_scrapes(out)) == [0]
    with pytest.raises(RuntimeError), Scraper(server.url, out, interval_s=NEVER):
        raise RuntimeError("evalscope crashed")
    assert len({(r.scrape, r.t) for r in read_scrapes(out)}) == 3  # that point still ends with a scrape


def test_unreachable_server_records_errors(tmp_path):
    out = tmp_path / "scrapes.jsonl"
    with Scraper("http://127.0.0.1:9/metrics", out, interval_s=NEVER, timeout_s=2):
        pass
    records = read_scrapes(out)
    assert [r.scrape for r in records] == [0, 1] and all(r.failed for r in records)


def test_empty_answer_is_a_good_scrape_with_no_samples(server, tmp_path):
    server.body = "# nothing here yet\n"
    out = tmp_path / "scrapes.jsonl"
    with Scraper(server.url, out, interval_s=NEVER):
        pass
    assert [json.loads(line) for line in out.read_text().splitlines()][0].get("empty") is True
    metrics = derive_point_metrics(read_scrapes(out), None, gpus_per_server=8)
    assert metrics.scrapes_ok == 2 and metrics.occupancy_mean_running is None


def test_scraped_server_text_gives_derived_metrics(server, tmp_path):
    """Start scrape, load changes the counters, stop scrape: derive from what was really scraped."""
    out = tmp_path / "scrapes.jsonl"
    scraper = Scraper(server.url, out, interval_s=NEVER, keep_prefixes=["vllm:"]).start()
    # engine 0 drafts 1000 -> 1500 and accepts 2100 -> 3100; engine 1 unchanged
    server.body = GOOD.replace(
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="glm-agentx"} 1000.0',
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="glm-agentx"} 1500.0').replace(
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="glm-agentx"} 2100.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="glm-agentx"} 3100.0')
    scraper.stop()
    m = derive_point_metrics(read_scrapes(out), None, gpus_per_server=8)
    assert m.scrapes_ok == 2 and m.scrapes_failed == 0
    assert m.mtp_acceptance_length == pytest.approx(1 + 1000 / 500)
    assert m.occupancy_mean_running == 15.0 and m.max_running == 15.0  # 8 + 7 across engines
    assert m.mean_waiting == 1.0
    assert m.kv_usage_mean == pytest.approx(0.625) and m.kv_usage_max == 0.75
    assert m.preemptions == 0.0 and m.server_tpot_ms is None  # no requests finished in between
    assert m.offload_load_bytes is None  # this server exposes no offload series


def test_read_scrapes_skips_torn_line_and_missing_file(tmp_path):
    assert read_scrapes(tmp_path / "absent.jsonl") == []
    path = tmp_path / "scrapes.jsonl"
    good = {"t": 1.0, "scrape": 0, "name": "vllm:num_requests_running", "labels": {}, "value": 3.0}
    path.write_text(json.dumps(good) + "\n" + json.dumps(good)[:25])
    assert read_scrapes(path) == [ScrapeRecord(t=1.0, scrape=0, name="vllm:num_requests_running", value=3.0)]


def test_scraper_rejects_bad_settings_and_reports_write_failures(server, tmp_path):
    with pytest.raises(ValueError):
        Scraper(server.url, tmp_path / "s.jsonl", interval_s=0)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(HarnessError, match="cannot write scrapes"):
        Scraper(server.url, blocker / "scrapes.jsonl", interval_s=NEVER).start()
