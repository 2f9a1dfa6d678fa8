"""`harness fetch` and `harness sweep` on a two-node local Ray cluster: the weights go onto both nodes'
own caches (separate folders, named by each node's HISPARSE_WEIGHTS_CACHE), a second fetch moves
nothing, and each server starts from its own node's copy (command.txt names it).

The nodes are offline (HF_HUB_OFFLINE, MODELSCOPE_OFFLINE) and copy from a seed, a weights cache
root in each library's layout (HISPARSE_WEIGHTS_SEED), as nodes without hub access do. The servers
are `vllm serve <path> ...` run by a stand-in `vllm` on PATH that refuses a path without a model
folder on its node and otherwise serves the simulated engine; everything else (plan, fetch tasks,
placement groups, EvalScope, the run folder) is the real thing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_hub import COMMIT, make_hf_cache, make_ms_cache, tiny_model_files, tokenizer_files

from harness.fetch import CACHE_ROOT_ENV, SEED_CACHE_ENV, folder_bytes

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
MODELS = {"arm-hf": f"hf://org/tiny@{COMMIT}", "arm-ms": "ms://org/tiny@v1.0"}

STUB = """#!/bin/sh
# `vllm` for the test: --version, and `serve MODEL ...` as the simulated engine once MODEL is a model folder here
if [ "$1" = "--version" ]; then echo 0.0.0+stub; exit 0; fi
[ "$1" = serve ] || exit 64
model="$2"; shift 2
[ -f "$model/config.json" ] || {{ echo "stub vllm: no model folder at $model" >&2; exit 3; }}
host=127.0.0.1; port=8000
while [ $# -gt 0 ]; do
  case "$1" in --host) host="$2"; shift;; --port) port="$2"; shift;; esac
  shift
