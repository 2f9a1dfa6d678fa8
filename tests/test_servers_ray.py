"""Ray launcher against a real local Ray cluster with 2 fake GPUs (one session for the module)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from harness.errors import HarnessError  # noqa: E402
from harness.servers.base import PreparedServer, ServerSpec, ServerStartError  # noqa: E402
from harness.servers.ray_launcher import RayLauncher  # noqa: E402
from harness.servers.reaper import read_pidfiles  # noqa: E402

pytestmark = pytest.mark.slow

from procutil import accepts, running  # noqa: E402

FAKE = Path(__file__).parent / "fixtures" / "servers" / "fake_openai.py"


def fake_spec(tmp_path: Path, *extra: str, name: str = "fake", gpus: int = 1, timeout_s: float = 20) -> ServerSpec:
    return ServerSpec(name=name, argv=[sys.executable, str(FAKE), "--host", "{host}", "--port", "{port}",
                                       "--model", "served", *extra],
                      env={}, host="127.0.0.1", port=0, log_path=tmp_path / f"{name}.log",
                      ready_timeout_s=timeout_s, gpus=gpus, served_model_name="served", pid_dir=tmp_path / "pids",
                      stop_grace_s=2)






def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def wait_gpus_free(expected: float = 2, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("GPU", 0) < expected:
        assert time.monotonic() < deadline, f"GPUs not released: {ray.available_resources()}"
        time.sleep(0.1)


_INTERRUPTED_DRIVER = """
import sys
from pathlib import Path
from harness.servers.base import ServerSpec, stop_servers_on_signal
from harness.servers.ray_launcher import RayLauncher
tmp, fake = Path(sys.argv[1]), sys.argv[2]
spec = ServerSpec(name="slow", argv=[sys.executable, fake, "--port", "{port}", "--never-ready", "--spawn-children",
                                     "1", "--pid-file", str(tmp / "pids.json")],
                  env={}, host="127.0.0.1", port=0, log_path=tmp / "slow.log", ready_timeout_s=600, gpus=1,
                  served_model_name="m", pid_dir=tmp / "pids", stop_grace_s=2)
launcher = RayLauncher(num_gpus=1, num_cpus=2, object_store_memory_bytes=80 * 1024**2, temp_dir=Path(sys.argv[3]))
with launcher, stop_servers_on_signal(launcher):
    launcher.start(spec)
