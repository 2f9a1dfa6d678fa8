"""benchmarks/gpu_check.sh, the GPU night's one command, checked here without a GPU.

Fast: the dry run (the exact steps on the bare image, each under `timeout`, budgets under
8 minutes, nothing installed or fetched, under 5 MiB needed from the repository), a real run that
stops at preflight with a FAILED verdict, and the verdict line built from synthetic step results
(what a GPU night would leave). Slow (the kernel dev env): the check's workloads and the benchmark
run on the CPU kernels, so their own code is tested before a GPU ever runs them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
BARE_PYTHON = "/opt/torch/.venv/bin/python3"
NETWORK = re.compile(r"\bpip\b|\bcurl\b|\bwget\b|\bgit\b|\bapt-get\b|\bconda\b|https?://|index-url|find-links")


def gpu_check_module():
    if "gpu_check" not in sys.modules:  # registered first: its dataclasses look their module up
        spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpu_check"] = module
        spec.loader.exec_module(module)
    return sys.modules["gpu_check"]


def run_script(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("HISPARSE_")}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**base, **(env or {})})


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check-dry")
    started = time.monotonic()
    done = run_script("--dry-run", str(out))
    print(f"dry run in {time.monotonic() - started:.1f}s:\n{done.stdout}")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, json.loads((out / "plan.json").read_text()), out


def test_dry_run_lists_the_steps_of_the_bare_image(dry):
    stdout, plan, _ = dry
    names = [s["name"] for s in plan["steps"]]
    assert names == ["preflight", "build", "kernel-tests", "sanitizers", "graph", "bench", "vllm-probe"]
    assert plan["python"] == BARE_PYTHON
    for step in plan["steps"]:
        for command in step["commands"]:
            argv = command["argv"]
            assert argv[:3] == ["timeout", "-k", "5"] and int(argv[3]) == command["timeout_s"], argv
            assert command["shell"] in stdout, "the printed command is the one that runs"
            assert f"logs/{command['log']}" in stdout
    by_name = {s["name"]: s for s in plan["steps"]}
    build = by_name["build"]["commands"][0]["argv"]
    assert build[4:7] == [BARE_PYTHON, "-m", "hisparse_kernels.build"] and "--cuda-arch" in build
    tools = [c["argv"][c["argv"].index("--tool") + 1] for c in by_name["sanitizers"]["commands"]]
    assert {"memcheck", "racecheck", "synccheck"} <= set(tools) and by_name["sanitizers"]["parallel"]
    assert all(c["argv"][4].endswith("/compute-sanitizer") for c in by_name["sanitizers"]["commands"])
    tests = by_name["kernel-tests"]["commands"][0]
    assert tests["env"]["HISPARSE_REQUIRE_GPU"] == "1" and tests["argv"][-1].endswith("kernels/hisparse/tests")
    assert "graph" in by_name["graph"]["commands"][0]["argv"]
    bench = by_name["bench"]["commands"][0]["argv"]
    assert "--quick" in bench and float(bench[bench.index("--pool-gib") + 1]) >= 16
    assert by_name["vllm-probe"]["only_with_vllm"] and not by_name["bench"]["only_with_vllm"]


def test_dry_run_budgets_sum_under_eight_minutes(dry):
    stdout, plan, _ = dry
    total = 0
    for step in plan["steps"]:
        budgets = [c["timeout_s"] + 5 for c in step["commands"]]
        expected = max(budgets) if step["parallel"] else sum(budgets)
        assert step["budget_s"] == expected and step["budget_s"] > 0
        total += step["budget_s"]
    assert total == plan["total_budget_s"] < 480
    assert f"= {total}s (limit 480s" in stdout


def test_dry_run_installs_nothing(dry):
    stdout, plan, _ = dry
    assert plan["installs"] == [] and plan["problems"] == []
    for step in plan["steps"]:
        for command in step["commands"]:
            line = " ".join(command["argv"]) + " " + " ".join(command["env"].values())
            assert not NETWORK.search(line), f"{step['name']} would install or fetch: {line}"
    assert "installs: none" in stdout


def test_dry_run_carries_under_five_mib(dry):
    """The files the run reads from the repository, measured here independently of the script."""
    _, plan, _ = dry
    total, count = 0, 0
    for entry in plan["carry"]["paths"]:
        path = ROOT / entry
        files = [path] if path.is_file() else [
            p for p in path.rglob("*") if p.is_file() and not {"build", "__pycache__", ".pytest_cache",
                                                                ".hypothesis"} & set(p.relative_to(path).parts)
            and not any(part.endswith(".egg-info") for part in p.relative_to(path).parts)
            and not p.name.endswith((".so", ".o", ".pyc"))]
        total += sum(f.stat().st_size for f in files)
        count += len(files)
    assert (count, total) == (plan["carry"]["files"], plan["carry"]["bytes"])
    assert total < 5 * 2**20
    print(f"carried: {count} files, {total / 1024:.1f} KiB")
    # everything a command names inside the repository is carried
    carried = [ROOT / entry for entry in plan["carry"]["paths"]]
    for step in plan["steps"]:
        for command in step["commands"]:
            for token in [*command["argv"], *command["env"].values()]:
                if token.startswith(str(ROOT) + "/"):
                    assert any(Path(token) == c or c in Path(token).parents for c in carried), token


def test_dry_run_refuses_a_plan_over_its_limits(tmp_path, monkeypatch):
    module = gpu_check_module()
    steps = module.plan(tmp_path, BARE_PYTHON, tmp_path / "work", "/usr/local/cuda", 8, 32, [])
    steps[0].commands[0].timeout_s = 400
    steps[1].commands[0].argv += ["&&", "pip", "install", "vllm==0.33.0"]
    problems = module.plan_problems(steps, {"ok": False, "bytes": 6 * 2**20, "limit_bytes": 5 * 2**20})
    assert len(problems) == 3
    assert any("not under 480s" in p for p in problems) and any("install or fetch" in p for p in problems)


def test_a_real_run_without_a_gpu_fails_at_preflight_with_a_verdict(tmp_path):
    """Here (no GPU, no torch in this interpreter) the run stops at preflight and says so."""
    started = time.monotonic()
    done = run_script(str(tmp_path / "out"), env={"HISPARSE_GPU_PYTHON": sys.executable,
                                                  "HISPARSE_GPU_WORK": str(tmp_path / "work")})
    print(f"run in {time.monotonic() - started:.1f}s: {done.stdout.strip().splitlines()[-1]}")
    assert done.returncode == 1
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu_check: FAILED (preflight:") and "vLLM parts not run" in last
    verdict = json.loads((tmp_path / "out" / "verdict.json").read_text())
    assert verdict["verdict"] == "FAILED"
    assert {s["step"]: s["status"] for s in verdict["steps"]}["build"] == "not run"
    assert verdict["env"]["fatal"], "preflight names why"


# ---- the verdict, from what a GPU night leaves behind ----------------------------------------------

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="test_cuda" name="test_resolve_production_shapes[256-rows-mtp3]" time="9.1"/>
<testcase classname="test_cuda" name="test_resolve_bit_for_bit_with_vllm[0]" time="0.0">{vllm}</testcase>
<testcase classname="test_cuda" name="test_one_state_row_one_run[padding_after_real_rows]" time="1.0">{other}</testcase>
</testsuite></testsuites>"""


