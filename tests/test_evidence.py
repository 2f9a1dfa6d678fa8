"""HiSparse evidence: start lines, metric families under either naming, the refusal, the calculator beside
the logged concurrency.

The two exposition fixtures hold the same three scrapes (values chosen by hand) in the two namings vLLM
commits use (docs/facts.md §2): hisparse_v033_*.prom as the 0.33.0 wheel declares them (counters with
`_total`, `..._host_cache_usage_perc`, `..._pending_page_transfers`), hisparse_blocks_*.prom as the other
commit (no `_total`, `..._host_blocks_used` / `..._host_blocks_total`, `..._pending_spills`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config import LaunchProfile, load_launch
from harness.evidence import (
    INACTIVE,
    START_CONCURRENCY,
    START_ENABLED,
    START_POOLS,
    assess,
    concurrency_mismatch,
    lines_since_last_start,
    parse_start_lines,
    predicted_concurrency,
)
from harness.metrics.derive import derive_point_metrics
from harness.metrics.prom import parse_exposition
from harness.metrics.scrape import ScrapeRecord
from harness.records import HiSparseEvidence
from harness.sim.capacity import hisparse_start_lines
from harness.sim.engine_config import engine_config

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
REPO = Path(__file__).resolve().parents[1]



def hisparse_families(metrics_text: str) -> list[str]:
    """The `vllm:hisparse_` families one /metrics answer exposes (sorted); [] for unreadable text."""
    from harness.evidence import HISPARSE_PREFIX, families_of
    from harness.metrics.prom import PromParseError, parse_exposition
    try:
        samples = parse_exposition(metrics_text, keep_prefixes=[HISPARSE_PREFIX])
    except PromParseError:
        return []
    return families_of(samples)

def _scrapes(stem: str) -> list[ScrapeRecord]:
    records = []
    for i in range(3):
        text = (FIXTURES / f"{stem}_{i}.prom").read_text()
        records += [ScrapeRecord(t=1000.0 + 30 * i, scrape=i, name=s.name, labels=s.labels, value=s.value)
                    for s in parse_exposition(text, ["vllm:"])]
    return records


def test_two_namings_of_the_hisparse_families_give_the_same_point_metrics():
    v033 = derive_point_metrics(_scrapes("hisparse_v033"), None, gpus_per_server=8)
    blocks = derive_point_metrics(_scrapes("hisparse_blocks"), None, gpus_per_server=8)
    fields = ("hisparse_hit_rate", "hisparse_misses", "hisparse_h2d_bytes", "hisparse_h2d_bytes_per_s",
              "hisparse_host_usage_max")
    assert {f: getattr(blocks, f) for f in fields} == pytest.approx({f: getattr(v033, f) for f in fields})
    # by hand: hits 1.2e6 -> 5.2e6, misses 40,000 -> 240,000, bytes 131,070,000 -> 786,432,000 over 60 s
    assert v033.hisparse_hit_rate == pytest.approx(4.0e6 / 4.2e6)
    assert v033.hisparse_misses == 200_000 and v033.hisparse_h2d_bytes == 786_432_000 - 131_070_000
    assert v033.hisparse_h2d_bytes_per_s == pytest.approx((786_432_000 - 131_070_000) / 60)
    # 0.4 in the 0.33 gauge; 50,364 / 125,910 blocks in the other build
    assert v033.hisparse_host_usage_max == pytest.approx(0.4)


def test_families_are_found_by_prefix_under_either_naming():
    assert hisparse_families((FIXTURES / "hisparse_v033_0.prom").read_text()) == [
        "vllm:hisparse_cache_hits", "vllm:hisparse_cache_misses", "vllm:hisparse_host_cache_usage_perc",
        "vllm:hisparse_host_to_device_bytes", "vllm:hisparse_pending_page_transfers"]
    assert "vllm:hisparse_host_blocks_total" in hisparse_families((FIXTURES / "hisparse_blocks_0.prom").read_text())
    assert hisparse_families("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1.0\n") == []
    assert hisparse_families("not prometheus {{{") == []


RELEASE_LINES = [
    "INFO 09-15 10:00:01 [hisparse.py:88] " + START_ENABLED % (2048, 10240, 8192, 256),
    "(Worker_TP0 pid=17) INFO 09-15 10:00:02 [hisparse.py:120] " + START_POOLS % (384.0, 125910, 12.5, 60000),
    "(Worker_TP1 pid=18) INFO 09-15 10:00:02 [hisparse.py:120] " + START_POOLS % (384.0, 125910, 12.5, 60000),
    "INFO 09-15 10:00:03 [hisparse.py:140] " + START_CONCURRENCY % ("142000", 18.0),
]


def test_start_lines_of_a_release_and_of_the_blog_branch():
    ev = parse_start_lines(RELEASE_LINES)
    assert (ev.top_k, ev.device_buffer_size, ev.lru_rows, ev.max_num_seqs) == (2048, 10240, 8192, 256)
    assert (ev.host_source_gib, ev.host_source_blocks, ev.gpu_pool_gib, ev.gpu_pool_blocks) == (384.0, 125910,
                                                                                                 12.5, 60000)
    assert (ev.logged_concurrency_tokens, ev.logged_max_concurrency) == (142000, 18.0)
    assert len(ev.start_lines) == 3  # the TP workers' repeat is not kept
    blog = parse_start_lines(["Enabled experimental HiSparse HMA hot cache: host_pool_gib=384, top_k=2048, "
                              "device_buffer_size=4096 (2048 LRU rows), max_num_seqs=256.",
                              "HiSparse steady-state maximum concurrency for 142,000 tokens per request: 29.00x "
                              "(running requests reading from host)."])
    assert blog.host_pool_gib == 384 and blog.top_k == 2048 and blog.logged_concurrency_tokens == 142000
    assert parse_start_lines(["INFO nothing about it", "KV cache: 1000 blocks"]).start_lines == []


def test_neither_witness_refuses_a_hisparse_arm_and_either_one_suffices():
    nothing = HiSparseEvidence()
    refused = assess(True, nothing, [], None)
    assert refused.hisparse_active is False and refused.problem.startswith(INACTIVE)
    assert assess(True, nothing, ["vllm:hisparse_cache_hits"], None).problem is None
    assert assess(True, parse_start_lines(RELEASE_LINES), [], None).hisparse_active is True
    assert assess(False, nothing, [], None).problem is None  # not asked for: nothing to prove


def test_the_logged_concurrency_stands_beside_the_calculator():
    blog_arm = load_launch(REPO / "launch/glm53-hisparse.yaml").profile
    predicted = predicted_concurrency(blog_arm, 142000)
    assert predicted == 16  # vllm layout, 384 GiB pool, MTP3's 10,240 hot rows (docs/facts.md §4)
    ev = assess(True, parse_start_lines(RELEASE_LINES), [], predicted)
    assert "logged a HiSparse steady-state maximum concurrency of 18" in concurrency_mismatch(ev)
    close = ev.model_copy(update={"logged_max_concurrency": 17.0})
    assert concurrency_mismatch(close) is None  # within one request


def test_the_simulated_engine_logs_what_the_calculator_predicts_and_nothing_when_it_ignores_hisparse():
    profile = load_launch(REPO / "launch/sim-hisparse.yaml").profile
    ev = parse_start_lines(hisparse_start_lines(engine_config(profile)))
    assert ev.logged_concurrency_tokens == profile.serve.max_model_len
    assert ev.logged_max_concurrency == predicted_concurrency(profile, ev.logged_concurrency_tokens)
    off = LaunchProfile.model_validate({**profile.model_dump(), "sim": {
        **profile.sim.model_dump(), "faults": {"ignore_hisparse": True}}})
    assert hisparse_start_lines(engine_config(off)) == []
    assert predicted_concurrency(off, 8192) is None


def test_only_the_log_of_the_last_start_is_read(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("===== harness: start a at t1 on h:1: x =====\n" + RELEASE_LINES[-1] + "\n"
                   "===== harness: start a at t2 on h:1: x =====\nINFO restarted without it\n")
    assert lines_since_last_start(log) == ["INFO restarted without it"]
    assert lines_since_last_start(tmp_path / "missing.log") == []
