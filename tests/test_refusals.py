"""What vLLM refuses HiSparse only after loading the weights is refused before anything starts, one line
each (harness/servers/preflight.py, docs/facts.md §2), with the pinned host memory counted per node for
the executor vLLM will use; HiSparse options are checked against the dialect the plan resolved."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.config import ConfigError, LaunchProfile, load_sweep
from harness.plan import make_plan
from harness.servers.preflight import hisparse_start_refusals, pinned_memory, run_preflight

ROOT = Path(__file__).resolve().parents[1]
BLOG_ARM = yaml.safe_load((ROOT / "launch/glm53-hisparse.yaml").read_text())


def arm(serve: dict | None = None, **top) -> LaunchProfile:
    data = {**BLOG_ARM, **top, "serve": {**BLOG_ARM["serve"], **(serve or {})}}
    return LaunchProfile.model_validate(data)


def test_the_blog_arm_passes_and_pins_512_gib_on_its_node():
    pinned = pinned_memory(arm())
    assert (pinned.executor, pinned.hisparse_pools, pinned.per_node_gib) == ("mp", 1, 512.0)
    assert hisparse_start_refusals(arm(), 2048) == []


@pytest.mark.parametrize("profile,expected", [
    (arm({"pipeline_parallel_size": 2}), "pipeline_parallel_size 2: vLLM refuses HiSparse"),
    (arm(extra_args=["--decode-context-parallel-size", "2"]), "decode_context_parallel_size 2"),
    (arm({"compilation_config": {"cudagraph_mode": "FULL"}}), "cudagraph_mode FULL"),
    (arm(extra_args=["--compilation-config", '{"cudagraph_mode":"FULL"}']), "cudagraph_mode FULL"),
    (arm({"max_model_len": 142000}, kv={"hisparse": {"host_pool_gib": 1}}),
     "kv.hisparse.host_pool_gib 1 holds 327 blocks but max_model_len 142000 needs ceil(142000/64) + 2 = 2221"),
    # under Ray every TP rank pins its own pool: 8 x 2,000 GiB on a 2,048 GiB host
    (arm({"distributed_executor_backend": "ray"}, kv={"hisparse": {"host_pool_gib": 2000}}),
     "16000 GiB pinned per node (executor ray: one HiSparse pool per TP rank, 8 on a node)"),
])
def test_each_refusal_is_one_line(profile, expected):
    problems = hisparse_start_refusals(profile, 2048)
    assert len(problems) == 1 and expected in problems[0] and "\n" not in problems[0]


def test_full_and_piecewise_graphs_and_a_plain_arm_are_not_refused():
    assert hisparse_start_refusals(arm({"compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}}), 2048) == []
    plain = arm({"pipeline_parallel_size": 2}, kv={"offload": {"cpu_bytes": "512GiB"}})
    assert hisparse_start_refusals(plain, 2048) == []  # no HiSparse: pipeline parallel is vLLM's business


def test_ray_multiplies_the_pool_by_the_tp_ranks_that_share_a_node():
    ray = arm(extra_args=["--distributed-executor-backend", "ray"])
    assert pinned_memory(ray).per_node_gib == 8 * 384 + 128
    two_nodes = arm(extra_args=["--nnodes", "2"])
    assert pinned_memory(two_nodes).hisparse_pools == 4 and pinned_memory(two_nodes).per_node_gib == 4 * 384 + 128
    assert "exceed 95%" in hisparse_start_refusals(ray, 2048)[0]


def _sweep_with(tmp_path: Path, **profile_changes) -> Path:
    text = yaml.safe_load((ROOT / "launch/glm53-hisparse.yaml").read_text())
    for key, value in profile_changes.items():
        if key == "serve":
            text["serve"].update(value)
        else:
            text[key] = value
    (tmp_path / "arm.yaml").write_text(yaml.safe_dump(text))
    sweep = yaml.safe_load((ROOT / "sweeps/tp8.yaml").read_text())
    sweep["dataset"] = str(ROOT / "datasets/openhands-glm53.yaml")
    sweep["deployments"] = [{"name": "arm", "launch": "arm.yaml"}]
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    return tmp_path / "sweep.yaml"


def test_plan_refuses_in_one_line_before_anything_starts(tmp_path):
    sweep = _sweep_with(tmp_path, serve={"tensor_parallel_size": 4, "pipeline_parallel_size": 2})
    with pytest.raises(ConfigError, match="pipeline_parallel_size 2"):
        make_plan(load_sweep(sweep))
    done = subprocess.run([sys.executable, "-m", "harness", "plan", str(sweep)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "arm.yaml: kv.hisparse: pipeline_parallel_size 2" in done.stderr


def test_dialect_options_are_checked_after_auto_resolves_them(tmp_path):
    # dialect auto on the blog branch resolves to blog-branch, which has no device_buffer_size
    sweep = _sweep_with(tmp_path, kv={"hisparse": {"host_pool_gib": 384, "device_buffer_size": 8192}})
    with pytest.raises(ConfigError, match="device_buffer_size is a released-vLLM setting.*dialect blog-branch"):
        make_plan(load_sweep(sweep))


def test_preflight_counts_this_host_for_the_executor(tmp_path):
    report = run_preflight("arm", arm(extra_args=["--distributed-executor-backend", "ray"],
                                      kv={"hisparse": {"host_pool_gib": 2000}}), 0, tmp_path, tmp_path / "p.json")
    assert not report.ok and report.executor == "ray" and report.pinned_pools_gib == 16000.0
