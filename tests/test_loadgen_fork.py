"""The fork server that runs a sweep's clients (harness/forkserver.py behind harness.loadgen.LoadGenerator): the
second run is forked from the same server, not started from scratch; each run keeps what a started process had
(its own session, log, environment, folder, exit status); a run past its time is stopped with its process
group; a command no server can run still runs; closing leaves no process behind. Real processes throughout;
the servers here preload nothing so the tests stay fast (EvalScope's own runs go through them in every sweep)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import harness
from harness.loadgen import PRELOAD, LoadGenerator, forkable

PROBE = f"""#!{sys.executable}
import json, os, sys, time
out = {{"pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "argv": sys.argv[1:],
        "cwd": os.getcwd(), "no_proxy": os.environ.get("NO_PROXY", ""), "marker": os.environ.get("FORK_MARKER"),
        "path": sys.path}}
print(json.dumps(out), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if "--sleep" in sys.argv:
    time.sleep(60)
sys.exit(int(sys.argv[sys.argv.index("--exit") + 1]) if "--exit" in sys.argv else 0)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _probe(tmp_path: Path) -> Path:
    script = tmp_path / "probe"
    script.write_text(PROBE)
    script.chmod(0o755)
    return script


def _first_line(log: Path) -> dict:
    return json.loads(log.read_text().splitlines()[0])


def test_runs_fork_from_one_server_and_keep_what_a_started_process_has(tmp_path, monkeypatch):
    script = _probe(tmp_path)
    monkeypatch.setenv("FORK_MARKER", "set after the server started")
    monkeypatch.chdir(tmp_path)
    generator = LoadGenerator(preload=())
    try:
        runs = []
        for i, exit_code in enumerate((0, 3)):
            log = tmp_path / f"run{i}" / "client.log"
            run = generator.run([str(script), "--url", "http://127.0.0.9:1/v1", "--exit", str(exit_code)], log,
                                timeout_s=60)
            runs.append((run, _first_line(log), log.read_text()))
        (first, one, log_one), (second, two, _) = runs
        assert (first.returncode, second.returncode) == (0, 3)
        assert one["ppid"] == two["ppid"] != os.getpid()  # the same server forked both
        assert _alive(one["ppid"])  # and it is kept for the next point
        assert one["sid"] == one["pid"] and two["sid"] == two["pid"]  # each leads its own process group
        assert one["argv"] == ["--url", "http://127.0.0.9:1/v1", "--exit", "0"]
        assert one["cwd"] == str(tmp_path) and one["marker"] == "set after the server started"
        # the script's folder first on the path, as on a command line; never the server's own (harness/, whose
        # modules would shadow top-level ones of the same name)
        assert one["path"][0] == str(tmp_path)
        assert str(Path(harness.__file__).parent) not in one["path"]
        assert "127.0.0.9" in one["no_proxy"].split(",")
        assert "to stderr" in log_one  # stdout and stderr both in the log
    finally:
        generator.close()
    assert not _alive(one["ppid"])


def test_a_run_past_its_time_is_stopped_and_close_leaves_nothing(tmp_path):
    script = _probe(tmp_path)
    generator = LoadGenerator(preload=())
    log = tmp_path / "slow.log"
    try:
        run = generator.run([sys.executable, str(script), "--sleep"], log, timeout_s=2)
        child = _first_line(log)
        assert run.timed_out and run.returncode != 0
        assert child["ppid"] != os.getpid()  # `python SCRIPT` is forked too
        assert not _alive(child["pid"])
        printed = tmp_path / "stop.log"  # stopped once it has started (the server died, say)
        stopped = generator.run([sys.executable, str(script), "--sleep"], printed, timeout_s=60,
                                should_stop=lambda: printed.exists() and printed.stat().st_size > 0)
        assert stopped.interrupted and not _alive(_first_line(tmp_path / "stop.log")["pid"])
        server = child["ppid"]
    finally:
        generator.close()
    deadline = time.monotonic() + 5
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(server)


def test_what_no_server_can_run_starts_from_scratch(tmp_path):
    shell = tmp_path / "client.sh"
    shell.write_text("#!/bin/sh\necho \"parent $PPID\"\nexit 4\n")
    shell.chmod(0o755)
    assert forkable([str(shell)]) is None
    assert forkable(["nice", "-n", "5", sys.executable, "-m", "evalscope.cli.cli", "perf"]) == (
        ["nice", "-n", "5", sys.executable], ["-m", "evalscope.cli.cli", "perf"])
    generator = LoadGenerator(preload=())
    try:
        run = generator.run([str(shell)], tmp_path / "sh.log", timeout_s=30)
    finally:
        generator.close()
    assert run.returncode == 4 and (tmp_path / "sh.log").read_text().startswith("parent ")
    assert "evalscope.perf.main" in PRELOAD  # what the sweeps' servers import once