done
echo "stub vllm: serving $model"
exec {python} -m harness serve-sim --launch {sim} --host "$host" --port "$port"
"""


def seed_and_stub(tmp: Path) -> dict[str, str]:
    """Seeds in both libraries' layouts, the stand-in `vllm`; the environment every node gets."""
    make_hf_cache(tmp / "seed" / "huggingface", "org/tiny", tiny_model_files())
    make_ms_cache(tmp / "seed" / "modelscope", "org/tiny", tiny_model_files(), revision="v1.0")
    (tmp / "bin").mkdir()
    (tmp / "sim.yaml").write_text(f"extends: {ROOT}/launch/sim-hisparse.yaml\nserve: {{served_model_name: tiny}}\n")
    stub = tmp / "bin" / "vllm"
    stub.write_text(STUB.format(python=sys.executable, sim=tmp / "sim.yaml"))
    stub.chmod(0o755)
    return {"HF_HUB_OFFLINE": "1", "MODELSCOPE_OFFLINE": "1", SEED_CACHE_ENV: str(tmp / "seed"),
            "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two Ray nodes, one fake GPU each, each with its own weights cache root; the test's folder."""
    import ray
    from ray.cluster_utils import Cluster

    tmp = tmp_path_factory.mktemp("two-nodes")
    common = seed_and_stub(tmp)
    node_args = {"num_cpus": 1, "num_gpus": 1, "object_store_memory": 80 * 1024**2}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    head = Cluster(initialize_head=True, head_node_args={
        **node_args, "env_vars": {**common, CACHE_ROOT_ENV: str(tmp / "node-a")}, "include_dashboard": False})
    try:
        head.add_node(**node_args, env_vars={**common, CACHE_ROOT_ENV: str(tmp / "node-b")})
        head.wait_for_nodes()
        env = {**{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}, **common,
               "RAY_ADDRESS": head.address, "RAY_AUTH_MODE": "disabled"}
        yield tmp, env
    finally:
        if ray.is_initialized():
            ray.shutdown()
        head.shutdown()


def write_sweep(tmp: Path, tokenizer: str = f"{ROOT}/harness/data/tokenizers/harness-bpe") -> Path:
    for name, model in MODELS.items():
        (tmp / f"{name}.yaml").write_text(f"""
engine: vllm
build: system
reserve_gpus: 1
ready_timeout_s: 120
serve: {{model: "{model}", served_model_name: tiny}}
""")
    (tmp / "recipe.yaml").write_text(f"""
name: tiny-fetch
source: {{kind: sample, path: {ROOT}/harness/data/samples/openhands-sample.jsonl}}
tokenizer: {tokenizer}
first_turn_length: 300
subsequent_turn_length: 40
num_turns: 2
conversations: 4
assumed_output_length: 32
""")
    (tmp / "sweep.yaml").write_text("""
name: fetched
dataset: recipe.yaml
gpus_per_server: 1
client: {max_tokens: 32, extra_args: {ignore_eos: true}, dataset_offset: 0, points: [{concurrency: 1, conversations: 2}]}
scrape: {interval_s: 0.5}
deployments:
  - {name: arm-hf, launch: arm-hf.yaml}
  - {name: arm-ms, launch: arm-ms.yaml}
""")
    return tmp / "sweep.yaml"


def harness(env: dict[str, str], *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout_s)


def program_part(command_txt: str) -> str:
    """A recorded command without the environment assignments command.txt puts before the program."""
    words = command_txt.split(" ")
    while words and "=" in words[0] and not words[0].startswith("-"):
        words.pop(0)
    return " ".join(words)


def snapshot(root: Path, hub: str) -> Path:
    return (root / "huggingface" / "models--org--tiny" / "snapshots" / COMMIT if hub == "hf"
            else root / "modelscope" / "models" / "org--tiny" / "snapshots" / "v1.0")


@pytest.mark.timeout(600)
def test_fetch_puts_the_weights_on_both_nodes_then_moves_nothing(cluster):
    tmp, env = cluster
    sweep = write_sweep(tmp)
    first = harness(env, "fetch", str(sweep))
    assert first.returncode == 0, first.stdout + first.stderr
    files = tiny_model_files()
    for node in ("node-a", "node-b"):
        for hub in ("hf", "ms"):
            folder = snapshot(tmp / node, hub)
            assert {p.name: p.read_bytes() for p in folder.iterdir()} == files, (node, hub)
    out = first.stdout
    assert out.count(" moved, ") == 4 and "already there" not in out, out  # 2 models x 2 nodes
    assert sum(line.endswith(" done") and "copying from" in line for line in out.splitlines()) == 4
    before = {node: folder_bytes(tmp / node) for node in ("node-a", "node-b")}

    second = harness(env, "fetch", str(sweep))
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.count("already there") == 4 and " moved, " not in second.stdout, second.stdout
    assert second.stdout.count("nothing to transfer") == 2
    assert {node: folder_bytes(tmp / node) for node in ("node-a", "node-b")} == before

    # a profile (not a sweep) works the same; a model no seed has fails in one line naming each node
    (tmp / "missing.yaml").write_text("engine: vllm\nreserve_gpus: 1\nserve: {model: hf://org/absent@main}\n")
    missing = harness(env, "fetch", str(tmp / "missing.yaml"))
    assert missing.returncode == 2, missing.stdout
    line = missing.stderr.strip().splitlines()[-1]  # (Ray's own lines about joining the cluster come first)
    assert line.startswith("harness fetch: error: weights fetch failed on node ")
    assert line.count("huggingface: org/absent@main: not in the local cache") == 2, line


@pytest.mark.timeout(600)
def test_sweep_servers_start_from_their_nodes_copy(cluster):
    tmp, env = cluster
    sweep = write_sweep(tmp)
    done = harness(env, "sweep", str(sweep), "--run-id", "f1", "--results-dir", str(tmp / "results"), "--no-report",
                   timeout_s=500)
    run_dir = tmp / "results" / "f1"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    nodes_used = set()
    for dep, hub in (("arm-hf", "hf"), ("arm-ms", "ms")):
        record = manifest["deployments"][dep]
        weights = record["weights"]
        assert len(weights["nodes"]) == 2 and weights["revision_sha"] == (COMMIT if hub == "hf" else "v1.0")
        local = weights["nodes"][record["node"]]  # the copy on the node this server ran on
        assert local in {str(snapshot(tmp / n, hub)) for n in ("node-a", "node-b")}
        command = (run_dir / "deployments" / dep / "command.txt").read_text()
        assert program_part(command).startswith(f"vllm serve {local} ") and "--served-model-name tiny" in command, \
            command
        assert "{model}" not in command and "org/tiny" not in command
        assert f"stub vllm: serving {local}" in (run_dir / "deployments" / dep / "server.log").read_text()
        preflight = json.loads((run_dir / "deployments" / dep / "preflight.json").read_text())
        assert preflight["problems"] == [] and len(preflight["weights_disk"]) == 2
        point = json.loads((run_dir / "points" / dep / "c1" / "point.json").read_text())
        assert point["status"] == "ok", point["reason"]
        nodes_used.add(record["node"])
    assert len(nodes_used) == 2  # one arm per node, each from that node's cache


@pytest.mark.timeout(600)
def test_local_launcher_fetches_here_and_starts_from_this_machines_copy(tmp_path):
    # the dataset's tokenizer from a hub too: its revision lands in the run's provenance and report
    make_hf_cache(tmp_path / "hf-cache", "org/tok", tokenizer_files())
    env = {**{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "HF_HOME")},
           **seed_and_stub(tmp_path), CACHE_ROOT_ENV: str(tmp_path / "here"), "HF_HUB_CACHE": str(tmp_path / "hf-cache")}
    sweep = write_sweep(tmp_path, tokenizer=f"hf://org/tok@{COMMIT}")
    first = harness(env, "fetch", str(sweep), "--launcher", "local")
    assert first.returncode == 0 and first.stdout.count(" moved, ") == 2, first.stdout + first.stderr
    done = harness(env, "sweep", str(sweep), "--launcher", "local", "--run-id", "l1", "--results-dir",
                   str(tmp_path / "results"), "--no-report", timeout_s=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("nothing to transfer") == 2  # the fetch above left nothing to do
    for dep, hub in (("arm-hf", "hf"), ("arm-ms", "ms")):
        command = (tmp_path / "results/l1/deployments" / dep / "command.txt").read_text()
        assert program_part(command).startswith(f"vllm serve {snapshot(tmp_path / 'here', hub)} "), command
    manifest = json.loads((tmp_path / "results/l1/manifest.json").read_text())
    assert manifest["provenance"]["hub_inputs"]["tokenizer"] == {
        "hub": "huggingface", "id": "org/tok", "repo_type": "model", "revision": COMMIT, "revision_sha": COMMIT,
        "revision_is_commit": True}
    report = harness(env, "report", str(tmp_path / "results/l1"))
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "results/l1/report.md").read_text()
    assert f"| hub_inputs.tokenizer.revision_sha | {COMMIT} |" in text and '"revision_sha": "0123' in text
