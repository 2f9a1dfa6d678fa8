"""Latency percentiles and goodput per point (harness/metrics/derive.py): the functions on hand-made rows, and a
point in virtual time that misses its SLO, checked against the simulated requests themselves. No servers.
The same columns from a real EvalScope run, checked against its benchmark_data.db: test_percentiles_evalscope.py."""

from __future__ import annotations

import re

import numpy as np
import pytest
import yaml
from sim_support import REPO

from harness.catalogue import CATALOGUE
from harness.config import DatasetRecipe, load_launch, load_sweep
from harness.config.sweep import SloSettings
from harness.metrics.derive import (
    PERCENTILES,
    derive_point_metrics,
    goodput,
    latency_percentiles,
    percentile,
    request_meets_slo,
    slo_checks,
    slo_met,
)
from harness.metrics.evalscope_requests import RequestRow
from harness.records import EvalScopeSummary, PointMetrics
from harness.report.markdown import render_report
from harness.results import iter_points
from harness.sim.engine import Engine
from harness.sim.engine_config import engine_config
from harness.sim.virtual import run_point, shapes_from_recipe
from harness.simulate import SimulateOptions, evalscope_like_summary, request_rows, simulate_sweep
from harness.summary import summary_frame


def row(ttft_s: float, latency_s: float, tokens: int = 11, gaps: tuple[float, ...] = (), prompt: int = 100,
        success: bool = True) -> RequestRow:
    return RequestRow(latency_s=latency_s, first_chunk_s=ttft_s, prompt_tokens=prompt, completion_tokens=tokens,
                      success=success, chunk_gaps_s=gaps)


# ---- the percentile ------------------------------------------------------------------------------------

def test_percentile_is_numpys_linear_interpolation():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)  # position (4 - 1) x 0.9 = 2.7
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    rng = np.random.default_rng(3)
    for n in (2, 5, 17, 200):
        values = list(rng.lognormal(size=n))
        for q in PERCENTILES:
            assert percentile(values, q) == float(np.percentile(values, q))


def test_percentiles_are_over_the_succeeded_requests():
    rows = [row(0.1, 1.1, gaps=(0.10, 0.10)), row(0.2, 2.2, gaps=(0.30,)), row(0.3, 3.3, gaps=(0.20, 0.40)),
            row(0.4, 0.5, tokens=1),  # one token: a TTFT and a latency, no TPOT
            row(9.0, 99.0, gaps=(9.0,), success=False),  # failed: in nothing
            RequestRow(latency_s=None, first_chunk_s=None, prompt_tokens=5, completion_tokens=0, success=True,
                       chunk_gaps_s=())]  # no timings: not a success the percentiles can use
    got = latency_percentiles(rows)
    ttft, e2e = [100.0, 200.0, 300.0, 400.0], [1.1, 2.2, 3.3, 0.5]
    tpot = [1000 * 1.0 / 10, 1000 * 2.0 / 10, 1000 * 3.0 / 10]  # (latency - TTFT) / (11 - 1)
    itl = [100.0, 100.0, 300.0, 200.0, 400.0]  # every gap of every succeeded request, pooled
    for q in PERCENTILES:
        assert got[f"ttft_p{q}_ms"] == pytest.approx(np.percentile(ttft, q))
        assert got[f"tpot_p{q}_ms"] == pytest.approx(np.percentile(tpot, q))
        assert got[f"itl_p{q}_ms"] == pytest.approx(np.percentile(itl, q))
        assert got[f"e2e_p{q}_s"] == pytest.approx(np.percentile(e2e, q))
    assert all(v is None for v in latency_percentiles([row(1, 2, success=False)]).values())


def test_every_column_is_one_catalogue_entry():
    percentiles = {m.name for m in CATALOGUE if re.fullmatch(r"[a-z0-9]+_p\d+_(ms|s)", m.name)}
    assert set(latency_percentiles([])) == percentiles and len(percentiles) == 12
    assert {"goodput_req_s", "goodput_tok_s_per_gpu", "slo_met"} <= {m.name for m in CATALOGUE}
    assert percentiles | {"goodput_req_s", "goodput_tok_s_per_gpu", "slo_met"} <= set(PointMetrics.model_fields)


# ---- goodput and the SLO --------------------------------------------------------------------------------

def test_a_request_meets_the_slo_on_its_own_numbers():
    slo = SloSettings(ttft_p90_max_s=0.5, tpot_p90_max_ms=50, e2e_p90_max_s=2.0, interactivity_min_tok_s_user=25)
    fast = row(0.5, 0.9)  # TPOT (0.9 - 0.5) / 10 = 40 ms: 25 tok/s, every bound inclusive
    assert request_meets_slo(fast, slo)
    assert not request_meets_slo(row(0.51, 0.91), slo)  # TTFT over
    assert not request_meets_slo(row(0.1, 0.65), slo)  # TPOT 55 ms over
    assert not request_meets_slo(row(0.1, 2.1, tokens=101), slo)  # TPOT 20 ms, but the latency over
    assert not request_meets_slo(row(0.1, 0.9, success=False), slo)
    assert request_meets_slo(row(0.1, 0.15, tokens=1), slo)  # one token: no TPOT, no TPOT limit
    assert not request_meets_slo(row(0.1, 0.52), SloSettings(interactivity_min_tok_s_user=25.1))  # 40.2 ms


