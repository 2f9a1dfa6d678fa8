"""`harness capacity` against a real vLLM on CPU (sweeps/cpu-capacity.yaml): the tiny model with 24 blocks of
KV at three contexts. The two that fit are searched and land within one request of vLLM's own logged
`Maximum concurrency`; the third is refused by vLLM at start-up and recorded as `does not fit` in vLLM's
words, with no traceback from the harness and no process left behind. Select alone with
`python -m pytest -m cpu_vllm`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cpu_vllm_run import vllm_processes

pytestmark = [pytest.mark.slow, pytest.mark.cpu_vllm, pytest.mark.vllm_server]

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(1500)  # builds the vLLM CPU environment first where no earlier test has (about 2.5 min)
def test_capacity_on_vllm_cpu_matches_its_logged_bound_and_records_what_does_not_fit(tmp_path):
    before = {pid for pid, _ in vllm_processes()}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "harness", "capacity", "sweeps/cpu-capacity.yaml", "--launcher",
                           "local", "--run-id", "cap", "--results-dir", str(tmp_path / "results")],
                          cwd=ROOT, capture_output=True, text=True, timeout=1400)
    wall_s = time.monotonic() - started
    print(done.stdout[-3000:], f"\ncapacity on vLLM CPU: {wall_s:.0f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr

    report = json.loads((tmp_path / "results" / "cap" / "capacity.json").read_text())
    by_context = {r["context_tokens"]: r for r in report["results"]}
    assert sorted(by_context) == [200, 700, 3000]
    for context in (200, 700):
        r = by_context[context]
        assert r["status"] == "measured", r
        assert r["logged_max_concurrency"] is not None, r  # vLLM's start-up line, however long the server ran
        assert abs(r["capacity"] - r["logged_max_concurrency"]) <= 1, r
        assert r["first_failing"] == r["capacity"] + 1, r  # bracketed: the next concurrency did not all run
    refused = by_context[3000]
    assert refused["status"] == "does_not_fit", refused
    assert refused["does_not_fit_reason"].startswith("To serve at least one request with the model's max seq len")
    assert refused["estimated_max_len"] and refused["estimated_max_len"] < refused["max_model_len"]
    assert "does not fit" in done.stdout

    report_md = (tmp_path / "results" / "cap" / "report.md").read_text()
    assert "## Capacity against context length" in report_md and "**does not fit**" in report_md

    # no server of this run is left, and no vLLM process was orphaned (another run's servers may be up)
    manifest = json.loads((tmp_path / "results" / "cap" / "manifest.json").read_text())
    ours = {d["server_pid"] for d in manifest["deployments"].values() if d.get("server_pid")}
    ports = {d["base_url"].rsplit(":", 1)[1] for d in manifest["deployments"].values() if d.get("base_url")}
    assert len(ours) == len(ports) == 2  # the third context's server was refused before it was ready

    def left() -> list[tuple[int, str]]:
        return [(pid, cmd) for pid, cmd in vllm_processes() if pid not in before and (
            pid in ours or any(f"--port {port}" in cmd for port in ports) or _parent(pid) == 1)]

    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left(), f"vLLM processes left after the capacity run: {left()}"


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
