"""Local launcher, process teardown and pidfile reaping, against real subprocesses on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from procutil import accepts, running

from harness.errors import HarnessError
from harness.io import die_with_parent
from harness.servers.base import (
    LauncherClosed,
    ServerSpec,
    ServerStartError,
    read_log_tail,
    stop_servers_on_signal,
)
from harness.servers.local import LocalLauncher
from harness.servers.process import proc_info
from harness.servers.reaper import boot_id, read_pidfiles, reap_stale_servers

FAKE = Path(__file__).parent / "fixtures" / "servers" / "fake_openai.py"
REPO = Path(__file__).resolve().parents[1]


def fake_spec(tmp_path: Path, *extra: str, name: str = "fake", timeout_s: float = 20,
              probe: bool = True, stop_grace_s: float = 15) -> ServerSpec:
    return ServerSpec(name=name, argv=[sys.executable, str(FAKE), "--host", "{host}", "--port", "{port}",
                                       "--model", "served", *extra],
                      env={"FAKE_MARK": "1"}, host="127.0.0.1", port=0, log_path=tmp_path / "server.log",
                      ready_timeout_s=timeout_s, gpus=0, served_model_name="served",
                      ready_probe_request=probe, pid_dir=tmp_path / "pids", stop_grace_s=stop_grace_s)






def wait_for_file(path: Path, timeout_s: float = 20) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return json.loads(path.read_text())


def test_start_ready_stop_closes_port(tmp_path):
    with LocalLauncher() as launcher:
        handle = launcher.start(fake_spec(tmp_path, "--ready-after-s", "0.5"))
        assert handle.port > 0 and handle.base_url == f"http://127.0.0.1:{handle.port}"
        assert handle.alive() and handle.healthy()
        assert len(read_pidfiles(tmp_path / "pids")) == 1
        assert launcher.nodes_for(8) == 1
        pid, port = handle.pid, handle.port
        handle.stop(grace_s=5)
        assert not running(pid) and not accepts(port)
        assert not handle.alive() and not handle.healthy(timeout_s=1)
        assert read_pidfiles(tmp_path / "pids") == []
        assert launcher.running() == []
    log = (tmp_path / "server.log").read_text()
    assert "===== harness: start fake" in log and f"fake server pid {pid}" in log


def test_restart_appends_to_log_with_marker(tmp_path):
    with LocalLauncher() as launcher:
        for _ in range(2):
            launcher.start(fake_spec(tmp_path, probe=False)).stop(grace_s=5)
    log = (tmp_path / "server.log").read_text()
    assert log.count("===== harness: start fake") == 2


@pytest.mark.timeout(60)  # far below the 120 s ready timeout: an early exit stops the wait at once
def test_early_exit_fails_at_once_with_log_tail(tmp_path):
    spec = fake_spec(tmp_path, "--exit-after-s", "0.3", "--exit-code", "7", timeout_s=120)
    with LocalLauncher() as launcher, pytest.raises(ServerStartError) as err:
        launcher.start(spec)
    assert "exited with code 7" in err.value.reason
    assert any("exiting with code 7 on purpose" in line for line in err.value.log_tail)
    assert "exiting with code 7 on purpose" in str(err.value)
    assert isinstance(err.value, HarnessError)
    assert read_pidfiles(tmp_path / "pids") == []


def test_never_ready_times_out_with_log_tail(tmp_path):
    pid_file = tmp_path / "pids.json"
    with LocalLauncher() as launcher, pytest.raises(ServerStartError) as err:
        launcher.start(fake_spec(tmp_path, "--never-ready", "--pid-file", str(pid_file), timeout_s=2))
    assert "not ready after 2 s" in err.value.reason and "/health answered 503" in err.value.reason
    assert any("fake server pid" in line for line in err.value.log_tail)
    assert not running(json.loads(pid_file.read_text())["server"])
    assert launcher.running() == [] and read_pidfiles(tmp_path / "pids") == []


def test_health_alone_is_not_ready(tmp_path):
    # a broken model answers /health; the real probe request is what catches it
    with LocalLauncher() as launcher, pytest.raises(ServerStartError) as err:
        launcher.start(fake_spec(tmp_path, "--broken-completions", timeout_s=2))
    assert "probe chat completion answered 500" in err.value.reason
    with LocalLauncher() as launcher:
        handle = launcher.start(fake_spec(tmp_path, "--broken-completions", probe=False))
        assert handle.healthy()


def test_wrong_served_model_is_not_ready(tmp_path):
    spec = fake_spec(tmp_path, timeout_s=1.5)
    spec = ServerSpec(**{**spec.__dict__, "served_model_name": "other"})
    with LocalLauncher() as launcher, pytest.raises(ServerStartError, match="not 'other'"):
        launcher.start(spec)


def test_missing_executable_is_a_clear_error(tmp_path):
    spec = ServerSpec(name="nope", argv=[str(tmp_path / "no-such-server")], env={}, host="127.0.0.1", port=0,
                      log_path=tmp_path / "server.log", ready_timeout_s=5, gpus=0, served_model_name="x",
                      pid_dir=tmp_path / "pids")
    with LocalLauncher() as launcher, pytest.raises(ServerStartError, match="cannot run"):
        launcher.start(spec)


def test_stop_kills_children_that_ignore_sigterm_and_removes_their_shm(tmp_path):
    pid_file = tmp_path / "pids.json"
    shm = Path(f"/dev/shm/psm_hisparse_test_{uuid.uuid4().hex[:8]}")
    spec = fake_spec(tmp_path, "--spawn-children", "2", "--ignore-sigterm", "--pid-file", str(pid_file),
                     "--child-shm", str(shm))
    with LocalLauncher() as launcher:
        handle = launcher.start(spec)
        pids = wait_for_file(pid_file)
        tree = [pids["server"], *pids["children"]]
        assert all(running(p) for p in tree)
        deadline = time.monotonic() + 10
        while not shm.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        handle.stop(grace_s=1)
    assert [p for p in tree if running(p)] == []
    assert not accepts(handle.port)
    assert not shm.exists()


def test_stop_finds_children_that_left_the_session(tmp_path):
    pid_file = tmp_path / "pids.json"
    spec = fake_spec(tmp_path, "--spawn-children", "1", "--child-setsid", "--pid-file", str(pid_file), stop_grace_s=1)
    with LocalLauncher() as launcher:
        handle = launcher.start(spec)
        pids = wait_for_file(pid_file)
        child = pids["children"][0]
        deadline = time.monotonic() + 10
        while os.getsid(child) == handle.pid:  # wait until the child has left the session
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert not running(pids["server"]) and not running(child)


_HARNESS_SCRIPT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from harness.servers.base import ServerSpec
    from harness.servers.local import LocalLauncher
    tmp = Path(sys.argv[1])
    spec = ServerSpec(name="orphan", argv=[sys.executable, sys.argv[2], "--port", "{port}", "--model", "m",
                                           "--spawn-children", "1", "--pid-file", str(tmp / "pids.json")],
                      env={}, host="127.0.0.1", port=0, log_path=tmp / "server.log", ready_timeout_s=20,
                      gpus=0, served_model_name="m", pid_dir=tmp / "pids")
    LocalLauncher().start(spec)
    (tmp / "ready").write_text("1")
    time.sleep(600)
""")