def fake_night(module, out: Path, *, vllm: str | None, bit_for_bit: str = "", other: str = "",
               sanitizer_ok: bool = True, failed_step: str | None = None) -> tuple[int, str, dict]:
    steps = module.plan(out, BARE_PYTHON, out / "work", "/usr/local/cuda", 8, 32, [])
    (out / "logs").mkdir(parents=True)
    (out / "kernel_tests.xml").write_text(JUNIT.format(vllm=bit_for_bit, other=other))
    for tool in module.SANITIZERS:
        summary = "ERROR SUMMARY: 0 errors" if tool != "racecheck" else "RACECHECK SUMMARY: 0 hazards displayed"
        (out / "logs" / f"sanitizer-{tool}.log").write_text(("WORKLOAD-OK\n" if sanitizer_ok else "") +
                                                            f"========= {summary}\n")
    (out / "graph.json").write_text(json.dumps({"captured": True, "steps": 6}))
    (out / "bench").mkdir()
    (out / "bench" / "results.json").write_text(json.dumps({"meta": {"pool": {"gib": 32.0}}, "resolver": [],
                                                            "gather": []}))
    if vllm:
        probe = {"ops": {f"op{i}": {"reached": True} for i in range(4)},
                 "ops_cuda": {f"op{i}": {"reached": True} for i in range(4)}, "error": None}
        (out / "logs" / "vllm-probe.log").write_text("HISPARSE_PROBE " + json.dumps(probe) + "\n")
    outcomes = {s.name: module.Outcome(s.name, "passed", 1.0) for s in steps if vllm or not s.only_with_vllm}
    if not vllm:
        outcomes["vllm-probe"] = module.Outcome("vllm-probe", "not run", detail="no vLLM")
    if failed_step:
        outcomes[failed_step] = module.Outcome(failed_step, "timed out", 80.0, detail="sanitizer-racecheck.log: exit 124")
    rc = module.verdict(steps, outcomes, out, {"vllm": vllm}, 300.0, out / "work" / "overlay")
    report = json.loads((out / "verdict.json").read_text())
    return rc, report["line"], report


