"""The simulated engine's HTTP server over real HTTP: the OpenAI stream as vLLM sends it, usage,
max_tokens / ignore_eos, /v1/models, /health and /metrics with vLLM's names per arm."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from sim_support import REPO, chat_body, profile, read_sse, sim_server

from harness.dataset.tokenizer import default_tokenizer_path, load_tokenizer

HISPARSE_KV = {"hisparse": {"host_pool_gib": 384},
               "offload": {"spec": "TieringOffloadingSpec", "cpu_bytes": "128GiB"}}
OFFLOAD_KV = {"offload": {"spec": "TieringOffloadingSpec", "cpu_bytes": "512GiB"}}
PROMPT = "Fix the failing test in parser.py; the traceback says KeyError: 'name'. " * 20


@pytest.fixture(scope="module")
def hisparse_server(tmp_path_factory):
    with sim_server(tmp_path_factory.mktemp("hisparse"), profile(kv=HISPARSE_KV)) as server:
        yield server


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_stream_is_vllm_shaped_with_usage_last(hisparse_server):
    body = chat_body(PROMPT, 40, stream=True, stream_options={"include_usage": True}, ignore_eos=True)
    with requests.post(hisparse_server.url + "/v1/chat/completions", json=body, stream=True, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = read_sse(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "glm-agentx" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    content_chunks = chunks[1:-1]
    assert content_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in content_chunks[:-1])
    assert usage["completion_tokens"] == 40
    assert usage["total_tokens"] == usage["prompt_tokens"] + 40
    # MTP3: several tokens per chunk, so fewer content chunks than tokens
    assert len(content_chunks) < 40
    tokenizer = load_tokenizer(default_tokenizer_path())
    assert usage["prompt_tokens"] == tokenizer.count_chat(body["messages"])


def test_stream_without_include_usage_has_no_usage_chunk(hisparse_server):
    body = chat_body("hello", 5, stream=True, ignore_eos=True)
    with requests.post(hisparse_server.url + "/v1/chat/completions", json=body, stream=True, timeout=30) as r:
        events = read_sse(r)
    assert events[-1] == "[DONE]"
    assert all("usage" not in c and c["choices"] for c in events[:-1])


def test_non_streamed_and_eos_draws_a_length_up_to_max_tokens(hisparse_server):
    url = hisparse_server.url + "/v1/chat/completions"
    fixed = requests.post(url, json=chat_body(PROMPT, 25, ignore_eos=True), timeout=30).json()
    assert fixed["object"] == "chat.completion"
    assert fixed["usage"]["completion_tokens"] == 25
    assert fixed["choices"][0]["finish_reason"] == "length"
    assert fixed["choices"][0]["message"]["role"] == "assistant" and fixed["choices"][0]["message"]["content"]
    drawn = [requests.post(url, json=chat_body(PROMPT, 25), timeout=30).json() for _ in range(6)]
    lengths = [d["usage"]["completion_tokens"] for d in drawn]
    assert all(1 <= n <= 25 for n in lengths)
    assert any(n < 25 for n in lengths)
    assert {d["choices"][0]["finish_reason"] for d in drawn if d["usage"]["completion_tokens"] < 25} == {"stop"}


def test_bad_requests_get_openai_errors(hisparse_server):
    url = hisparse_server.url + "/v1/chat/completions"
    too_long = requests.post(url, json=chat_body("hi", 9000), timeout=30)
    assert too_long.status_code == 400 and "maximum context length" in too_long.json()["error"]["message"]
    assert requests.post(url, json={**chat_body("hi", 5), "model": "other"}, timeout=30).status_code == 404
    assert requests.post(url, data=b"{not json", timeout=30).status_code == 400
    assert requests.post(url, json={"messages": []}, timeout=30).status_code == 400


def test_models_and_health(hisparse_server):
    assert requests.get(hisparse_server.url + "/health", timeout=5).status_code == 200
    models = requests.get(hisparse_server.url + "/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == ["glm-agentx"]
    assert models["data"][0]["max_model_len"] == 8192


def test_metrics_hisparse_arm_has_vllm_names_and_moves(hisparse_server):
    url = hisparse_server.url
    before = families(requests.get(url + "/metrics", timeout=5).text)
    requests.post(url + "/v1/chat/completions", json=chat_body(PROMPT, 30, ignore_eos=True), timeout=30)
    after = families(requests.get(url + "/metrics", timeout=5).text)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens",
                 "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:request_success",
                 "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens", "vllm:time_to_first_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:request_time_per_output_token_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                 "vllm:hisparse_cache_hits", "vllm:hisparse_cache_misses", "vllm:hisparse_host_to_device_bytes",
                 "vllm:hisparse_host_cache_usage_perc", "vllm:kv_offload_load_bytes",
                 "vllm:kv_offload_store_bytes", "vllm:kv_offload_cpu_cache_usage_perc",
                 "vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits"):
        assert name in after, name

    def value(fams, name, suffix="_total"):
        return sum(s.value for s in fams[name].samples if s.name == name + suffix)

    assert value(after, "vllm:generation_tokens") - value(before, "vllm:generation_tokens") == 30
    assert value(after, "vllm:request_success") - value(before, "vllm:request_success") == 1
    assert value(after, "vllm:e2e_request_latency_seconds", "_count") == value(after, "vllm:request_success")
    sample = after["vllm:num_requests_running"].samples[0]
    assert sample.labels["model_name"] == "glm-agentx"
    usage = after["vllm:kv_cache_usage_perc"].samples[0].value
    assert 0.0 <= usage <= 1.0
    text = requests.get(url + "/metrics", timeout=5).text
    assert "vllm:num_preemptions_total{" in text and "vllm:time_to_first_token_seconds_bucket{" in text


def test_metrics_series_follow_the_arm(tmp_path):
    with sim_server(tmp_path, profile(kv=OFFLOAD_KV), "offload") as offload:
        names = families(requests.get(offload.url + "/metrics", timeout=5).text)
    assert "vllm:kv_offload_load_bytes" in names and "vllm:spec_decode_num_drafts" in names
    assert not any(n.startswith("vllm:hisparse") for n in names)
    with sim_server(tmp_path, profile(speculative=None), "plain") as plain:
        names = families(requests.get(plain.url + "/metrics", timeout=5).text)
        stream = chat_body("hello", 12, stream=True, ignore_eos=True)
        with requests.post(plain.url + "/v1/chat/completions", json=stream, stream=True, timeout=30) as r:
            chunks = read_sse(r)[:-1]
    assert not any(n.startswith(("vllm:hisparse", "vllm:kv_offload", "vllm:spec_decode",
                                 "vllm:external_prefix")) for n in names)
    assert "vllm:num_requests_running" in names
    # without MTP every content chunk carries one token
    assert len(chunks) == 1 + 12


def test_bad_profile_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: sim\nserve: {model: x, max_num_seqs: -1}\n")
    proc = subprocess.run([sys.executable, "-m", "harness", "serve-sim", "--launch", str(bad), "--port", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("harness serve-sim: error:")]
    assert len(errors) == 1 and "max_num_seqs" in errors[0]
    assert "Traceback" not in proc.stderr