def test_reaper_stops_servers_of_a_killed_harness(tmp_path):
    harness_proc = subprocess.Popen([sys.executable, "-c", _HARNESS_SCRIPT, str(tmp_path), str(FAKE)],
                                    cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists():
            assert harness_proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        pids = json.loads((tmp_path / "pids.json").read_text())
        (path, record), = read_pidfiles(tmp_path / "pids")
        assert record.pid == pids["server"] and record.harness_pid == harness_proc.pid
        # while its harness lives, the server is not stale
        assert reap_stale_servers(tmp_path / "pids") == []
        assert running(record.pid)
    finally:
        harness_proc.send_signal(signal.SIGKILL)
        harness_proc.wait()
    # The server dies with its harness (the parent-death signal of its start wrapper); its children, which
    # ignore SIGTERM and have no such signal, are left in its session: that is what the reaper is for.
    deadline = time.monotonic() + 15
    while running(record.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(record.pid)
    assert pids["children"] and all(running(c) for c in pids["children"])
    reaped = reap_stale_servers(tmp_path / "pids", grace_s=1)
    assert [r.record.pid for r in reaped] == [record.pid] and reaped[0].teardown.clean
    assert not running(record.pid) and not any(running(c) for c in pids["children"])
    assert read_pidfiles(tmp_path / "pids") == []


def test_reaper_leaves_recycled_pids_alone(tmp_path):
    # a pidfile whose pids match live processes with other start times names nobody alive
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = {"name": "x", "pid": bystander.pid, "pgid": bystander.pid, "start_ticks": 1, "argv_head": [],
                  "host": "127.0.0.1", "port": 1, "log_path": "", "harness_pid": 999999999,
                  "harness_start_ticks": 1, "created_unix_s": 0.0}
        (tmp_path / "pids").mkdir()
        (tmp_path / "pids" / "x-1.json").write_text(json.dumps(record))
        (tmp_path / "pids" / "garbage.json").write_text("{not json")
        assert reap_stale_servers(tmp_path / "pids") == []
        assert running(bystander.pid)
        assert read_pidfiles(tmp_path / "pids") == []
    finally:
        bystander.kill()
        bystander.wait()


def test_reaper_judges_only_its_own_hosts_pidfiles_of_this_boot(tmp_path):
    # pid dirs may sit on a home directory shared by several machines: a live process named by another
    # host's pidfile is not this host's to stop, and its file stays; a file from an earlier boot of this
    # host names nothing that runs now, so it goes, and the live pid it happens to name is left alone
    orphan_owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        info = proc_info(orphan_owner.pid)
        base = {"name": "x", "pid": orphan_owner.pid, "pgid": orphan_owner.pid, "start_ticks": info.start_ticks,
                "argv_head": [], "host": "127.0.0.1", "port": 1, "log_path": "", "harness_pid": 999999999,
                "harness_start_ticks": 1, "created_unix_s": 0.0}
        pids = tmp_path / "pids"
        pids.mkdir()
        (pids / "other-host.json").write_text(json.dumps({**base, "hostname": "another-machine", "boot_id": "b"}))
        (pids / "earlier-boot.json").write_text(json.dumps({**base, "hostname": socket.gethostname(),
                                                            "boot_id": "not-" + boot_id()}))
        assert reap_stale_servers(pids, grace_s=1) == []
        assert running(orphan_owner.pid)  # neither file's reaper may stop it
        assert [path.name for path, _ in read_pidfiles(pids)] == ["other-host.json"]
        # the same record written on this host, this boot, by a harness that is gone: reaped
        (pids / "here.json").write_text(json.dumps({**base, "hostname": socket.gethostname(), "boot_id": boot_id()}))
        assert [r.record.pid for r in reap_stale_servers(pids, grace_s=1)] == [orphan_owner.pid]
        assert [path.name for path, _ in read_pidfiles(pids)] == ["other-host.json"]
    finally:
        orphan_owner.kill()
        orphan_owner.wait()


def test_signal_guard_stops_servers(tmp_path):
    launcher = LocalLauncher()
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt) as err:
        with stop_servers_on_signal(launcher):
            handle = launcher.start(fake_spec(tmp_path, probe=False))
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            pytest.fail("the signal did not interrupt")
    assert getattr(err.value, "signum", None) == signal.SIGTERM
    assert not running(handle.pid) and launcher.running() == []
    assert signal.getsignal(signal.SIGTERM) is before


def test_log_tail_reads_the_end(tmp_path):
    log = tmp_path / "big.log"
    log.write_text("".join(f"line {i}\n" for i in range(100_000)))
    assert read_log_tail(log, 3) == ["line 99997", "line 99998", "line 99999"]
    assert read_log_tail(tmp_path / "missing.log") == []


def test_interrupt_during_a_threaded_start_leaves_no_server(tmp_path):
    launcher = LocalLauncher()
    pid_file = tmp_path / "pids.json"
    errors: list[ServerStartError] = []

    def start() -> None:
        try:
            launcher.start(fake_spec(tmp_path, "--never-ready", "--pid-file", str(pid_file), timeout_s=120,
                                     stop_grace_s=2))
        except ServerStartError as exc:
            errors.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    server_pid = wait_for_file(pid_file)["server"]
    with pytest.raises(KeyboardInterrupt), stop_servers_on_signal(launcher):
        raise KeyboardInterrupt  # as the signal handler would, in the main thread
    thread.join(timeout=60)
    assert not thread.is_alive() and len(errors) == 1 and "before it was ready" in errors[0].reason
    assert not running(server_pid) and launcher.running() == []
    with pytest.raises(LauncherClosed, match="shutting down"):
        launcher.start(fake_spec(tmp_path))
    assert read_pidfiles(tmp_path / "pids") == []


def test_a_port_in_use_is_refused_before_start(tmp_path):
    with LocalLauncher() as launcher:
        first = launcher.start(fake_spec(tmp_path, probe=False))
        spec = ServerSpec(**{**fake_spec(tmp_path, name="second").__dict__, "port": first.port})
        with pytest.raises(ServerStartError, match=f"port {first.port} on 127.0.0.1 is already in use"):
            launcher.start(spec)
        assert first.healthy() and [h.name for h in launcher.running()] == ["fake"]


def test_a_server_runs_at_normal_priority_whatever_its_starter_runs_at():
    # A Ray worker starts at niceness 15: a server started from one used to inherit it and yield the CPU to
    # the client and every other normal process on the node. The wrapper every server starts through sets 0.
    show = ["sh", "-c", "cut -d' ' -f19 /proc/self/stat"]
    kept = subprocess.run(["nice", "-n", "15", *die_with_parent(show)], capture_output=True, text=True, check=True)
    assert kept.stdout.strip() == "15"
    raised = subprocess.run(["nice", "-n", "15", *die_with_parent(show, niceness=0)], capture_output=True, text=True,
                            check=True)
    if os.geteuid() == 0:
        assert (raised.stdout.strip(), raised.stderr) == ("0", "")
    else:  # raising priority needs CAP_SYS_NICE: the program still runs, and says what it kept
        assert raised.stdout.strip() == "15" and "cannot set niceness 0 (kept 15)" in raised.stderr


@pytest.mark.slow  # waits the 20 s it is about
def test_a_server_slower_to_exit_than_the_old_15_s_is_given_its_grace_not_killed(tmp_path):
    """A server that takes 20 s after SIGTERM (as one unpinning its host pools would) with a 30 s grace is
    waited for: nothing is signalled beyond it and nothing is killed; the stop says how long it took."""
    spec = dataclasses.replace(fake_spec(tmp_path, "--exit-delay-s", "20"), stop_grace_s=30)
    with LocalLauncher() as launcher:
        handle = launcher.start(spec)
        pid = handle.pid
        teardown = handle.stop()  # no grace given: the spec's
    assert teardown.grace_s == 30 and teardown.exited_in_grace and teardown.pids_killed == []
    assert 19 <= teardown.duration_s < 30 and not running(pid)
    assert "fake server: released, exiting" in (tmp_path / "server.log").read_text()
