"""benchmarks/cpu_spin.py, the measurement behind docs/calibration.md's "A quiet engine on 2 cores": its /proc
readings, the per-thread arithmetic and the variants' settings, without a vLLM server (seconds)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("cpu_spin", ROOT / "benchmarks" / "cpu_spin.py")
cpu_spin = importlib.util.module_from_spec(_spec)
sys.modules["cpu_spin"] = cpu_spin
_spec.loader.exec_module(cpu_spin)


def _fake_proc(tmp_path: Path, procs: dict[int, tuple[int, str, list[tuple[int, str, int, int]]]]) -> Path:
    """pid -> (ppid, cmdline, [(tid, comm, utime, stime)]) as a /proc tree."""
    proc = tmp_path / "proc"
    for pid, (ppid, cmdline, threads) in procs.items():
        d = proc / str(pid)
        (d / "task").mkdir(parents=True)
        (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
        comm, utime, stime = threads[0][1], sum(t[2] for t in threads), sum(t[3] for t in threads)
        (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0 100 "
                                "0 0\n")
        for tid, tcomm, utime, stime in threads:
            (d / "task" / str(tid)).mkdir()
            (d / "task" / str(tid) / "stat").write_text(
                f"{tid} ({tcomm}) R {ppid} {pid} {pid} 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0 100 0 0\n")
    (proc / "stat").write_text("cpu  100 5 20 1000 10 1 2 7 0 0\ncpu0 1 2 3 4\n")
    return proc


def test_the_server_tree_and_each_threads_ticks_come_from_proc(tmp_path):
    proc = _fake_proc(tmp_path, {
        10: (1, "python -m vllm.entrypoints.openai.api_server --model m", [(10, "python", 5, 1)]),
        11: (10, "VLLM::EngineCore", [(11, "VLLM::EngineCor", 300, 20), (12, "ZMQbg/IO/0", 2, 1)]),
        13: (11, "VLLM::Worker", [(13, "VLLM::Worker", 400, 30)]),
        20: (1, "other", [(20, "other (x) y", 9, 9)]),  # not ours; a comm with spaces and parentheses
    })
    assert sorted(cpu_spin.descendants(10, proc)) == [10, 11, 13]
    assert cpu_spin.process_label(10, proc) == "api_server"
    assert cpu_spin.process_label(11, proc) == "VLLM::EngineCore"
    snap = cpu_spin.snapshot([10, 11, 13], proc)
    assert snap[(11, 11)].ticks == 320 and snap[(11, 12)].thread == "ZMQbg/IO/0" and snap[(13, 13)].ticks == 430
    assert cpu_spin.all_process_ticks(proc)[20] == ("other (x) y", 18)
    busy, steal = cpu_spin.machine_busy_ticks(proc)
    assert (busy, steal) == (100 + 5 + 20 + 1 + 2, 7)  # user nice system irq softirq; iowait is idle


def test_cores_per_thread_over_a_window():
    t = cpu_spin.ThreadTicks
    before = {(1, 1): t(1, 1, "p", "a", 100), (1, 2): t(1, 2, "p", "b", 50)}
    after = {(1, 1): t(1, 1, "p", "a", 100 + 2 * cpu_spin.CLK_TCK), (1, 2): t(1, 2, "p", "b", 50),
             (1, 3): t(1, 3, "p", "new", cpu_spin.CLK_TCK)}  # born inside the window: counted from 0
    use = cpu_spin.usage_between(before, after, wall_s=2.0)
    assert [(u.thread, u.cores) for u in use] == [("a", 1.0), ("new", 0.5), ("b", 0.0)]
    window = cpu_spin.Window("w", 2.0, use, machine_busy_cores=1.8, steal_cores=0.0, client_cores=0.1,
                             load_avg_1m=(1.0, 2.0))
    assert window.server_cores == 1.5 and window.other_cores == pytest.approx(0.2)
    assert window.by_process() == {"p (1)": 1.5}


def test_a_spinning_thread_and_a_sleeping_one_tell_apart():
    """The sampler against real processes: one that spins on a core reads about 1, one asleep about 0."""
    code = ("import threading, time\n"
            "def spin():\n    while True: pass\n"
            "threading.Thread(target=spin, daemon=True).start()\ntime.sleep(30)\n")
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.3)
        with cpu_spin.Sampler(child.pid, "spin") as sampler:
            time.sleep(1.0)
        threads = sampler.window.threads
        assert len(threads) == 2
        assert threads[0].cores > 0.3  # the spinning thread (a loaded machine gives it less than a core)
        assert threads[1].cores < 0.1  # the main thread, asleep
        assert sampler.window.machine_busy_cores >= threads[0].cores * 0.9
    finally:
        child.kill()
        child.wait()


def test_the_server_tpot_is_read_from_the_histogram_sums():
    text = ("# HELP x\nvllm:request_time_per_output_token_seconds_sum{model_name=\"m\",engine=\"0\"} 1.5\n"
            "vllm:request_time_per_output_token_seconds_count{model_name=\"m\",engine=\"0\"} 3.0\n"
            "vllm:request_time_per_output_token_seconds_bucket{le=\"0.1\"} 3.0\n"
            "vllm:generation_tokens_total{model_name=\"m\"} 1536.0\n")
    sums = cpu_spin.metric_sums(text, cpu_spin.SERVER_SERIES)
    assert sums[cpu_spin.TPOT_FAMILY + "_sum"] == 1.5 and sums[cpu_spin.TPOT_FAMILY + "_count"] == 3.0
    assert sums["vllm:generation_tokens_total"] == 1536.0 and sums["vllm:num_preemptions_total"] == 0.0


def test_variants_and_the_spread():
    env, args = cpu_spin.variant_settings("uni+omp1")
    assert env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
    assert args == ["--distributed-executor-backend", "uni"]
    with pytest.raises(SystemExit, match="unknown variant"):
        cpu_spin.variant_settings("uni+fast")
    # a variant's flag replaces the profile's own (the server takes the last one given, but the log shows both)
    argv = ["python", "-m", "x", "--distributed-executor-backend", "uni", "--stream-interval", "16"]
    assert cpu_spin.with_args(argv, ["--distributed-executor-backend", "mp", "--flag"]) == \
        ["python", "-m", "x", "--distributed-executor-backend", "mp", "--stream-interval", "16", "--flag"]
    env, _ = cpu_spin.variant_settings("mp")
    assert env == {"VLLM_ENABLE_V1_MULTIPROCESSING": None, "OMP_NUM_THREADS": None}  # removed from the profile's
    assert cpu_spin.spread([2.0, 2.2, None, 2.1]) == pytest.approx(0.1)
    assert cpu_spin.spread([2.0]) is None
    # prompts never share a prefix beyond their first words: prefix caching stays cold between requests
    assert cpu_spin.prompt_text(1, 50) != cpu_spin.prompt_text(2, 50)
    assert cpu_spin.prompt_text(1, 50) == cpu_spin.prompt_text(1, 50)
