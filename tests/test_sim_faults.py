"""Each fault the simulated server injects (sim.faults), seen from a client over real HTTP."""

from __future__ import annotations

import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from sim_support import chat_body, profile, read_sse, sim_server


def test_exit_after_requests_kills_the_process(tmp_path):
    launch = profile(sim={"faults": {"exit_after_requests": 2}})
    with sim_server(tmp_path, launch) as server:
        url = server.url + "/v1/chat/completions"
        assert requests.post(url, json=chat_body("one", 4, ignore_eos=True), timeout=30).status_code == 200
        with pytest.raises(requests.ConnectionError):
            requests.post(url, json=chat_body("two", 4, ignore_eos=True), timeout=30)
        assert server.proc.wait(timeout=30) == 3
        assert "exiting after 2 requests" in server.log()


def test_ready_delay_then_healthy(tmp_path):
    with sim_server(tmp_path, profile(sim={"faults": {"ready_delay_s": 1.5}}), wait_healthy=False) as server:
        server.wait_listening()
        assert requests.get(server.url + "/health", timeout=5).status_code == 503
        assert requests.get(server.url + "/v1/models", timeout=5).status_code == 503
        server.wait_healthy(timeout_s=30)
        assert requests.get(server.url + "/v1/models", timeout=5).status_code == 200


def test_never_ready(tmp_path):
    with sim_server(tmp_path, profile(sim={"faults": {"never_ready": True}}), wait_healthy=False) as server:
        server.wait_listening()
        for _ in range(3):
            assert requests.get(server.url + "/health", timeout=5).status_code == 503
            time.sleep(0.2)
        assert server.proc.poll() is None


@pytest.mark.slow  # two served runs of the faulty simulated engine (6 s)
def test_error_fraction_is_seeded(tmp_path):
    def statuses(name):
        with sim_server(tmp_path, profile(sim={"faults": {"error_fraction": 0.5}, "seed": 7}), name) as server:
            url = server.url + "/v1/chat/completions"
            return [requests.post(url, json=chat_body("x", 2, ignore_eos=True), timeout=30).status_code
                    for _ in range(12)]

    first = statuses("a")
    assert set(first) == {200, 500}
    assert statuses("b") == first  # same seed, same requests: same faults


def test_error_fraction_one_answers_500(tmp_path):
    with sim_server(tmp_path, profile(sim={"faults": {"error_fraction": 1.0}})) as server:
        r = requests.post(server.url + "/v1/chat/completions", json=chat_body("x", 2), timeout=30)
        assert r.status_code == 500 and "injected fault" in r.json()["error"]["message"]


def test_stall_after_tokens(tmp_path):
    launch = profile(speculative=None, sim={"faults": {"stall_after_tokens": 3, "stall_s": 60}})
    with sim_server(tmp_path, launch) as server:
        body = chat_body("x", 10, stream=True, ignore_eos=True)
        received = []
        with pytest.raises(requests.exceptions.ConnectionError):  # read timeout while stalled
            with requests.post(server.url + "/v1/chat/completions", json=body, stream=True,
                               timeout=(5, 2)) as r:
                for line in r.iter_lines(decode_unicode=True):
                    if line.startswith("data: "):
                        received.append(line)
        assert 1 < len(received) <= 1 + 3  # the role chunk and the tokens before the stall
        # a stalled stream does not stop the server
        assert requests.get(server.url + "/health", timeout=5).status_code == 200
        other = chat_body("y", 2, stream=True, ignore_eos=True)
        with requests.post(server.url + "/v1/chat/completions", json=other, stream=True, timeout=10) as r:
            assert read_sse(r)[-1] == "[DONE]"


def test_malformed_metrics(tmp_path):
    with sim_server(tmp_path, profile(sim={"faults": {"malformed_metrics": True}})) as server:
        r = requests.get(server.url + "/metrics", timeout=5)
        assert r.status_code == 200
        with pytest.raises(ValueError):
            list(text_string_to_metric_families(r.text))
