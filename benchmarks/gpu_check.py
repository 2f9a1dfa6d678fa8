"""The GPU check of the bundled HiSparse kernels: one command, offline, on a bare GPU machine.

    benchmarks/gpu_check.sh [--dry-run] OUTDIR        (this file does the work; stdlib only)

It needs only what such a machine has: a Python with a CUDA torch (default
/opt/torch/.venv/bin/python3, or $HISPARSE_GPU_PYTHON), numpy, pytest and hypothesis beside it,
nvcc and a C++ compiler, compute-sanitizer. It installs nothing and reaches no network: the module
is compiled by `hisparse_kernels.build` (nvcc and g++ against that torch; no pip, no setuptools).

Steps, each under its own time limit (coreutils `timeout`), the budgets summing to under 8 minutes:
preflight, build (sm of the visible GPU), kernel tests (CUDA against the oracle, production shapes,
padding runs, misaligned views, the overflow trap; bit for bit against vLLM's ops where a vLLM is
importable), compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on a small MTP3 launch,
a CUDA graph of resolve -> gather_compact -> gather_plan -> invalidate against eager runs, the
benchmark (graph timing, a registered host pool, a large DMA and the link's nominal rate), and the
plugin probe where a vLLM is importable (detected, never installed).

OUTDIR gets plan.json, env.json, a log per command under logs/, kernel_tests.xml, graph.json,
bench/results.{json,md}, probe.json and verdict.json (every figure); the last line printed is the
verdict, e.g. `gpu_check: PASSED (kernels, sanitizers, graph, bench; vLLM parts not run: no vLLM)`.
Exit 0 when it passed, 1 when it failed, 2 when the dry run finds the plan breaks its own limits.

`--dry-run` runs nothing: it prints the exact commands with their budgets, checks that none
installs or fetches anything, sums the budgets, and computes what the run needs from the
repository (the files it reads, to be carried to the machine) against a 5 MiB limit.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PYTHON = "/opt/torch/.venv/bin/python3"
DEFAULT_WORK = "/tmp/hisparse-gpu-check"
TOTAL_LIMIT_S = 480  # the whole run, 8 minutes
KILL_AFTER_S = 5  # `timeout -k`: a command that ignores SIGTERM is killed this much later
CARRY_LIMIT_BYTES = 5 * 2**20
# What the run reads from the repository: these files and folders, less build products.
CARRY = ("benchmarks/gpu_check.sh", "benchmarks/gpu_check.py", "benchmarks/gpu_check_env.py",
         "benchmarks/gpu_check_workloads.py", "benchmarks/hisparse_kernels.py", "kernels/hisparse")
CARRY_SKIP_DIRS = {"build", "__pycache__", ".pytest_cache", ".hypothesis"}
CARRY_SKIP_SUFFIXES = (".so", ".o", ".pyc", ".egg-info")
# Any of these in a command would install or fetch something.
FORBIDDEN = re.compile(r"\bpip3?\b|\bpip install\b|\buv\b|\bconda\b|\bapt(-get)?\b|\bcurl\b|\bwget\b|\bgit\b|"
                       r"https?://|--index-url|--extra-index-url|--find-links")
SANITIZERS = ("memcheck", "racecheck", "synccheck", "initcheck")


@dataclass
class Command:
    argv: list[str]  # without the timeout prefix
    env: dict[str, str]
    log: str  # file name under OUTDIR/logs
    timeout_s: int

    def full_argv(self) -> list[str]:
        return ["timeout", "-k", str(KILL_AFTER_S), str(self.timeout_s), *self.argv]

    @property
    def budget_s(self) -> int:
        return self.timeout_s + KILL_AFTER_S

    def shell(self) -> str:
        """The command as a shell line: the inherited PYTHONPATH is dropped, then `env` is set."""
        env = "".join(f" {k}={shlex.quote(v)}" for k, v in self.env.items())
        return f"env -u PYTHONPATH{env} " + shlex.join(self.full_argv())


@dataclass
class Step:
    name: str
    why: str
    commands: list[Command]
    parallel: bool = False
    needs: tuple[str, ...] = ()
    only_with_vllm: bool = False

    @property
    def budget_s(self) -> int:
        budgets = [c.budget_s for c in self.commands]
        return max(budgets) if self.parallel else sum(budgets)


@dataclass
class Outcome:
    step: str
    status: str  # passed | failed | timed out | not run
    seconds: float = 0.0
    detail: str = ""
    commands: list[dict] = field(default_factory=list)


def source_hash() -> str:
    """The module's source hash by its own rule (hisparse_kernels/build.py, loaded without torch)."""
    spec = importlib.util.spec_from_file_location("hisparse_build", ROOT / "kernels/hisparse/hisparse_kernels/build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.source_hash(ROOT / "kernels" / "hisparse")


def plan(out: Path, python: str, work: Path, cuda_home: str, jobs: int, pool_gib: float,
         bench_args: list[str]) -> list[Step]:
    overlay = str(work / "overlay")
    tests = ROOT / "kernels" / "hisparse" / "tests"
    on_overlay = {"PYTHONPATH": overlay}
    sanitizer = str(Path(cuda_home) / "bin" / "compute-sanitizer")
    workloads = str(ROOT / "benchmarks" / "gpu_check_workloads.py")

    def sanitize(tool: str) -> Command:
        extra = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"} if tool in ("memcheck", "initcheck") else {}
        return Command([sanitizer, "--tool", tool, "--error-exitcode", "7", "--print-limit", "20",
                        python, workloads, "sanitize"], {**on_overlay, **extra}, f"sanitizer-{tool}.log", 75)

    return [
        Step("preflight", "GPU, torch, nvcc, compute-sanitizer, vLLM (detected), memory",
             [Command([python, str(ROOT / "benchmarks" / "gpu_check_env.py"), "--out", str(out / "env.json")],
                      {}, "preflight.log", 15)]),
        Step("build", "compile the module with nvcc and g++ against this torch, for the visible GPU's sm",
             [Command([python, "-m", "hisparse_kernels.build", "--out", overlay, "--cuda-arch", "auto",
                       "--jobs", str(jobs)], {"PYTHONPATH": str(ROOT / "kernels" / "hisparse"),
                                              "CUDA_HOME": cuda_home}, "build.log", 75)],
             needs=("preflight",)),
        Step("kernel-tests", "the module's tests on the CUDA build: oracle, production shapes, padding runs, "
                             "misaligned views, the overflow trap; bit for bit against vLLM where importable",
             [Command([python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-o", "addopts=",
                       "--junitxml", str(out / "kernel_tests.xml"), str(tests)],
                      {**on_overlay, "HISPARSE_REQUIRE_GPU": "1", "HISPARSE_EXPECT_SHA256": source_hash()},
                      "kernel-tests.log", 115)],
             needs=("build",)),
        Step("sanitizers", "compute-sanitizer on an MTP3 resolve and the gathers (the four tools at once)",
             [sanitize(tool) for tool in SANITIZERS], parallel=True, needs=("build",)),
        Step("graph", "resolve -> gather_compact -> gather_plan -> invalidate captured in a CUDA graph, "
                      "replayed against eager runs on cloned state",
             [Command([python, workloads, "graph", "--out", str(out / "graph.json")], on_overlay, "graph.log", 35)],
             needs=("build",)),
        Step("bench", f"graph-timed resolver and gathers over a {pool_gib:g} GiB cudaHostRegister'ed pool, "
                      "against a large DMA and PCIe Gen5 x16",
             [Command([python, str(ROOT / "benchmarks" / "hisparse_kernels.py"), "--out", str(out / "bench"),
                       "--quick", "--pool-gib", f"{pool_gib:g}", "--budget-s", "60", *bench_args],
                      on_overlay, "bench.log", 85)],
             needs=("build",)),
        Step("vllm-probe", "the plugin in this vLLM: calls through _C_cache_ops reach the bundled CPU and "
                           "CUDA kernels",
             [Command([python, "-m", "hisparse_kernels.probe"], on_overlay, "vllm-probe.log", 25)],
             needs=("build",), only_with_vllm=True),
    ]


# ---- what the run needs from the repository -------------------------------------------------------

def carried_files() -> list[Path]:
    files = []
    for entry in CARRY:
        path = ROOT / entry
        if path.is_file():
            files.append(path)
            continue
        for sub in sorted(path.rglob("*")):
            rel = sub.relative_to(path)
            if (sub.is_file() and not CARRY_SKIP_DIRS.intersection(rel.parts)
                    and not any(part.endswith(".egg-info") for part in rel.parts)
                    and not sub.name.endswith(CARRY_SKIP_SUFFIXES)):
                files.append(sub)
    return files


def carry_report() -> dict:
    files = carried_files()
    size = sum(f.stat().st_size for f in files)
    return {"paths": list(CARRY), "files": len(files), "bytes": size, "limit_bytes": CARRY_LIMIT_BYTES,
            "ok": size < CARRY_LIMIT_BYTES}


def plan_problems(steps: list[Step], carry: dict) -> list[str]:
    problems = []
    total = sum(s.budget_s for s in steps)
    if total >= TOTAL_LIMIT_S:
        problems.append(f"the budgets sum to {total}s, not under {TOTAL_LIMIT_S}s")
    for step in steps:
        for command in step.commands:
            hit = FORBIDDEN.search(" ".join(command.argv))
            if hit:
                problems.append(f"{step.name}: '{hit.group(0)}' in a command: it would install or fetch")
    if not carry["ok"]:
        problems.append(f"the run needs {carry['bytes']} bytes from the repository, over {carry['limit_bytes']}")
    return problems


def dry_run(steps: list[Step], python: str, out: Path) -> int:
    carry = carry_report()
    problems = plan_problems(steps, carry)
    total = sum(s.budget_s for s in steps)
    print("gpu_check --dry-run: the steps it runs on the bare image (nothing runs here)")
    print(f"interpreter: {python} (its torch, numpy, pytest, hypothesis; $HISPARSE_GPU_PYTHON changes it)")
    print(f"working folder: repository root {ROOT}; results: {out}")
    for i, step in enumerate(steps, 1):
        when = " [only where preflight finds vLLM]" if step.only_with_vllm else ""
        how = f"{len(step.commands)} at once, " if step.parallel else ""
        print(f"\n[{i}] {step.name}: budget {step.budget_s}s ({how}timeout + {KILL_AFTER_S}s kill){when}")
        print(f"    {step.why}")
        for command in step.commands:
            print(f"    $ {command.shell()}")
            print(f"      > logs/{command.log}")
    print(f"\nbudgets: {' + '.join(str(s.budget_s) for s in steps)} = {total}s "
          f"(limit {TOTAL_LIMIT_S}s = 8 min; without vLLM "
          f"{sum(s.budget_s for s in steps if not s.only_with_vllm)}s)")
    print("installs: none. No command runs pip, uv, conda, apt, git, curl or wget, or names a URL or a "
          "package index; the module is compiled by hisparse_kernels.build (nvcc, g++), nothing downloaded")
    print(f"carried: {carry['files']} files, {carry['bytes'] / 1024:.1f} KiB of the repository "
          f"(limit {CARRY_LIMIT_BYTES // 2**20} MiB): {', '.join(CARRY)}")
    report = {"dry_run": True, "python": python, "steps": [
        {"name": s.name, "budget_s": s.budget_s, "parallel": s.parallel, "needs": list(s.needs),
         "only_with_vllm": s.only_with_vllm, "why": s.why,
         "commands": [{"shell": c.shell(), "argv": c.full_argv(), "env": c.env, "timeout_s": c.timeout_s,
                       "log": c.log} for c in s.commands]} for s in steps],
        "total_budget_s": total, "limit_s": TOTAL_LIMIT_S, "carry": carry, "installs": [], "problems": problems}
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    for problem in problems:
        print(f"PLAN PROBLEM: {problem}")
    print(f"gpu_check --dry-run: {'OK' if not problems else 'FAILED'}: {len(steps)} steps, {total}s of budget, "
          f"{carry['bytes'] / 1024:.0f} KiB carried, nothing installed")
    return 0 if not problems else 2


# ---- the real run -------------------------------------------------------------------------------------

def run_step(step: Step, out: Path) -> Outcome:
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    records = []

    def launch(command: Command):
        handle = (logs / command.log).open("w", encoding="utf-8")
        handle.write(f"$ {command.shell()}\n")
        handle.flush()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = subprocess.Popen(command.full_argv(), cwd=ROOT, env={**env, **command.env}, stdin=subprocess.DEVNULL,
                                stdout=handle, stderr=subprocess.STDOUT)
        return proc, handle, time.monotonic()

    def finish(command: Command, proc, handle, began) -> dict:
        rc = proc.wait()
        handle.close()
        return {"log": command.log, "rc": rc, "seconds": round(time.monotonic() - began, 1),
                "timed_out": rc in (124, 137)}

    if step.parallel:
        running = [(c, *launch(c)) for c in step.commands]
        records = [finish(*r) for r in running]
    else:
        for command in step.commands:
            records.append(finish(command, *launch(command)))
            if records[-1]["rc"] != 0:
                break
    seconds = round(time.monotonic() - started, 1)
    if any(r["timed_out"] for r in records):
        status = "timed out"
    elif all(r["rc"] == 0 for r in records) and len(records) == len(step.commands):
        status = "passed"
    else:
        status = "failed"
    return Outcome(step.name, status, seconds, commands=records)


def tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])[-400:]