def test_goodput_counts_only_the_requests_that_met_every_limit():
    slo = SloSettings(ttft_p90_max_s=0.5, tpot_p90_max_ms=50)
    rows = [row(0.2, 0.6, prompt=100), row(0.3, 0.7, prompt=300),  # both meet: 100 + 11 and 300 + 11 tokens
            row(0.8, 1.0, prompt=1000),  # TTFT over
            row(0.1, 1.1, prompt=1000),  # TPOT 100 ms
            row(0.1, 0.2, prompt=1000, success=False)]
    got = goodput(rows, slo, duration_s=4.0, gpus_per_server=2)
    assert got == {"goodput_req_s": 2 / 4.0, "goodput_tok_s_per_gpu": (111 + 311) / 4.0 / 2}
    assert goodput(rows, slo, duration_s=None, gpus_per_server=2) == {"goodput_req_s": None,
                                                                      "goodput_tok_s_per_gpu": None}
    assert goodput([], slo, duration_s=1.0, gpus_per_server=1)["goodput_req_s"] == 0.0


def test_a_point_that_misses_says_which_limit_with_its_value():
    slo = SloSettings(ttft_p90_max_s=2.0, tpot_p90_max_ms=50, interactivity_min_tok_s_user=20)
    checks = slo_checks(slo, {"ttft_p90_ms": 2310.0, "tpot_p90_ms": 48.0, "interactivity_tok_s_user": 25.0})
    assert [c.met for c in checks] == [False, True, True] and slo_met(checks) is False
    assert checks[0].text() == "p90 TTFT 2.31 s > 2 s (ttft_p90_max_s)"
    assert checks[1].text() == "p90 TPOT 48 ms <= 50 ms (tpot_p90_max_ms)"
    slow = slo_checks(slo, {"ttft_p90_ms": 100.0, "tpot_p90_ms": 48.0, "interactivity_tok_s_user": 19.5})
    assert slo_met(slow) is False and slow[2].text() == "interactivity 19.5 tok/s/user < 20 tok/s/user " \
                                                        "(interactivity_min_tok_s_user)"
    unknown = slo_checks(slo, {"ttft_p90_ms": 100.0, "interactivity_tok_s_user": 25.0})
    assert slo_met(unknown) is None and "p90 TPOT unknown" in unknown[1].text()
    assert slo_met(slo_checks(slo, {"ttft_p90_ms": 9999.0})) is False  # a miss outweighs the unknowns
    assert slo_met(slo_checks(slo, {"ttft_p90_ms": 2000.0, "tpot_p90_ms": 50.0,
                                    "interactivity_tok_s_user": 20.0})) is True


def test_derive_point_metrics_takes_rows_and_the_slo():
    rows = [row(0.1 * i, 0.1 * i + 1.0, gaps=(0.1,) * 10) for i in range(1, 11)]
    summary = EvalScopeSummary(mean_tpot_ms=100.0, time_taken_s=5.0, success_requests=10)
    plain = derive_point_metrics([], summary, gpus_per_server=8, rows=rows)
    assert plain.ttft_p90_ms == pytest.approx(910.0) and plain.e2e_p50_s == pytest.approx(1.55)
    assert plain.goodput_req_s is None and plain.slo_met is None  # no slo: empty, not 0
    slo = SloSettings(ttft_p90_max_s=0.5, interactivity_min_tok_s_user=10)
    m = derive_point_metrics([], summary, gpus_per_server=8, rows=rows, slo=slo)
    assert m.slo_met is False and m.goodput_req_s == 5 / 5.0  # TTFTs 0.1 .. 0.5 s
    assert m.goodput_tok_s_per_gpu == pytest.approx(5 * 111 / 5.0 / 8)
    met = derive_point_metrics([], summary, gpus_per_server=8, rows=rows, slo=SloSettings(ttft_p90_max_s=1.0))
    assert met.slo_met is True and met.goodput_req_s == 10 / 5.0
    # no per-request rows (no benchmark_data.db): the p90 is unknown, and so is the verdict
    assert derive_point_metrics([], summary, 8, slo=slo).slo_met is None
    assert derive_point_metrics([], summary, 8) == derive_point_metrics([], summary, 8, rows=None)


# ---- virtual time: the same functions over the simulated requests ---------------------------------------

def _virtual_point():
    recipe = DatasetRecipe.model_construct(name="t", first_turn_length=3000, subsequent_turn_length=200, num_turns=4,
                                           conversations=64, assumed_output_length=32)
    engine = Engine(engine_config(load_launch(REPO / "launch/sim-hisparse.yaml").profile))
    return run_point(engine, shapes_from_recipe(recipe, 16), concurrency=8, conversations=16, max_tokens=32,
                     start_s=0.0)


