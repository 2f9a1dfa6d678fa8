"""Reliability end to end: interrupts with arms in parallel on a two-node Ray cluster, server logs
shipped back from other nodes, API keys, proxies, run ids. Real EvalScope, the simulated engine as
the server, real Ray (ray.cluster_utils, fake GPUs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from procutil import running
from sweep_support import ROOT, interrupt_when, points_of, run_sweep, sweep_argv, wait_for, write_sweep

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_gpu_nodes(tmp_path_factory):
    """A head without GPUs (the driver's node) and two worker nodes with one declared GPU each and
    temp folders of their own, so every server runs on a node other than the driver's."""
    from ray.cluster_utils import Cluster

    base = tmp_path_factory.mktemp("nodes")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_gpus": 0, "num_cpus": 2, "object_store_memory": 100 * 1024**2})
    temp_dirs = []
    for i in range(2):
        temp = base / f"node{i}-tmp"
        temp.mkdir()
        temp_dirs.append(temp)
        cluster.add_node(num_gpus=1, num_cpus=2, object_store_memory=100 * 1024**2,
                         env_vars={"TMPDIR": str(temp)})
    cluster.wait_for_nodes()
    yield cluster, temp_dirs
    cluster.shutdown()


def _server_pids(run_dir: Path) -> list[int]:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    return [d["server_pid"] for d in manifest["deployments"].values() if d.get("server_pid")]


def _actor_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"ServerActor" in (entry / "cmdline").read_bytes() and running(int(entry.name)):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def test_sigint_with_arms_in_parallel_stops_everything_and_ships_logs(tmp_path, two_gpu_nodes):
    cluster, temp_dirs = two_gpu_nodes
    sweep = write_sweep(tmp_path, {"arm-a": "reserve_gpus: 1\n", "arm-b": "reserve_gpus: 1\n"},
                        [(1, 4), (2, 4)])
    env = dict(os.environ, RAY_ADDRESS=cluster.address)
    run_dir = tmp_path / "results/par"
    servers: list[int] = []

    def both_points_running() -> bool:
        return all(any((run_dir / f"points/{arm}/c1/evalscope").glob("attempt-*/evalscope.log"))
                   for arm in ("arm-a", "arm-b"))

    def two_servers_up() -> None:
        servers.extend(_server_pids(run_dir))
        assert len(servers) == 2 and _actor_pids()

    stopped = interrupt_when(sweep_argv(sweep, "par", "ray"), both_points_running, tmp_path / "harness.out",
                             start_timeout_s=240, settle_s=1.0, stop_timeout_s=60, env=env,
                             before_signal=two_servers_up)
    assert stopped.returncode == 130, stopped.log
    assert stopped.took_s < 30, f"the harness took {stopped.took_s:.1f} s to stop"
    gone = [*servers, *stopped.seen]
    assert wait_for(lambda: not any(running(p) for p in gone) and not _actor_pids(), 10), \
        f"still alive: {[p for p in gone if running(p)]} actors {_actor_pids()}"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"

    done = subprocess.run(sweep_argv(sweep, "par", "ray"), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    records = points_of(run_dir)
    assert len(records) == 4 and all(r.status == "ok" for r in records.values())
    # every server ran on a worker node, logging to that node's temp folder; the driver's run folder
    # holds every line (shipped back through Ray), from both runs
    for arm in ("arm-a", "arm-b"):
        log = (run_dir / f"deployments/{arm}/server.log").read_text()
        assert log.count("===== harness: start") == 2 and "sim: serving glm-agentx" in log
    node_logs = [p for temp in temp_dirs for p in temp.rglob("server-logs/*.log")]
    assert len(node_logs) == 4 and all(str(run_dir) not in str(p) for p in node_logs)


def test_an_api_key_is_used_everywhere_and_written_nowhere(tmp_path):
    # the server demands a key (its --api-key, or VLLM_API_KEY) and prints its arguments with the key,
    # as older vLLM releases did: readiness, scrapes and EvalScope must send it; no file may keep it
    sweep = write_sweep(tmp_path, {"flag": "extra_args: ['--api-key', 'sk-live-SECRETKEY1']\n",
                                   "env": "env: {VLLM_API_KEY: sk-live-SECRETKEY2}\n"}, [(1, 2)])
    done = subprocess.run([a for a in sweep_argv(sweep, "key") if a != "--no-report"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = tmp_path / "results/key"
    records = points_of(run_dir)
    assert all(r.status == "ok" and r.metrics.scrapes_ok > 0 for r in records.values())
    assert "non-default args: {'api_key': '***'" in (run_dir / "deployments/flag/server.log").read_text()
    leaks = [str(p) for folder in (run_dir, tmp_path / "plots") for p in folder.rglob("*")
             if p.is_file() and b"SECRETKEY" in p.read_bytes()]
    assert leaks == []


def test_a_proxy_in_the_environment_never_sees_the_harness_traffic(tmp_path):
    # a proxy where nothing listens: anything sent through it fails; the sweep must not notice it
    sweep = write_sweep(tmp_path, {"hs": ""}, [(1, 2)])
    env = dict(os.environ, HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9",
               http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9")
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    done = subprocess.run(sweep_argv(sweep, "px"), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    record = points_of(tmp_path / "results/px")[("hs", 1)]
    assert record.status == "ok" and record.metrics.scrapes_ok > 0 and record.metrics.scrapes_failed == 0
    assert record.warnings == []


@pytest.mark.parametrize("run_id", ["../escape", "/tmp/escape", ".hidden", "a/b"])
def test_a_run_id_that_leaves_the_results_folder_is_refused(tmp_path, run_id):
    sweep = write_sweep(tmp_path, {"hs": ""}, [(1, 1)])
    for command in ("sweep", "simulate"):
        done = subprocess.run([sys.executable, "-m", "harness", command, str(sweep), "--run-id", run_id,
                               "--results-dir", str(tmp_path / "results")], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "--run-id" in done.stderr
    assert not (tmp_path / "escape").exists() and not Path("/tmp/escape").exists()
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_a_sweep_started_with_sigint_ignored_still_stops_on_sigint(tmp_path):
    # what a non-interactive shell does to its background jobs: SIGINT ignored, inherited by children
    sweep = write_sweep(tmp_path, {"hs": ""}, [(1, 4)])
    proc = subprocess.Popen(sweep_argv(sweep, "ig"), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert wait_for(lambda: any((tmp_path / "results/ig/points/hs/c1/evalscope").glob("attempt-*")), 180)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    done = run_sweep(sweep, "ig")
    assert done.returncode == 0, done.stdout + done.stderr