def junit_summary(path: Path) -> dict:
    """Counts of the kernel tests, and how the vLLM bit-for-bit tests fared."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {"parsed": False}
    cases = list(root.iter("testcase"))
    out = {"parsed": True, "tests": len(cases), "failed": 0, "skipped": 0, "passed": 0, "skips": {},
           "vllm_bit_for_bit": {"passed": 0, "failed": 0, "skipped": 0, "skip_reason": None}}
    for case in cases:
        name = case.get("name", "")
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped")
        kind = "failed" if failed else ("skipped" if skipped is not None else "passed")
        out[kind] += 1
        if skipped is not None:
            reason = (skipped.get("message") or "").strip()
            out["skips"][reason] = out["skips"].get(reason, 0) + 1
        if "with_vllm" in name:
            out["vllm_bit_for_bit"][kind] += 1
            if skipped is not None:
                out["vllm_bit_for_bit"]["skip_reason"] = (skipped.get("message") or "").strip()
    return out


def sanitizer_summary(out: Path) -> dict:
    found = {}
    for tool in SANITIZERS:
        text = ""
        try:
            text = (out / "logs" / f"sanitizer-{tool}.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            pass
        summary = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: .*", text)
        found[tool] = {"summary": summary[-1] if summary else None, "workload_ok": "WORKLOAD-OK" in text}
    return found


def read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def bench_figures(results: dict | None) -> dict:
    if not results:
        return {}
    meta = results.get("meta", {})
    return {"pool": meta.get("pool"), "dma": meta.get("dma"), "link_nominal_gbps": meta.get("link_nominal_gbps"),
            "vllm": meta.get("vllm"), "skipped": meta.get("skipped"), "resolver": results.get("resolver"),
            "gather": results.get("gather")}


def run(steps: list[Step], out: Path, python: str, overlay: Path) -> int:
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps({"dry_run": False, "steps": [
        {"name": s.name, "budget_s": s.budget_s, "commands": [c.shell() for c in s.commands]} for s in steps]},
        indent=2), encoding="utf-8")
    outcomes: dict[str, Outcome] = {}
    env_facts: dict = {}
    if not os.access(python, os.X_OK):
        outcomes["preflight"] = Outcome("preflight", "failed", detail=f"no interpreter at {python} "
                                        "(set HISPARSE_GPU_PYTHON)")
    for step in steps:
        if step.name in outcomes:
            continue
        missing = [n for n in step.needs if outcomes.get(n) is None or outcomes[n].status != "passed"]
        if missing:
            outcomes[step.name] = Outcome(step.name, "not run", detail=f"needs {', '.join(missing)}")
            continue
        if step.only_with_vllm and not env_facts.get("vllm"):
            outcomes[step.name] = Outcome(step.name, "not run", detail="no vLLM")
            continue
        print(f"[gpu_check {time.monotonic() - started:5.0f}s] {step.name} (budget {step.budget_s}s)", flush=True)
        outcome = run_step(step, out)
        if outcome.status != "passed":
            outcome.detail = "; ".join(f"{c['log']}: exit {c['rc']}: {tail(out / 'logs' / c['log'])}"
                                       for c in outcome.commands if c["rc"] != 0)
        outcomes[step.name] = outcome
        print(f"[gpu_check {time.monotonic() - started:5.0f}s] {step.name}: {outcome.status} in "
              f"{outcome.seconds}s", flush=True)
        if step.name == "preflight":
            env_facts = read_json(out / "env.json") or {}
    return verdict(steps, outcomes, out, env_facts, time.monotonic() - started, overlay)


def verdict(steps: list[Step], outcomes: dict[str, Outcome], out: Path, env_facts: dict, seconds: float,
            overlay: Path) -> int:
    tests = junit_summary(out / "kernel_tests.xml")
    sanitizers = sanitizer_summary(out)
    graph = read_json(out / "graph.json")
    bench = read_json(out / "bench" / "results.json")
    probe = None
    probe_log = out / "logs" / "vllm-probe.log"
    if probe_log.is_file():
        line = next((ln for ln in probe_log.read_text(errors="replace").splitlines()
                     if ln.startswith("HISPARSE_PROBE ")), None)
        probe = json.loads(line[len("HISPARSE_PROBE "):]) if line else None
        if probe is not None:
            (out / "probe.json").write_text(json.dumps(probe, indent=2), encoding="utf-8")
            cpu = probe.get("ops", {})
            cuda = probe.get("ops_cuda", {})
            reached = (len(cpu) == 4 and all(v["reached"] for v in cpu.values()) and len(cuda) == 4
                       and all(v["reached"] for v in cuda.values()) and not probe.get("error"))
            if not reached and outcomes.get("vllm-probe") and outcomes["vllm-probe"].status == "passed":
                outcomes["vllm-probe"].status = "failed"
                outcomes["vllm-probe"].detail = "calls through _C_cache_ops did not all reach the bundled kernels"
    # A step that exited 0 can still have failed its own check.
    if outcomes.get("kernel-tests") and outcomes["kernel-tests"].status == "passed" and tests.get("failed"):
        outcomes["kernel-tests"].status = "failed"
    if outcomes.get("sanitizers") and outcomes["sanitizers"].status == "passed":
        bad = [t for t, s in sanitizers.items() if not s["workload_ok"] or not s["summary"]]
        if bad:
            outcomes["sanitizers"].status = "failed"
            outcomes["sanitizers"].detail = f"no clean summary from {', '.join(bad)}"
    parts = {"kernels": ("build", "kernel-tests"), "sanitizers": ("sanitizers",), "graph": ("graph",),
             "bench": ("bench",)}
    def status(name: str) -> str:
        return outcomes[name].status if name in outcomes else "not run"

    passed = [p for p, names in parts.items() if all(status(n) == "passed" for n in names)]
    not_run = [p for p, names in parts.items() if p not in passed
               and all(status(n) in ("passed", "not run") for n in names)]
    failed = {p: "; ".join(f"{n} {status(n)}" + (f" ({outcomes[n].detail[:160]})" if outcomes[n].detail else "")
                           for n in names if status(n) not in ("passed", "not run"))
              for p, names in parts.items() if p not in passed and p not in not_run}
    if status("preflight") != "passed":
        fatal = env_facts.get("fatal") or []
        failed = {"preflight": "; ".join(fatal) if fatal else (outcomes["preflight"].detail
                                                               or tail(out / "logs" / "preflight.log")), **failed}
    vllm_version = env_facts.get("vllm")
    bit = tests.get("vllm_bit_for_bit", {})
    if not vllm_version:
        vllm_note = "vLLM parts not run: no vLLM"
    else:
        ran, why_not = [], []
        if bit.get("passed") and not bit.get("failed") and not bit.get("skipped"):
            ran.append("bit-for-bit")
        elif bit.get("failed"):
            failed["vLLM bit-for-bit"] = f"{bit['failed']} failed"
        else:
            why_not.append(f"bit-for-bit skipped ({bit.get('skip_reason') or 'tests did not run'})")
        probe_outcome = outcomes.get("vllm-probe")
        if probe_outcome and probe_outcome.status == "passed":
            ran.append("probe")
        elif probe_outcome:
            failed["vLLM probe"] = probe_outcome.status + (f" ({probe_outcome.detail[:160]})"
                                                           if probe_outcome.detail else "")
        vllm_note = f"vLLM {vllm_version}: " + ", ".join(ran or ["nothing passed"]) + \
            (f"; {'; '.join(why_not)}" if why_not else "")
    ok = not failed and len(passed) == len(parts)
    line = (f"gpu_check: PASSED ({', '.join(passed)}; {vllm_note})" if ok else
            f"gpu_check: FAILED ({'; '.join(f'{k}: {v}' for k, v in failed.items())}"
            + (f"; not run: {', '.join(not_run)}" if not_run else "")
            + f"; passed: {', '.join(passed) or 'nothing'}; {vllm_note})")
    report = {"verdict": "PASSED" if ok else "FAILED", "line": line, "seconds": round(seconds, 1),
              "parts_passed": passed, "parts_failed": failed, "parts_not_run": not_run, "vllm": vllm_note,
              "steps": [asdict(outcomes[s.name]) | {"budget_s": s.budget_s} for s in steps if s.name in outcomes],
              "env": env_facts, "build": read_json(overlay / "build.json"),
              "kernel_tests": tests, "sanitizers": sanitizers, "graph": graph, "bench": bench_figures(bench),
              "probe": probe}
    (out / "verdict.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"figures: {out / 'verdict.json'}; logs: {out / 'logs'}")
    print(line, flush=True)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its checks; run nothing")
    parser.add_argument("out", type=Path, help="results folder")
    args = parser.parse_args(argv)
    python = os.environ.get("HISPARSE_GPU_PYTHON", DEFAULT_PYTHON)
    work = Path(os.environ.get("HISPARSE_GPU_WORK", DEFAULT_WORK))
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    jobs = int(os.environ.get("HISPARSE_BUILD_JOBS", "8"))
    pool_gib = float(os.environ.get("HISPARSE_POOL_GIB", "32"))
    bench_args = shlex.split(os.environ.get("HISPARSE_BENCH_ARGS", ""))
    out = args.out.resolve()
    steps = plan(out, python, work, cuda_home, jobs, pool_gib, bench_args)
    if args.dry_run:
        return dry_run(steps, python, out)
    return run(steps, out, python, work / "overlay")


if __name__ == "__main__":
    sys.exit(main())