"""


@pytest.mark.timeout(120)
def test_sigint_while_waiting_for_readiness_stops_the_server(tmp_path):
    # runs before the module's Ray session starts (file order), in a driver of its own
    temp_dir = Path(tempfile.mkdtemp(prefix="hsi", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    driver = subprocess.Popen([sys.executable, "-c", _INTERRUPTED_DRIVER, str(tmp_path), str(FAKE), str(temp_dir)],
                              env=env, cwd=env["PYTHONPATH"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "pids.json").exists():
            assert driver.poll() is None, driver.stdout.read().decode()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        pids = json.loads((tmp_path / "pids.json").read_text())
        time.sleep(0.5)  # the driver is now blocked in ray.get on the readiness wait
        driver.send_signal(signal.SIGINT)
        output = driver.communicate(timeout=60)[0].decode()
    finally:
        if driver.poll() is None:
            driver.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)
    # inside ray.get, Ray turns the handler's ServerInterrupt into a plain KeyboardInterrupt
    assert driver.returncode != 0 and "KeyboardInterrupt" in output, output
    assert not running(pids["server"]) and not any(running(c) for c in pids["children"])
    assert read_pidfiles(tmp_path / "pids") == []


@pytest.fixture(scope="module")
def launcher():
    saved = os.environ.pop("RAY_ADDRESS", None)
    if ray.is_initialized():
        ray.shutdown()
    temp_dir = Path(tempfile.mkdtemp(prefix="hsr", dir="/tmp"))  # short: Ray's socket paths are limited
    ray_launcher = RayLauncher(num_gpus=2, num_cpus=4, object_store_memory_bytes=80 * 1024**2,
                               temp_dir=temp_dir, placement_timeout_s=3)
    try:
        yield ray_launcher
    finally:
        ray_launcher.close()
        assert not ray.is_initialized()
        shutil.rmtree(temp_dir, ignore_errors=True)
        if saved is not None:
            os.environ["RAY_ADDRESS"] = saved


def test_server_in_actor_gets_a_gpu_and_stops_clean(launcher, tmp_path):
    assert (launcher.nodes_for(1), launcher.nodes_for(2), launcher.nodes_for(3)) == (1, 1, 0)
    pid_file = tmp_path / "pids.json"
    handle = launcher.start(fake_spec(tmp_path, "--spawn-children", "1", "--pid-file", str(pid_file)))
    pids = json.loads(pid_file.read_text())
    assert pids["server"] == handle.pid and handle.node_id
    assert handle.cuda_visible_devices in ("0", "1")
    assert environ_of(handle.pid)["CUDA_VISIBLE_DEVICES"] == handle.cuda_visible_devices
    assert os.getsid(handle.pid) == handle.pid  # its own session, outside the actor's group
    # the server runs at normal priority, its children too, although Ray starts its actor at niceness 15
    assert os.getpriority(os.PRIO_PROCESS, handle.pid) == 0
    assert all(os.getpriority(os.PRIO_PROCESS, child) == 0 for child in pids["children"])
    assert handle.healthy() and handle.alive()
    assert any("fake server pid" in line for line in handle.log_tail())
    assert [r.pid for _, r in read_pidfiles(tmp_path / "pids")] == [handle.pid]
    handle.stop(grace_s=2)
    assert not running(handle.pid) and not any(running(c) for c in pids["children"])
    assert not accepts(handle.port) and not handle.alive()
    assert read_pidfiles(tmp_path / "pids") == [] and launcher.running() == []
    wait_gpus_free()


def test_two_servers_get_different_gpus_and_a_third_waits_then_fails(launcher, tmp_path):
    first = launcher.start(fake_spec(tmp_path, name="a"))
    second = launcher.start(fake_spec(tmp_path, name="b"))
    assert {first.cuda_visible_devices, second.cuda_visible_devices} == {"0", "1"}
    with pytest.raises(ServerStartError, match="not placed within 3 s"):
        launcher.start(fake_spec(tmp_path, name="c"))
    launcher.stop_all()
    assert not running(first.pid) and not running(second.pid) and launcher.running() == []
    wait_gpus_free()


def test_impossible_placement_fails_clearly(launcher, tmp_path):
    with pytest.raises(ServerStartError) as err:
        launcher.start(fake_spec(tmp_path, gpus=4))
    assert "no Ray node has 4 GPU(s)" in str(err.value) and "largest node: 2 GPU(s)" in str(err.value)
    wait_gpus_free()


def test_early_exit_in_actor_reports_log_tail(launcher, tmp_path):
    with pytest.raises(ServerStartError) as err:
        launcher.start(fake_spec(tmp_path, "--exit-after-s", "0.2", "--exit-code", "5", timeout_s=120))
    assert "exited with code 5" in err.value.reason
    assert any("exiting with code 5 on purpose" in line for line in err.value.log_tail)
    assert launcher.running() == []
    wait_gpus_free()


def test_never_ready_in_actor_times_out(launcher, tmp_path):
    with pytest.raises(ServerStartError, match=r"not ready after 1\.5 s \(/health answered 503\)"):
        launcher.start(fake_spec(tmp_path, "--never-ready", timeout_s=1.5))
    wait_gpus_free()


def test_stop_after_ray_kill_leaves_nothing(launcher, tmp_path):
    # docs/facts.md §7: ray.kill(actor) need not take the server (its own session) with it.
    # Whether it survives depends on Ray's child-process reaping and timing; either way the
    # handle's stop() must leave nothing behind.
    handle = launcher.start(fake_spec(tmp_path))
    try:
        ray.kill(handle._actor, no_restart=True)
        deadline = time.monotonic() + 10
        while handle.alive():  # alive() asks the actor, which is going away
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        handle.stop(grace_s=2)  # the actor is gone: stopped from the driver, same node
    assert not running(handle.pid) and not accepts(handle.port)
    wait_gpus_free()


@pytest.mark.timeout(60)  # ray.init() against a dead address would hang for minutes
def test_ray_address_pointing_at_nothing_fails_fast(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    with pytest.raises(HarnessError) as err:
        RayLauncher()
    message = str(err.value)
    assert "RAY_ADDRESS=127.0.0.1:1" in message and "no Ray cluster answers" in message
    assert "\n" not in message
    monkeypatch.setenv("RAY_ADDRESS", "not-an-address")
    with pytest.raises(HarnessError, match="is not host:port"):
        RayLauncher()


def test_missing_executable_in_actor_is_a_clear_error(launcher, tmp_path):
    spec = ServerSpec(name="nope", argv=[str(tmp_path / "no-such-server")], env={}, host="127.0.0.1", port=0,
                      log_path=tmp_path / "nope.log", ready_timeout_s=5, gpus=1, served_model_name="x",
                      pid_dir=tmp_path / "pids")
    with pytest.raises(ServerStartError) as err:
        launcher.start(spec)
    assert "cannot run" in err.value.reason and "no-such-server" in err.value.reason
    wait_gpus_free()


def _prepare_ok(overlay: str) -> PreparedServer:
    # runs inside the actor, on the server's node: where a vLLM build (and the bundled kernels' folder,
    # which reaches the server through PYTHONPATH) would be made
    return PreparedServer(python=sys.executable, provenance={"built_on": ray.get_runtime_context().get_node_id()},
                          env={"PYTHONPATH": overlay})


def _prepare_fails() -> PreparedServer:
    raise HarnessError("build vllm==9.9.9: no such version")


# the actor unpickles these by value: Ray workers need not import this test module
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_the_server_node_prepares_its_build_first(launcher, tmp_path):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    marker = tmp_path / "prepared-env-seen"
    (overlay / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    spec = replace(fake_spec(tmp_path), prepare=functools.partial(_prepare_ok, str(overlay)))
    handle = launcher.start(spec)
    try:
        assert handle.build_provenance == {"built_on": handle.node_id}
        assert handle.healthy()
        assert marker.exists()  # the environment the node's preparation gave reached the server process
    finally:
        handle.stop(grace_s=2)
    wait_gpus_free()


def test_a_failed_node_preparation_is_a_start_error_and_frees_the_gpus(launcher, tmp_path):
    with pytest.raises(ServerStartError, match="preparing the node failed: build vllm==9.9.9"):
        launcher.start(replace(fake_spec(tmp_path), prepare=_prepare_fails))
    assert not (tmp_path / "fake.log").exists() or "exiting" not in (tmp_path / "fake.log").read_text()
    wait_gpus_free()
