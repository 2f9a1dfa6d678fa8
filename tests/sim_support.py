"""Helpers for the simulated-engine tests: write a launch profile, start `harness serve-sim` on a free
port as a real subprocess, and stop it by pid."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]

BASE_PROFILE: dict[str, Any] = {
    "engine": "sim",
    "serve": {"model": "zai-org/GLM-5.3", "served_model_name": "glm-agentx", "tensor_parallel_size": 8,
              "kv_cache_dtype": "fp8", "max_model_len": 8192, "max_num_batched_tokens": 32768,
              "max_num_seqs": 256, "enable_prefix_caching": True},
    "speculative": {"method": "mtp", "num_speculative_tokens": 3},
    "sim": {"kv_pool_tokens": 12288, "index_topk": 128, "seed": 0},
}


def profile(**changes: Any) -> dict[str, Any]:
    """BASE_PROFILE with top-level keys replaced (None removes) and `sim` merged."""
    out = json.loads(json.dumps(BASE_PROFILE))
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        elif key == "sim":
            out["sim"] = {**out["sim"], **value}
        else:
            out[key] = value
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SimProcess:
    def __init__(self, proc: subprocess.Popen, url: str, log_path: Path):
        self.proc = proc
        self.url = url
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_listening(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve-sim exited rc={self.proc.returncode}:\n{self.log()}")
            if "sim: serving" in self.log():
                return
            time.sleep(0.1)
        raise AssertionError(f"serve-sim did not start listening:\n{self.log()}")

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        self.wait_listening(timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"serve-sim never healthy:\n{self.log()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@contextmanager
def sim_server(tmp_path: Path, launch: dict[str, Any], name: str = "sim", wait_healthy: bool = True):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(launch))
    port = free_port()
    log_path = tmp_path / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "harness", "serve-sim", "--launch", str(path),
                                 "--host", "127.0.0.1", "--port", str(port)],
                                cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    server = SimProcess(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        if wait_healthy:
            server.wait_healthy()
        yield server
    finally:
        server.stop()


def chat_body(content: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "glm-agentx", "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, **extra}


def read_sse(response: requests.Response) -> list[Any]:
    """The `data:` payloads of an SSE response, JSON-decoded except the final [DONE]."""
    events: list[Any] = []
    for line in response.iter_lines(decode_unicode=True):
        if not line or not line.startswith("data: "):
            continue
        payload = line[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
