"""Latency percentiles and goodput from a real EvalScope run: `harness sweep` of one simulated arm at two small
points, then every number recomputed here from EvalScope's own files (benchmark_data.db read with sqlite3,
percentiles with numpy, the duration from benchmark_summary.json), none of it through the harness's reader."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from sweep_support import run_sweep, write_sweep

from harness.records import PointRecord
from harness.report.markdown import render_report
from harness.results import iter_points

pytestmark = pytest.mark.slow

# c1 sends one request at a time (TTFT about 40 ms on the simulated engine); c2 starts two conversations at
# once, whose first turns prefill together and wait for each other, so c2's p90 TTFT is well above c1's.
# Whatever the machine's speed, the checks below compare the harness with EvalScope's rows, not with numbers.
SLO = {"ttft_p90_max_s": 0.055, "tpot_p90_max_ms": 1000.0, "e2e_p90_max_s": 60.0}


def _raw(record: PointRecord, run_dir: Path) -> tuple[list[tuple], float]:
    """The point's success rows as EvalScope wrote them, and its duration from its own summary file."""
    attempt = run_dir / "points" / record.deployment / record.point_id / "evalscope" / f"attempt-{record.attempt}"
    (db,) = attempt.rglob("benchmark_data.db")
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT first_chunk_latency, time_per_output_token, completion_tokens, latency, "
                            "prompt_tokens, inter_token_latencies FROM result WHERE success = 1").fetchall()
    summary = json.loads((db.parent / "benchmark_summary.json").read_text())
    duration = next(summary[k] for k in ("Test Duration (s)", "Time taken for tests (s)") if k in summary)
    return rows, float(duration)


def _meets(ttft: float, tpot: float, tokens: int, latency: float) -> bool:
    return (ttft <= SLO["ttft_p90_max_s"] and latency <= SLO["e2e_p90_max_s"]
            and (tokens < 2 or 1000 * tpot <= SLO["tpot_p90_max_ms"]))


def test_percentiles_and_goodput_equal_evalscopes_own_rows(tmp_path):
    sweep = write_sweep(tmp_path, {"hs": ""}, [(1, 2), (2, 4)])
    sweep.write_text(sweep.read_text() + "slo: " + json.dumps(SLO) + "\n")
    done = run_sweep(sweep, "pct")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "results" / "pct"
    points = {p.concurrency: p for p in iter_points(run_dir)}
    assert sorted(points) == [1, 2]
    verdicts = {}
    for c, record in points.items():
        m = record.metrics
        rows, duration = _raw(record, run_dir)
        assert len(rows) == record.conversations * 2 == record.summary.success_requests  # two turns each
        ttft_ms = [1000 * r[0] for r in rows]
        tpot_ms = [1000 * r[1] for r in rows if r[2] >= 2]  # EvalScope's own time_per_output_token
        itl_ms = [1000 * gap for r in rows for gap in json.loads(r[5] or "[]")]
        e2e_s = [r[3] for r in rows]
        for q in (50, 90, 99):
            assert getattr(m, f"ttft_p{q}_ms") == pytest.approx(np.percentile(ttft_ms, q), rel=1e-12, abs=1e-12)
            assert getattr(m, f"tpot_p{q}_ms") == pytest.approx(np.percentile(tpot_ms, q), rel=1e-12, abs=1e-12)
            assert getattr(m, f"itl_p{q}_ms") == pytest.approx(np.percentile(itl_ms, q), rel=1e-12, abs=1e-12)
            assert getattr(m, f"e2e_p{q}_s") == pytest.approx(np.percentile(e2e_s, q), rel=1e-12, abs=1e-12)

        good = [r for r in rows if _meets(r[0], r[1], r[2], r[3])]
        assert m.goodput_req_s == pytest.approx(len(good) / duration, rel=1e-12)
        assert m.goodput_tok_s_per_gpu == pytest.approx(sum(r[4] + r[2] for r in good) / duration / 8, rel=1e-12)
        met = (np.percentile(ttft_ms, 90) <= 1000 * SLO["ttft_p90_max_s"]
               and np.percentile(tpot_ms, 90) <= SLO["tpot_p90_max_ms"]
               and np.percentile(e2e_s, 90) <= SLO["e2e_p90_max_s"])
        assert m.slo_met is bool(met), (c, m.ttft_p90_ms)
        verdicts[c] = (bool(met), m.ttft_p90_ms / 1000)  # equal to the raw p90, as checked above
    assert not all(met for met, _ in verdicts.values()), verdicts  # c2's p90 TTFT is over the limit

    report = render_report(run_dir, tmp_path / "no-plots")
    section = report.split("## SLO", 1)[1].split("## Figures", 1)[0]
    for c, (met, ttft_p90_s) in verdicts.items():
        line = next(line for line in section.splitlines() if line.startswith(f"| hs | {c} |"))
        if met:
            assert "| met |" in line, line
        else:
            assert "| **missed** |" in line and f"p90 TTFT {ttft_p90_s:.4g} s > 0.055 s (ttft_p90_max_s)" in line, line