def test_a_virtual_point_that_misses_its_slo_counts_only_the_requests_that_met_it():
    run = _virtual_point()
    ok = [r for r in run.requests if r.ok]
    ttft = [r.first_token_s - r.start_s for r in ok]  # the simulated requests themselves, not the rows
    p50, p90 = np.percentile(ttft, 50), np.percentile(ttft, 90)
    assert p90 > p50
    limit = (p50 + p90) / 2
    slo = SloSettings(ttft_p90_max_s=float(limit))
    m = derive_point_metrics([], evalscope_like_summary(run), gpus_per_server=8, rows=request_rows(run), slo=slo)
    assert m.ttft_p90_ms == pytest.approx(1000 * p90) and m.slo_met is False
    good = [r for r in ok if r.first_token_s - r.start_s <= limit]
    assert 0 < len(good) < len(ok)
    assert m.goodput_req_s == pytest.approx(len(good) / run.duration_s)
    assert m.goodput_tok_s_per_gpu == pytest.approx(sum(r.prompt_tokens + r.output_tokens for r in good)
                                                    / run.duration_s / 8)
    tpot = [1000 * (r.end_s - r.first_token_s) / (r.output_tokens - 1) for r in ok]
    assert m.tpot_p99_ms == pytest.approx(np.percentile(tpot, 99))
    assert m.e2e_p50_s == pytest.approx(np.percentile([r.end_s - r.start_s for r in ok], 50))
    # the engine keeps no time per chunk: a request's gaps are its decode span split evenly over its chunks
    gaps = [(r.end_s - r.first_token_s) / (r.chunks - 1) for r in ok for _ in range(r.chunks - 1)]
    assert m.itl_p90_ms == pytest.approx(1000 * np.percentile(gaps, 90))


def _simulate(tmp_path, folder: str, slo: dict | None):
    recipe = {"name": "pct", "tokenizer": str(REPO / "harness/data/tokenizers/harness-bpe"),
              "source": {"kind": "sample", "path": str(REPO / "harness/data/samples/openhands-sample.jsonl")},
              "pad": {"kind": "synthetic"}, "first_turn_length": 3000, "subsequent_turn_length": 200,
              "num_turns": 4, "conversations": 64, "assumed_output_length": 32}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    sweep = {"name": "pct", "dataset": "recipe.yaml", "gpus_per_server": 8,
             "client": {"model": "glm-agentx", "max_tokens": 32, "extra_args": {"ignore_eos": True},
                        "points": [{"concurrency": 1, "conversations": 2}, {"concurrency": 8, "conversations": 16}]},
             "scrape": {"interval_s": 0.2},
             "deployments": [{"name": "hs", "launch": str(REPO / "launch/sim-hisparse.yaml")}],
             **({"slo": slo} if slo else {})}
    (tmp_path / f"{folder}.yaml").write_text(yaml.safe_dump(sweep))
    # one run id for both runs (it seeds the engine), each in a results folder of its own
    outcome = simulate_sweep(load_sweep(tmp_path / f"{folder}.yaml"),
                             SimulateOptions(run_id="pct", results_root=tmp_path / folder),
                             progress=lambda _m: None)
    return outcome.run_dir, {p.concurrency: p for p in iter_points(outcome.run_dir)}


def test_simulate_records_the_slo_and_the_report_names_the_missed_limit(tmp_path):
    run_dir, points = _simulate(tmp_path, "free", None)
    assert all(p.metrics.ttft_p90_ms is not None and p.metrics.slo_met is None for p in points.values())
    c1, c8 = points[1].metrics.ttft_p90_ms, points[8].metrics.ttft_p90_ms
    assert c8 > 2 * c1
    limit_s = round(((c1 * c8) ** 0.5) / 1000, 4)  # between the two p90s; the same run id simulates the same
    run_dir, points = _simulate(tmp_path, "with-slo", {"ttft_p90_max_s": limit_s})
    assert points[1].metrics.slo_met is True and points[8].metrics.slo_met is False
    assert points[8].metrics.goodput_req_s < points[8].summary.request_throughput_req_s
    frame = summary_frame(run_dir).set_index("concurrency")
    assert bool(frame.loc[1, "slo_met"]) and not bool(frame.loc[8, "slo_met"])
    assert frame.loc[8, "ttft_p90_ms"] == points[8].metrics.ttft_p90_ms

    text = render_report(run_dir, tmp_path / "no-plots")
    latency = text.split("## Latency", 1)[1].split("## SLO", 1)[0]
    assert "| deployment | c | TTFT p50 / p90 / p99 (ms) | TPOT p50 / p90 / p99 (ms) |" in latency
    assert latency.count("| hs |") == 2
    slo = text.split("## SLO", 1)[1].split("## Figures", 1)[0]
    assert f"p90 TTFT <= {limit_s:g} s (`ttft_p90_max_s`)" in slo
    c8_row = next(line for line in slo.splitlines() if line.startswith("| hs | 8 |"))
    assert "| **missed** |" in c8_row
    assert f"p90 TTFT {c8 / 1000:.4g} s > {limit_s:g} s (ttft_p90_max_s)" in c8_row
    assert "| met |" in next(line for line in slo.splitlines() if line.startswith("| hs | 1 |"))
