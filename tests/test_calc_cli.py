"""`python -m harness calc` as a user runs it: tables, JSON, charts, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def harness_calc(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "harness", "calc", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_default_table_is_the_pages_default():
    proc = harness_calc()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "17.8 GiB" in out
    assert "baseline concurrency    4" in out
    assert "HiSparse concurrency    39" in out
    assert "134 GiB per DP replica" in out
    assert "unscaled: the calculator page's constants" in out


def test_json_parses_and_states_the_layout():
    proc = harness_calc("--seq-len", "142000", "--hot-rows", "10240", "--layout", "vllm", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["layout"] == "vllm"
    assert (data["baseline_total"], data["hisparse_total"]) == (2, 16)
    proc = harness_calc("--seq-len", "142000", "--host-pool-gib", "134", "--json")
    assert json.loads(proc.stdout)["hisparse_total"] == 22


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_seq_range_prints_and_plots(tmp_path, suffix):
    chart = tmp_path / f"concurrency{suffix}"
    proc = harness_calc("--seq-range", "1024:1048576", "--speculative-tokens", "3", "--out", str(chart))
    assert proc.returncode == 0, proc.stderr
    # 6,260 baseline blocks x (k + 3,240) < 103,693 HiSparse blocks x k first holds at k = 209 blocks
    assert "crossover: HiSparse holds more requests than the baseline from 13,313 tokens" in proc.stdout
    assert "1,048,576" in proc.stdout
    assert chart.stat().st_size > 10_000
    head = chart.read_bytes()[:512]
    assert head.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in head


def test_seq_range_json_parses(tmp_path):
    proc = harness_calc("--seq-range", "8K:1M", "--json", "--out", str(tmp_path / "c.png"))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["crossover_seq_len"] == 8192
    lengths = [r["inputs"]["seq_len"] for r in data["results"]]
    assert lengths[0] == 8192 and lengths[-1] == 1_048_576 and 131_072 in lengths
    assert (tmp_path / "c.png").stat().st_size > 0


@pytest.mark.slow  # several calc runs through the CLI, with figures (7 s)
def test_from_launch(tmp_path):
    profile = {
        "build": "neuralmagic/vllm@e8ef1e07bd", "gpu": "H200",
        "serve": {"model": "zai-org/GLM-5.3", "tensor_parallel_size": 8, "kv_cache_dtype": "fp8",
                  "max_model_len": 142_000, "max_num_seqs": 256},
        "kv": {"hisparse": {"host_pool_gib": 384}},
        "speculative": {"method": "mtp", "num_speculative_tokens": 3},
    }
    path = tmp_path / "arm.yaml"
    path.write_text(yaml.safe_dump(profile))
    proc = harness_calc("--from-launch", str(path), "--json")  # seq len from max_model_len
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["inputs"]["seq_len"] == 142_000 and data["layout"] == "vllm"
    assert (data["hisparse_total"], data["host_pool_gib"]) == (16, 384)
    proc = harness_calc("--from-launch", str(path), "--seq-len", "81920", "--layout", "unscaled", "--json")
    assert json.loads(proc.stdout)["hisparse_total"] == 22
    old = harness_calc("--from-launch", str(path), "--seq-len", "81920", "--layout", "blog", "--json")
    assert old.returncode == 0 and json.loads(old.stdout) == json.loads(proc.stdout)  # the old name still works
    assert old.stderr.strip() == "--layout blog: deprecated: now --layout unscaled"
    proc = harness_calc("--from-launch", str(path), "--tp", "4")
    assert proc.returncode == 2 and "--tp: not with --from-launch" in proc.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--seq-len", "0"], "--seq-len"),
    (["--seq-len", "-5"], "--seq-len"),
    (["--seq-len", "lots"], "--seq-len"),
    (["--tp", "0"], "tp"),
    (["--host-pool-gib", "-1"], "host_pool_gib"),
    (["--gpus", "8", "--tp", "3"], "tensor parallel size 3 does not divide 8 GPUs"),
    (["--gpu", "A100"], "unknown GPU 'A100'"),
    (["--kv-dtype", "int4"], "kv_dtype"),
    (["--layout", "sglang"], "--layout"),
    (["--tp", "eight"], "--tp: 'eight' is not a whole number"),
    (["--seq-range", "9000:100"], "--seq-range"),
    (["--seq-range", "1024:4096", "--out", "chart.pdf"], ".png or .svg"),
    (["--out", "chart.png"], "--seq-range"),
    (["--from-launch", "no/such/profile.yaml"], "no such file"),
])
def test_bad_inputs_are_one_line_exit_2(tmp_path, args, needle):
    proc = harness_calc(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("harness calc: error: ") and needle in lines[0]
    assert not any(tmp_path.iterdir())  # nothing half-written
