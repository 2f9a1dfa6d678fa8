"""Real EvalScope (swe_smith, multi-turn, streaming) against `harness serve-sim`: every request succeeds
and the usage EvalScope reads is the server's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from sim_support import profile, sim_server

HISPARSE_KV = {"hisparse": {"host_pool_gib": 384},
               "offload": {"spec": "TieringOffloadingSpec", "cpu_bytes": "128GiB"}}


def write_swe_smith(path, conversations=2, turns=3):
    convs = []
    for c in range(conversations):
        turn_list = []
        for t in range(turns):
            text = f"conversation {c} turn {t}: please fix the failing test in module parser. " * (
                40 if t == 0 else 5)
            turn_list.append({"messages": [{"role": "user", "content": text}]})
        convs.append(turn_list)
    path.write_text(json.dumps({"metadata": {"kind": "test"}, "conversations": convs}))


def evalscope_argv():
    exe = shutil.which("evalscope")
    return [exe] if exe else [sys.executable, "-m", "evalscope.cli.cli"]


@pytest.mark.slow
def test_evalscope_multi_turn_run_completes(tmp_path):
    data = tmp_path / "swe_smith.json"
    write_swe_smith(data)
    out = tmp_path / "evalscope"
    with sim_server(tmp_path, profile(kv=HISPARSE_KV)) as server:
        proc = subprocess.run(
            [*evalscope_argv(), "perf", "--api", "openai", "--url", server.url + "/v1/chat/completions",
             "--model", "glm-agentx", "--dataset", "swe_smith", "--dataset-path", str(data), "--multi-turn",
             "--number", "2", "--parallel", "2", "--max-tokens", "16", "--extra-args", '{"ignore_eos":true}',
             "--stream", "--outputs-dir", str(out), "--no-timestamp"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summaries = list(out.rglob("benchmark_summary.json"))
    assert len(summaries) == 1
    summary = json.loads(summaries[0].read_text())
    assert summary["Failed Requests"] == 0
    assert summary["Success Requests"] == summary["Total Requests"] >= 4
    assert summary["Avg Output Tokens"] == 16.0
    assert summary["Avg TPOT (ms)"] > 0 and summary["Total Throughput (tok/s)"] > 0
