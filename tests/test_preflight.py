"""Preflight: what would make a server fail minutes later is said before it starts."""

from __future__ import annotations

import json

from harness.config import LaunchProfile
from harness.provenance import host_ram_gib
from harness.servers.preflight import run_preflight


def _profile(cpu_bytes: str) -> LaunchProfile:
    return LaunchProfile.model_validate({
        "engine": "vllm", "build": "==0.33.0", "serve": {"model": "m"},
        "kv": {"hisparse": {"host_pool_gib": 1}, "offload": {"cpu_bytes": cpu_bytes}}})


def test_pinned_pools_above_95_percent_of_ram_are_refused(tmp_path):
    ram = host_ram_gib()
    assert ram
    out = tmp_path / "preflight.json"
    report = run_preflight("arm", _profile(f"{int(ram)}GiB"), 0, tmp_path, out)
    assert not report.ok
    assert "exceed 95%" in report.problems[0] and "vLLM refuses to start" in report.problems[0]
    written = json.loads(out.read_text())
    assert written["problems"] == report.problems and written["pinned_pools_gib"] == int(ram) + 1


def test_small_pools_pass_and_remote_servers_are_not_judged_by_this_host(tmp_path):
    assert run_preflight("arm", _profile("1GiB"), 0, tmp_path, tmp_path / "a.json").ok
    # on a multi-node Ray cluster the server runs elsewhere: this host's RAM says nothing
    assert run_preflight("arm", _profile("100TiB"), 0, tmp_path, tmp_path / "b.json",
                         server_on_this_host=False).ok
