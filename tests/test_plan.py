"""`harness plan` on the blog's sweep: exact server flags per dialect, offsets, dataset need."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from harness.config import load_sweep
from harness.plan import make_plan, point_offsets

ROOT = Path(__file__).resolve().parents[1]

# The blog appendix's serve command for the Hybrid HiSparse arm (docs/facts.md §1), verbatim.
BLOG_HISPARSE = r"""vllm serve zai-org/GLM-5.3 --served-model-name glm-agentx --trust-remote-code --host 0.0.0.0
  --port 8000 --tensor-parallel-size 8 --kv-cache-dtype fp8 --gpu-memory-utilization 0.92
  --max-model-len 142000 --max-num-batched-tokens 32768 --max-num-seqs 256 --enable-prefix-caching
  --attention-config '{"hisparse_config":{"host_pool_gib":384}}'
  --kv-transfer-config '{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":137438953472}}'
  --speculative-config '{"method":"mtp","num_speculative_tokens":3}'
  --enable-auto-tool-choice --tool-call-parser glm47 --reasoning-parser glm45"""


def _blog_baseline() -> str:
    # the appendix: keep --speculative-config, drop --attention-config, 512 GiB offload pool
    text = BLOG_HISPARSE.replace("""  --attention-config '{"hisparse_config":{"host_pool_gib":384}}'\n""", "")
    return text.replace("137438953472", "549755813888")


def flag_pairs(argv: list[str]) -> set[tuple[str, str]]:
    """A command as a set of (flag, value) pairs; JSON values compared as JSON."""
    pairs: set[tuple[str, str]] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            value = ""
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value = argv[i + 1]
                i += 1
            if value.startswith("{"):
                value = json.dumps(json.loads(value), sort_keys=True)
            pairs.add((arg, value))
        else:
            pairs.add(("<positional>", arg))
        i += 1
    return pairs


def serve_argv(argv: list[str], model: str | None = None) -> list[str]:
    """`vllm serve MODEL ...` whatever program starts it (the plan names the build's interpreter); a
    fetched model's `{model}` placeholder (its path on the server's node) read as `model`."""
    rest = argv[argv.index("serve") + 1:]
    return ["vllm", "serve", *[model if model and arg == "{model}" else arg for arg in rest]]


def _plan_json(*extra: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "harness", "plan", "sweeps/tp8.yaml", "--json", *extra],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_blog_branch_commands_carry_exactly_the_blog_flags():
    plan = _plan_json()
    by_name = {d["name"]: d for d in plan["deployments"]}
    hisparse = by_name["tp8-hisparse384-native128"]
    baseline = by_name["tp8-offload512"]
    assert hisparse["dialect"] == "blog-branch"
    # GLM-5.3 is fetched onto each server's node first (at the pinned commit); the server loads that copy
    assert hisparse["weights"] == baseline["weights"] == "hf://zai-org/GLM-5.3@aca966e4e02791568aa6a4ced368624b3d897f42"
    model = "zai-org/GLM-5.3"
    assert flag_pairs(serve_argv(hisparse["server_argv"], model)) == flag_pairs(shlex.split(BLOG_HISPARSE))
    assert flag_pairs(serve_argv(baseline["server_argv"], model)) == flag_pairs(shlex.split(_blog_baseline()))
    # the plan resolved the build: the command runs the interpreter of the build's own environment
    assert hisparse["server_argv"][0] == hisparse["build"]["python"]
    assert hisparse["build"]["python"].endswith("/bin/python") and hisparse["build"]["kind"] == "git"


def test_vllm_servers_keep_idle_connections_longer_than_the_client(tmp_path):
    # EvalScope reuses an idle connection for up to 60 s; vLLM's 5 s default closed one under it ("Server
    # disconnected" at the start of a real CPU point). Every vLLM server gets 75 s unless its profile says.
    plan = _plan_json()
    assert {d["server_env"].get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE") for d in plan["deployments"]} == {"75"}
    (tmp_path / "own.yaml").write_text(f"extends: {ROOT / 'launch/tiny-cpu.yaml'}\n"
                                       "env: {VLLM_HTTP_TIMEOUT_KEEP_ALIVE: '300'}\n")
    (tmp_path / "sweep.yaml").write_text(
        f"name: own\ndataset: {ROOT / 'datasets/cpu-tiny.yaml'}\ngpus_per_server: 1\n"
        "client: {model: tiny-llama, max_tokens: 16, points: [{concurrency: 1, conversations: 1}]}\n"
        "deployments: [{name: own, launch: own.yaml}]\n")
    out = subprocess.run([sys.executable, "-m", "harness", "plan", str(tmp_path / "sweep.yaml"), "--json"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["deployments"][0]["server_env"]["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "300"


def test_release_dialect_uses_multiconnector_and_reserve_full_isl():
    plan = _plan_json("--dialect", "release")
    hisparse = next(d for d in plan["deployments"] if d["name"] == "tp8-hisparse384-native128")
    argv = hisparse["server_argv"]
    assert "--scheduler-reserve-full-isl" in argv
    transfer = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert transfer["kv_connector"] == "MultiConnector"
    inner = transfer["kv_connector_extra_config"]["connectors"]
    assert [c["kv_connector"] for c in inner] == ["HiSparseConnector", "OffloadingConnector"]
    assert inner[0]["kv_connector_extra_config"] == {"host_pool_gib": 384}
    assert inner[1]["kv_connector_extra_config"]["cpu_bytes_to_use"] == 137438953472
    if "--attention-config" in argv:
        assert "host_pool_gib" not in argv[argv.index("--attention-config") + 1]
    # forcing release on the blog-branch build is allowed but said
    assert any("dialect release forced" in w for w in plan["warnings"])


def test_points_get_fresh_offsets_and_216_conversations():
    plan = _plan_json()
    for dep in plan["deployments"]:
        offsets = [p["dataset_offset"] for p in dep["points"]]
        assert offsets == [52, 56, 72, 104, 152]
        for p in dep["points"]:
            argv = p["evalscope_argv"]
            assert argv[argv.index("--dataset-offset") + 1] == str(p["dataset_offset"])
            assert "--multi-turn" in argv and argv[argv.index("--max-tokens") + 1] == "220"
            assert json.loads(argv[argv.index("--extra-args") + 1]) == {"ignore_eos": True}
    assert plan["dataset"]["conversations_needed"] == 216
    assert not any("re-send" in w for w in plan["warnings"])


def test_text_plan_is_readable():
    out = subprocess.run([sys.executable, "-m", "harness", "plan", "sweeps/tp8.yaml"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "216 conversations needed" in out
    # the blog's client, pinned and built into its own cached environment, on every arm and point
    assert out.count("-m evalscope.cli.cli perf") == 10
    assert out.count("  client: EvalScope 1.7.0 (pinned 1.7.0") == 2
    assert out.count("  pinned host memory: 512 GiB pinned per node (executor mp") == 2
    assert "c32 (64 conversations, offset 152)" in out


def test_small_dataset_warns_about_reuse(tmp_path):
    # the blog built 128 conversations (docs/facts.md §6): the sweep builds 216 unless the recipe asks for
    # the blog's reuse, and then c32 re-sends 36 warmed ones (c24 wraps onto conversations nobody sent yet)
    (tmp_path / "r.yaml").write_text(
        "name: small\nsource: {kind: hub, id: x/y}\ntokenizer: x/y\nfirst_turn_length: 100\n"
        "subsequent_turn_length: 10\nnum_turns: 2\nconversations: 128\n")
    sweep = (ROOT / "sweeps/tp8.yaml").read_text().replace("../datasets/openhands-glm53.yaml",
                                                           str(tmp_path / "r.yaml"))
    (tmp_path / "s.yaml").write_text(sweep.replace("../launch/", str(ROOT / "launch") + "/"))
    plan = make_plan(load_sweep(tmp_path / "s.yaml"))
    assert plan.dataset.reuse and plan.dataset.conversations_needed == 216
    assert plan.dataset.build_conversations == 216 and plan.dataset.mode == "fresh"
    assert any("re-send" in w for w in plan.warnings)
    fresh_recipe = (tmp_path / "r.yaml").read_text()
    (tmp_path / "r.yaml").write_text(fresh_recipe + "reuse: shared\n")
    shared = make_plan(load_sweep(tmp_path / "s.yaml"))
    assert shared.dataset.build_conversations == 128 and shared.dataset.resends == ((32, 36),)
    assert shared.dataset.mode == "shared" and any("c32 re-sends 36" in w for w in shared.warnings)
    # the old name of the same behaviour still reads, and says so once
    (tmp_path / "r.yaml").write_text(fresh_recipe + "reuse: blog\n")
    err = io.StringIO()
    with redirect_stderr(err):
        old = make_plan(load_sweep(tmp_path / "s.yaml"))
    assert old.dataset == shared.dataset
    assert "r.yaml: deprecated: reuse: `blog` is now `shared`" in err.getvalue()


@pytest.mark.parametrize("base,numbers,expected", [(52, [4, 16, 32, 48, 64], [52, 56, 72, 104, 152]),
                                                   (0, [2], [0])])
def test_point_offsets(base, numbers, expected):
    assert point_offsets(base, numbers) == expected


def test_a_server_pinning_host_memory_gets_a_longer_stop_and_vllm_waits_for_its_workers(tmp_path):
    """The blog arms pin 512 GiB per node: their stop waits 15 s + 0.5 s per GiB after SIGTERM, and vLLM's
    own worker shutdown wait is set to finish inside it; a CPU server keeps the 15 s and vLLM's default."""
    from harness.servers.preflight import stop_grace_for
    from harness.servers.vllm_command import WORKER_SHUTDOWN_ENV

    plan = make_plan(load_sweep(ROOT / "sweeps" / "tp8.yaml"))
    for dep in plan.deployments:
        assert dep.pinned is not None and dep.pinned.per_node_gib == 512
        assert dep.stop_grace_s == stop_grace_for(512) == 271
        assert dep.command.env[WORKER_SHUTDOWN_ENV] == "261"
    cpu = make_plan(load_sweep(ROOT / "sweeps" / "cpu-vllm.yaml"))
    assert all(d.stop_grace_s == 15 and WORKER_SHUTDOWN_ENV not in d.command.env for d in cpu.deployments)
    # a profile may set its own
    launch = tmp_path / "slow.yaml"
    launch.write_text(f"extends: {ROOT}/launch/tiny-cpu.yaml\nstop_grace_s: 90\n")
    sweep = tmp_path / "s.yaml"
    sweep.write_text((ROOT / "sweeps" / "cpu-vllm.yaml").read_text().replace("../datasets/", f"{ROOT}/datasets/")
                     .replace("../launch/", f"{ROOT}/launch/"))
    sweep.write_text(sweep.read_text().replace(f"{ROOT}/launch/tiny-cpu.yaml", str(launch), 1))
    custom = make_plan(load_sweep(sweep))
    assert custom.deployments[0].stop_grace_s == 90
    assert custom.deployments[0].command.env[WORKER_SHUTDOWN_ENV] == "80"


def test_an_arm_runs_only_its_own_concurrencies_on_the_same_conversations(tmp_path):
    sweep = (ROOT / "sweeps/tp8.yaml").read_text().replace("../", str(ROOT) + "/")
    first = next(line for line in sweep.splitlines() if line.lstrip().startswith("- {name:"))
    (tmp_path / "s.yaml").write_text(sweep.replace(first, first.replace("}", ", concurrencies: [32, 8]}")))
    plan = make_plan(load_sweep(tmp_path / "s.yaml"))
    few, every = plan.deployments
    # the client's point order, and each point at the offset every arm sends it from
    assert [p.concurrency for p in few.points] == [8, 32]
    assert [p.concurrency for p in every.points] == [1, 8, 16, 24, 32]
    assert [p.dataset_offset for p in few.points] == [56, 152]
    assert {(p.concurrency, p.dataset_offset) for p in few.points} <= \
        {(p.concurrency, p.dataset_offset) for p in every.points}
    assert plan.dataset.conversations_needed == 216  # the dataset still serves every arm's points
    out = subprocess.run([sys.executable, "-m", "harness", "plan", str(tmp_path / "s.yaml")], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "2 deployment(s), 7 point(s)" in out and out.count("c32 (64 conversations, offset 152)") == 2