def test_verdict_passed_without_vllm_says_so(tmp_path):
    module = gpu_check_module()
    rc, line, report = fake_night(module, tmp_path, vllm=None,
                                  bit_for_bit='<skipped message="vLLM not importable: No module named vllm"/>')
    assert rc == 0
    assert line == "gpu_check: PASSED (kernels, sanitizers, graph, bench; vLLM parts not run: no vLLM)"
    assert report["kernel_tests"]["vllm_bit_for_bit"]["skipped"] == 1


def test_verdict_names_the_vllm_parts_that_ran(tmp_path):
    module = gpu_check_module()
    rc, line, _ = fake_night(module, tmp_path / "a", vllm="0.33.0")
    assert rc == 0 and line.endswith("; vLLM 0.33.0: bit-for-bit, probe)")
    rc, line, _ = fake_night(module, tmp_path / "b", vllm="0.33.0",
                             bit_for_bit='<skipped message="this vLLM has no HiSparse ops"/>')
    assert rc == 0 and "vLLM 0.33.0: probe; bit-for-bit skipped (this vLLM has no HiSparse ops)" in line


def test_verdict_fails_on_a_failed_test_a_dirty_sanitizer_or_a_timeout(tmp_path):
    module = gpu_check_module()
    rc, line, _ = fake_night(module, tmp_path / "a", vllm=None, other='<failure message="LRU is no permutation"/>')
    assert rc == 1 and line.startswith("gpu_check: FAILED (kernels: kernel-tests failed")
    assert "passed: sanitizers, graph, bench" in line
    rc, line, _ = fake_night(module, tmp_path / "b", vllm=None, sanitizer_ok=False)
    assert rc == 1 and "sanitizers: sanitizers failed (no clean summary from memcheck" in line
    rc, line, _ = fake_night(module, tmp_path / "c", vllm=None, failed_step="sanitizers")
    assert rc == 1 and "sanitizers: sanitizers timed out" in line


# ---- the workloads and the benchmark on the CPU kernels ----------------------------------------------

@pytest.fixture(scope="module")
def dev_python() -> str:
    from kernel_dev_env import ensure_kernel_dev_env

    return str(ensure_kernel_dev_env(progress=print))


def run_dev(python: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    started = time.monotonic()
    done = subprocess.run([python, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    print(f"{shlex.join(args[:2])}: {time.monotonic() - started:.1f}s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_workloads_run_on_the_cpu_kernels(dev_python, tmp_path):
    done = run_dev(dev_python, "benchmarks/gpu_check_workloads.py", "sanitize", "--device", "cpu")
    assert done.stdout.strip().endswith("WORKLOAD-OK")
    done = run_dev(dev_python, "benchmarks/gpu_check_workloads.py", "graph", "--device", "cpu",
                   "--out", str(tmp_path / "graph.json"))
    assert done.stdout.strip().endswith("GRAPH-OK")
    report = json.loads((tmp_path / "graph.json").read_text())
    assert report["steps"] == len(report["per_step"]) == 6 and not report["captured"]
    assert report["ops"] == ["resolve", "gather_compact", "gather_plan", "invalidate"]


@pytest.mark.slow
def test_benchmark_smoke_runs_on_the_cpu_kernels(dev_python, tmp_path):
    run_dev(dev_python, "benchmarks/hisparse_kernels.py", "--device", "cpu", "--out", str(tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["meta"]["link_nominal_gbps"] == 63.0
    assert {(r["rows"], r["hot_size"]) for r in results["resolver"]} == {(1, 4096), (8, 10240)}
    assert all(0 < r["miss_rate"] < 0.5 for r in results["resolver"]), "steps keep missing: no replayed cycle"
    assert all(g["rows_copied"] > 0 and g["gather_compact_gbps"] > 0 for g in results["gather"])
    assert "| bundled | 8 | 4 | 10240 |" in (tmp_path / "results.md").read_text()


def test_the_quick_benchmark_keeps_the_256_row_shapes():
    """docs/kernels.md quotes 256-row figures: --quick (what the check runs) must measure them."""
    import ast

    tree = ast.parse((ROOT / "benchmarks" / "hisparse_kernels.py").read_text())
    quick = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "QUICK" for t in node.targets))
    shapes = {tuple(ast.literal_eval(arg) for arg in call.args) for call in quick.elts}
    assert {(256, 1, 4096), (256, 4, 10240), (1, 1, 4096)} <= shapes
