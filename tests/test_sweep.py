"""`harness sweep` end to end: the simulated engine as the server, real EvalScope, real Ray.

Every sweep runs as `python -m harness sweep` in a subprocess, as a user runs it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from procutil import running
from sweep_support import (
    ROOT,
    descendants,
    points_of,
    run_sweep,
    sweep_argv,
    tree_digest,
    wait_for,
    write_sweep,
)

pytestmark = pytest.mark.slow


def test_local_sweep_runs_every_point_and_resume_skips_them(tmp_path):
    sweep = write_sweep(tmp_path, {"hs": ""}, [(1, 2), (2, 2)])
    done = run_sweep(sweep, "r1")
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = tmp_path / "results/r1"
    records = points_of(run_dir)
    assert sorted(records) == [("hs", 1), ("hs", 2)]
    for record in records.values():
        assert record.status == "ok", record.reason
        assert record.summary.success_requests == record.conversations * 2  # two turns per conversation
        assert record.metrics.occupancy_mean_running > 0
        assert record.metrics.interactivity_tok_s_user > 0
        assert record.simulated
    assert (run_dir / "summary.csv").exists()
    assert (run_dir / "deployments/hs/command.txt").read_text().count("serve-sim") == 1
    assert json.loads((run_dir / "deployments/hs/preflight.json").read_text())["problems"] == []
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["simulated"] is True
    assert manifest["provenance"]["evalscope_version"].startswith("1.14")
    assert "hs" in done.stdout and "tok/s/user" in done.stdout

    before = tree_digest(run_dir / "points")
    again = run_sweep(sweep, "r1")
    assert again.returncode == 0, again.stderr
    assert "nothing to run" in again.stdout
    assert tree_digest(run_dir / "points") == before


def test_ray_sweep_two_deployments_two_points(tmp_path):
    sweep = write_sweep(tmp_path, {"arm-a": "reserve_gpus: 1\n", "arm-b": "reserve_gpus: 1\n"}, [(1, 2), (2, 2)])
    done = run_sweep(sweep, "ray1", "ray", "--ray-gpus", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    records = points_of(tmp_path / "results/ray1")
    assert sorted(records) == [("arm-a", 1), ("arm-a", 2), ("arm-b", 1), ("arm-b", 2)]
    assert all(r.status == "ok" for r in records.values())
    manifest = json.loads((tmp_path / "results/ray1/manifest.json").read_text())
    assert all(d.get("node") for d in manifest["deployments"].values())


def test_server_that_exits_mid_point_is_restarted(tmp_path):
    # the server dies after a handful of requests: the first point completes, the second
    # loses its server part-way, the third runs on a restarted server
    sweep = write_sweep(tmp_path, {"flaky": "sim: {faults: {exit_after_requests: 9}}\n"},
                        [(1, 2), (2, 4), (3, 3)])
    done = run_sweep(sweep, "f1")
    assert done.returncode == 1, done.stdout + done.stderr
    records = points_of(tmp_path / "results/f1")
    assert records[("flaky", 1)].status == "ok"
    failed = [r for r in records.values() if r.status == "failed"]
    assert failed, "a point should have failed"
    assert any("server died" in (r.reason or "") for r in failed)
    assert all(r.server_log_tail for r in failed)
    manifest = json.loads((tmp_path / "results/f1/manifest.json").read_text())
    assert manifest["deployments"]["flaky"]["restarts"] >= 1
    last = max(records.values(), key=lambda r: r.started_unix_s or 0)
    assert last.status == "ok" and last.server_restarted


def test_server_that_never_gets_ready_fails_with_log_tail(tmp_path):
    sweep = write_sweep(tmp_path, {"stuck": "ready_timeout_s: 8\nsim: {faults: {never_ready: true}}\n"},
                        [(1, 1)])
    done = run_sweep(sweep, "n1")
    assert done.returncode == 1
    record = points_of(tmp_path / "results/n1")[("stuck", 1)]
    assert record.status == "failed" and "server failed to start" in record.reason
    assert "8" in record.reason or "ready" in record.reason
    assert record.server_log_tail


def test_malformed_metrics_are_recorded_not_fatal(tmp_path):
    sweep = write_sweep(tmp_path, {"garbled": "sim: {faults: {malformed_metrics: true}}\n"}, [(1, 1)])
    done = run_sweep(sweep, "m1")
    assert done.returncode == 0, done.stdout + done.stderr
    record = points_of(tmp_path / "results/m1")[("garbled", 1)]
    assert record.status == "ok"
    assert record.metrics.scrapes_failed > 0 and record.metrics.occupancy_mean_running is None
    lines = (tmp_path / "results/m1/points/garbled/c1/scrapes.jsonl").read_text().splitlines()
    assert any("error" in json.loads(line) for line in lines)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_leaves_no_childrunning(tmp_path, signum):
    sweep = write_sweep(tmp_path, {"hs": ""}, [(1, 4), (2, 4)])
    proc = subprocess.Popen(sweep_argv(sweep, "s1"), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen: set[int] = set()
    try:
        def point_running() -> bool:
            seen.update(descendants(proc.pid))
            return any((tmp_path / "results/s1/points/hs/c1/evalscope").glob("attempt-*/evalscope.log"))
        assert wait_for(point_running, 180), "the first point never started"
        time.sleep(1.0)
        seen.update(descendants(proc.pid))
        assert len(seen) >= 2  # the server and EvalScope at least
        os.kill(proc.pid, signum)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert wait_for(lambda: not any(running(p) for p in seen), 30), \
        f"still alive: {[p for p in seen if running(p)]}"


def test_resume_after_the_harness_is_killed(tmp_path):
    sweep = write_sweep(tmp_path, {"hs": ""}, [(1, 2), (2, 2), (3, 3)])
    proc = subprocess.Popen(sweep_argv(sweep, "k1"), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    first = tmp_path / "results/k1/points/hs/c1/point.json"
    second_client = tmp_path / "results/k1/points/hs/c2/evalscope/attempt-1/evalscope.log"
    children: set[int] = set()
    try:
        assert wait_for(first.exists, 240), "the first point never finished"
        assert wait_for(second_client.exists, 120), "the second point's client never started"
        time.sleep(1.0)
        children = descendants(proc.pid)  # the server and the running EvalScope, in sessions of their own
        assert len(children) >= 2
        os.kill(proc.pid, signal.SIGKILL)  # the harness alone, without any cleanup
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # its children die with it (parent-death signal), the client included: nothing keeps running
    assert wait_for(lambda: not any(running(p) for p in children), 30), \
        f"still alive after the harness was killed: {[p for p in children if running(p)]}"
    before = tree_digest(first.parent)
    done = run_sweep(sweep, "k1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "already ok" in done.stdout
    assert tree_digest(first.parent) == before
    records = points_of(tmp_path / "results/k1")
    assert all(r.status == "ok" for r in records.values()) and len(records) == 3


def test_deployments_run_at_once_on_a_multi_node_ray_cluster(tmp_path):
    # two Ray nodes with one (declared) GPU each: one deployment per node, at the same time
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_gpus": 1, "num_cpus": 2, "object_store_memory": 100 * 1024**2})
    try:
        cluster.add_node(num_gpus=1, num_cpus=2, object_store_memory=100 * 1024**2)
        sweep = write_sweep(tmp_path, {"arm-a": "reserve_gpus: 1\n", "arm-b": "reserve_gpus: 1\n"}, [(1, 2)])
        done = subprocess.run(sweep_argv(sweep, "mn", "ray"), capture_output=True, text=True, timeout=300,
                              cwd=ROOT, env=dict(os.environ, RAY_ADDRESS=cluster.address))
    finally:
        cluster.shutdown()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 deployments on 2 nodes at once" in done.stdout
    records = points_of(tmp_path / "results/mn")
    a, b = records[("arm-a", 1)], records[("arm-b", 1)]
    assert a.started_unix_s < b.ended_unix_s and b.started_unix_s < a.ended_unix_s  # the windows overlap
    nodes = {d["node"] for d in json.loads((tmp_path / "results/mn/manifest.json").read_text())["deployments"].values()}
    assert len(nodes) == 2


def test_secrets_never_reach_the_run_folder_of_sweep_or_simulate(tmp_path):
    sweep = write_sweep(tmp_path, {"hs": "env: {HF_TOKEN: hf-SECRET-ONE}\n"
                                         "extra_args: ['--hf-token', 'hf-SECRET-THREE']\n"}, [(1, 1)])
    text = sweep.read_text().replace("  timeout_s: 300\n",
                                     "  timeout_s: 300\n  evalscope_args: [--api-key, sk-SECRET-TWO]\n")
    sweep.write_text(text)
    # with the report and figures, as a user runs it
    done = subprocess.run([a for a in sweep_argv(sweep, "sec") if a != "--no-report"], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = tmp_path / "results/sec"
    assert (run_dir / "report.md").exists()
    record = points_of(run_dir)[("hs", 1)]
    assert record.evalscope_command[record.evalscope_command.index("--api-key") + 1] == "***"
    command = (run_dir / "deployments/hs/command.txt").read_text()
    assert "HF_TOKEN='***'" in command and "{port}" not in command  # the real port, re-runnable
    simulated = subprocess.run([sys.executable, "-m", "harness", "simulate", str(sweep), "--run-id", "sec-sim",
                                "--results-dir", str(tmp_path / "results")], capture_output=True, text=True,
                               timeout=600, cwd=ROOT)
    assert simulated.returncode == 0, simulated.stdout + simulated.stderr
    secrets = (b"SECRET-ONE", b"SECRET-TWO", b"SECRET-THREE")
    for folder in (run_dir, tmp_path / "results/sec-sim", tmp_path / "plots"):
        files = [p for p in folder.rglob("*") if p.is_file()]
        assert files, folder
        leaks = [str(p) for p in files if any(s in p.read_bytes() for s in secrets)]
        assert leaks == []
    plan = subprocess.run([sys.executable, "-m", "harness", "plan", str(sweep), "--json"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    assert "SECRET" not in plan


def test_a_failed_point_is_retried_on_a_restarted_server(tmp_path):
    # the server dies during c2 (request 9); with one retry allowed, c2 runs again on a fresh server and
    # ends ok, while the failed attempt's EvalScope folder stays beside it
    sweep = write_sweep(tmp_path, {"flaky": "sim: {faults: {exit_after_requests: 9}}\n"}, [(1, 2), (2, 3)])
    sweep.write_text(sweep.read_text().replace("on_point_failure: continue",
                                               "on_point_failure: continue\nmax_point_retries: 1"))
    done = run_sweep(sweep, "rt")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "retrying (1 of 1)" in done.stdout
    record = points_of(tmp_path / "results/rt")[("flaky", 2)]
    assert record.status == "ok" and record.attempt == 2 and record.server_restarted
    attempts = sorted(p.name for p in (tmp_path / "results/rt/points/flaky/c2/evalscope").iterdir())
    assert attempts == ["attempt-1", "attempt-2"]
    assert (tmp_path / "results/rt/points/flaky/c2/scrapes.attempt-1.jsonl").exists()
