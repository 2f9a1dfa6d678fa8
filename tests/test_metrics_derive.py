"""Derived point metrics against values computed by hand from fixture scrapes and summaries.

point_dp2_reset.jsonl: two engines (DP2), scrapes at t=970 (before the point), 1000, 1030,
1060 (failed), 1090, 1120 and 1150 (after the point); engine 1 restarts between 1030 and 1090,
so every one of its counters drops there. point_nospec.jsonl: one engine, older vLLM
(gpu_cache_usage_perc), no spec-decode, offload or HiSparse series.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.metrics.derive import Snapshot, counter_delta, derive_point_metrics
from harness.metrics.evalscope_summary import parse_summary
from harness.metrics.scrape import ScrapeRecord, read_scrapes
from harness.records import PointMetrics

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
WINDOW = (1000.0, 1120.0)


@pytest.fixture(scope="module")
def dp2_reset() -> list[ScrapeRecord]:
    return read_scrapes(FIXTURES / "point_dp2_reset.jsonl")


def test_every_metric_of_a_dp2_point_with_a_reset_and_a_failed_scrape(dp2_reset):
    summary = parse_summary(FIXTURES / "summary_evalscope_1.9.json")  # TPOT 18.5 ms, 16000/1200 tok/s
    m = derive_point_metrics(dp2_reset, summary, gpus_per_server=8, window=WINDOW)
    approx = pytest.approx
    # from EvalScope
    assert m.interactivity_tok_s_user == approx(1000 / 18.5)
    assert m.total_tok_s_per_gpu == 2000.0 and m.output_tok_s_per_gpu == 150.0
    assert m.mean_ttft_ms == 2875.4 and m.mean_tpot_ms == 18.5
    # gauges, summed over engines per scrape: running 0, 16, 15, 1; waiting 0, 3, 0, 0
    assert m.occupancy_mean_running == approx((16 + 15 + 1) / 3)
    assert m.max_running == 16.0 and m.mean_waiting == approx(0.75)
    # KV usage, a fraction averaged over engines: 0.1, 0.6, 0.7, 0.25; the largest engine value 0.8
    assert m.kv_usage_mean == approx(0.4125) and m.kv_usage_max == 0.8
    # counters per engine, engine 1 counted from zero after its drop:
    # drafts e0 100..400 = 300, e1 1000,1100,50,150 = 100+50+100; accepted e0 600, e1 200+100+200
    assert m.mtp_acceptance_length == approx(1 + 1100 / 550)
    assert m.preemptions == 9.0  # e0 2,3,5,6 -> 4; e1 10,12,1,3 -> 2+1+2
    assert m.offload_load_bytes == approx(5.5e9) and m.offload_store_bytes == approx(5e9)
    assert m.offload_load_bytes_per_s == approx(5.5e9 / 120) and m.offload_store_bytes_per_s == approx(5e9 / 120)
    assert m.hisparse_hit_rate == approx(4500 / (4500 + 500))
    assert m.hisparse_h2d_bytes_per_s == approx(3e9 / 120)
    assert m.prefix_cache_hit_rate == approx(3.8e5 / 5e5)
    # server TPOT: d(sum) 3.0 + 2.5 s over d(count) 150 + 125 requests
    assert m.server_tpot_ms == approx(20.0)
    assert m.tpot_rel_diff == approx((20.0 - 18.5) / 18.5) and m.tpot_disagrees is False
    assert m.tpot_client_low is False and m.server_interactivity_tok_s_user == approx(1000 / 20.0)
    # one restart seen (one scrape step where counters went down), the failed scrape counted
    assert m.counter_resets == 1 and m.scrapes_ok == 4 and m.scrapes_failed == 1
    assert m.window_s == 120.0


def test_window_excludes_scrapes_outside_the_point(dp2_reset):
    inside = derive_point_metrics(dp2_reset, None, gpus_per_server=8, window=WINDOW)
    everything = derive_point_metrics(dp2_reset, None, gpus_per_server=8)
    assert everything.scrapes_ok == 6 and everything.window_s == 180.0
    # running 40 (before) and 60 (after) join 16, 15, 1
    assert everything.occupancy_mean_running == pytest.approx((40 + 16 + 15 + 1 + 60) / 5)
    assert everything.max_running == 60.0 and inside.max_running == 16.0


def test_client_server_tpot_disagreement_is_flagged(dp2_reset):
    summary = parse_summary(FIXTURES / "summary_evalscope_1.14.1.json")  # TPOT 11.85 ms
    m = derive_point_metrics(dp2_reset, summary, gpus_per_server=1, window=WINDOW)
    assert m.tpot_rel_diff == pytest.approx((20.0 - 11.85) / 11.85)
    assert m.tpot_disagrees is True
    # the client saw a faster decode than the engine ran: its stream came late and in bursts
    assert m.tpot_client_low is True and m.server_interactivity_tok_s_user == pytest.approx(50.0)
    assert m.total_tok_s_per_gpu == 409.709 and m.interactivity_tok_s_user == pytest.approx(1000 / 11.85)


def test_server_without_spec_decode_offload_or_hisparse():
    records = read_scrapes(FIXTURES / "point_nospec.jsonl")
    m = derive_point_metrics(records, None, gpus_per_server=1)
    assert m.mtp_acceptance_length is None
    assert (m.offload_load_bytes, m.offload_store_bytes, m.offload_load_bytes_per_s,
            m.offload_store_bytes_per_s) == (None, None, None, None)
    assert m.hisparse_hit_rate is None and m.hisparse_h2d_bytes_per_s is None
    assert m.prefix_cache_hit_rate is None  # exposed, but no queries to divide by
    assert m.preemptions == 0.0  # exposed and zero: zero, not absent
    assert m.occupancy_mean_running == 4.0 and m.max_running == 4.0
    assert m.mean_waiting == pytest.approx(2 / 3)
    assert m.kv_usage_mean == pytest.approx(0.25) and m.kv_usage_max == 0.5  # gpu_cache_usage_perc
    assert m.server_tpot_ms == pytest.approx(30.0)
    assert m.tpot_rel_diff is None and m.tpot_disagrees is None  # no client summary
    assert m.tpot_client_low is None and m.server_interactivity_tok_s_user == pytest.approx(1000 / 30.0)
    assert m.interactivity_tok_s_user is None and m.total_tok_s_per_gpu is None
    assert (m.counter_resets, m.scrapes_ok, m.scrapes_failed, m.window_s) == (0, 3, 0, 60.0)


def test_no_good_scrape_leaves_server_metrics_absent():
    records = [ScrapeRecord(t=1.0, scrape=0, error="refused"), ScrapeRecord(t=2.0, scrape=1, error="refused")]
    summary = parse_summary(FIXTURES / "summary_evalscope_1.9.json")
    m = derive_point_metrics(records, summary, gpus_per_server=8)
    assert m.scrapes_ok == 0 and m.scrapes_failed == 2 and m.window_s is None
    assert m.interactivity_tok_s_user == pytest.approx(1000 / 18.5)
    server_side = set(PointMetrics.model_fields) - {
        "interactivity_tok_s_user", "total_tok_s_per_gpu", "output_tok_s_per_gpu", "mean_ttft_ms",
        "mean_tpot_ms", "counter_resets", "scrapes_ok", "scrapes_failed"}
    assert all(getattr(m, name) is None for name in server_side)
    assert derive_point_metrics([], None, gpus_per_server=8) == PointMetrics()


def test_one_scrape_gives_gauges_but_no_deltas(dp2_reset):
    m = derive_point_metrics(dp2_reset, None, gpus_per_server=8, window=(1030.0, 1030.0))
    assert m.scrapes_ok == 1 and m.window_s == 0.0
    assert m.max_running == 16.0 and m.preemptions is None and m.mtp_acceptance_length is None
    assert m.offload_load_bytes_per_s is None


def test_occupancy_is_unknown_when_no_scrape_saw_a_request_running():
    # a short point, or a gauge refreshed late: nothing running was seen, which is not "0 running"
    records = [ScrapeRecord(t=float(t), scrape=t, name="vllm:num_requests_running", value=0.0)
               for t in range(3)]
    m = derive_point_metrics(records, None, gpus_per_server=8)
    assert m.occupancy_mean_running is None and m.max_running == 0.0


def test_idle_first_and_last_scrapes_do_not_dilute_occupancy():
    values = [0.0, 2.0, 4.0, 0.0]
    records = [ScrapeRecord(t=float(t), scrape=t, name="vllm:num_requests_running", value=v)
               for t, v in enumerate(values)]
    assert derive_point_metrics(records, None, gpus_per_server=8).occupancy_mean_running == 3.0


def test_gpus_per_server_must_be_positive():
    with pytest.raises(ValueError):
        derive_point_metrics([], None, gpus_per_server=0)


def test_two_attempts_in_one_file_keep_their_scrapes_apart():
    # a retried point appends a second scraper's records (indices restart at 0)
    def rec(t, i, v):
        return ScrapeRecord(t=t, scrape=i, name="vllm:num_preemptions_total", value=v)
    records = [rec(0.0, 0, 0.0), rec(10.0, 1, 2.0), rec(100.0, 0, 5.0), rec(110.0, 1, 9.0)]
    assert derive_point_metrics(records, None, gpus_per_server=1).scrapes_ok == 4
    assert derive_point_metrics(records, None, gpus_per_server=1, window=(100.0, 110.0)).preemptions == 4.0


@given(st.lists(st.tuples(st.integers(0, 10**6), st.booleans()), min_size=1, max_size=30),
       st.integers(0, 10**6))
def test_counter_delta_sums_increases_across_resets(steps, start):
    """A counter that restarts below its last value is counted from zero, never subtracted."""
    values, expected, resets, current = [float(start)], 0.0, 0, float(start)
    for increase, restart in steps:
        if restart and increase < current:  # a restart is only visible when the value drops
            current = float(increase)
            resets += 1
        else:
            current += increase
        expected += increase
        values.append(current)
    snapshots = [Snapshot(t=float(i), series={"c_total": {(("engine", "0"),): v}})
                 for i, v in enumerate(values)]
    delta = counter_delta(snapshots, "c_total")
    assert delta is not None
    assert delta.delta == expected and len(delta.reset_steps) == resets


def _scrapes(series: dict[str, list[float]]) -> list[ScrapeRecord]:
    """One engine's samples, a scrape a second: series[name][i] at scrape i."""
    return [ScrapeRecord(t=float(i), scrape=i, name=name, value=values[i])
            for name, values in series.items() for i in range(len(values))]


def test_the_decode_batch_comes_from_counters_when_every_gauge_sample_saw_an_idle_server():
    # a busy frontend answered each scrape between bursts: the gauge reads 0 throughout, the engine
    # meanwhile took 600 steps generating 1,200 tokens
    records = _scrapes({"vllm:num_requests_running": [0.0] * 4,
                        "vllm:generation_tokens_total": [100.0, 500.0, 900.0, 1300.0],
                        "vllm:iteration_tokens_total_count": [50.0, 250.0, 450.0, 650.0]})
    m = derive_point_metrics(records, None, gpus_per_server=1)
    assert m.occupancy_mean_running is None and m.max_running == 0.0
    assert m.decode_batch_mean == pytest.approx(2.0)
    # speculating: each request-step yields the acceptance length, 1 + 300 / 150 = 3 tokens
    spec = _scrapes({"vllm:generation_tokens_total": [0.0, 1800.0], "vllm:iteration_tokens_total_count": [0.0, 300.0],
                     "vllm:spec_decode_num_accepted_tokens_total": [0.0, 300.0],
                     "vllm:spec_decode_num_drafts_total": [0.0, 150.0]})
    assert derive_point_metrics(spec, None, gpus_per_server=1).decode_batch_mean == pytest.approx(2.0)
    # drafts counted but none this point: the tokens per request-step are unknown, so is the batch
    idle_spec = _scrapes({"vllm:generation_tokens_total": [0.0, 10.0], "vllm:iteration_tokens_total_count": [0.0, 10.0],
                          "vllm:spec_decode_num_drafts_total": [5.0, 5.0]})
    assert derive_point_metrics(idle_spec, None, gpus_per_server=1).decode_batch_mean is None
    # no step histogram (an older server): unknown, not 0
    assert derive_point_metrics(_scrapes({"vllm:generation_tokens_total": [0.0, 10.0]}), None, 1).decode_batch_mean is None
