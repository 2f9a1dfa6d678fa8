"""The GitHub Actions workflows: actionlint passes on all three, and they do what the nightly needs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.cli import COMMANDS, _parser

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
NAMES = ("ci.yml", "nightly-gpu.yml", "nightly-sim.yml", "locks.yml")
README_TEST = "pip install -e '.[test]' -c harness/data/locks/harness-test.cp311-linux_x86_64.txt && python -m pytest -q"


def _actionlint() -> str:
    # the test extra installs it into the same environment as pytest
    beside = Path(sys.executable).with_name("actionlint")
    found = str(beside) if beside.is_file() else shutil.which("actionlint")
    if found is None:
        pytest.fail("actionlint is not installed: pip install -e '.[test]'")
    return found


def _load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


def _steps(workflow: dict) -> list[dict]:
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def test_actionlint_passes_on_every_workflow() -> None:
    paths = [str(WORKFLOWS / n) for n in NAMES]
    out = subprocess.run([_actionlint(), "-no-color", *paths], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text("on:\n  schedule:\n    - cron: '0 25 * * *'\njobs:\n  a:\n    runs-on: ubuntu-latest\n"
                      "    steps:\n      - run: echo ${{ inputs.nothing }}\n")
    out = subprocess.run([_actionlint(), "-no-color", str(broken)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "cron" in out.stdout and "nothing" in out.stdout


def test_ci_runs_the_readme_test_command_on_python_311() -> None:
    ci = _load("ci.yml")
    assert set(ci["on"]) == {"push", "pull_request"}
    steps = _steps(ci)
    assert any(s.get("with", {}).get("python-version") == "3.11" for s in steps)
    assert any(s.get("run") == README_TEST for s in steps)


def test_the_weekly_locks_workflow_tries_the_unpinned_install_and_proposes_refreshed_locks() -> None:
    locks = _load("locks.yml")
    assert "schedule" in locks["on"]
    unpinned = [s.get("run", "") for s in locks["jobs"]["unpinned"]["steps"]]
    assert "pip install -e '.[test]'" in unpinned  # no constraints: drift shows here first
    refresh = [s.get("run", "") for s in locks["jobs"]["refresh"]["steps"]]
    order = [next(i for i, r in enumerate(refresh) if needle in r)
             for needle in ("python -m harness lock", README_TEST, "gh pr create")]
    assert order == sorted(order)  # resolve, then the suite on the new locks, then (only then) the proposal


def test_nightly_gpu_is_scheduled_dispatchable_serialised_and_keeps_its_files() -> None:
    gpu = _load("nightly-gpu.yml")
    assert gpu["on"]["schedule"] and set(gpu["on"]["workflow_dispatch"]["inputs"]) >= {"vllm_ref", "kernels"}
    assert gpu["on"]["workflow_dispatch"]["inputs"]["kernels"]["options"] == ["bundled", "vllm"]
    assert gpu["concurrency"]["cancel-in-progress"] is False  # a night waits, never kills the one running
    job = gpu["jobs"]["nightly"]
    assert "self-hosted" in job["runs-on"] and job["timeout-minutes"] > 0
    steps = _steps(gpu)
    first = steps[0]["run"]
    assert "nvidia-smi" in first and "MemTotal" in first and "WEIGHTS_DIR" in first
    nightly = next(s for s in steps if s.get("id") == "nightly")
    assert "python -m harness nightly" in nightly["run"] and "sweeps/nightly.yaml --store history/" in nightly["run"]
    after = steps[steps.index(nightly) + 1:]
    assert after and all(s.get("if") == "always()" for s in after)  # reports and history even on a regression
    assert any(s.get("uses", "").startswith("actions/upload-artifact") for s in after)
    assert any("push origin" in s.get("run", "") for s in after)


def test_nightly_sim_runs_the_same_commands_on_a_hosted_runner() -> None:
    sim = _load("nightly-sim.yml")
    assert sim["jobs"]["nightly"]["runs-on"] == "ubuntu-latest"
    nightly = next(s for s in _steps(sim) if s.get("id") == "nightly")
    assert nightly["run"] == "python -m harness nightly sweeps/nightly-sim.yaml --store history/"
    gpu_commands = {s["name"] for s in _steps(_load("nightly-gpu.yml")) if "harness" in s.get("run", "")}
    sim_commands = {s["name"].replace(" (simulated engine)", "") for s in _steps(sim) if "harness" in s.get("run", "")}
    assert gpu_commands - {"Install the harness"} <= sim_commands


def test_the_nightly_steps_call_the_nightly_command_as_it_parses() -> None:
    """The commands the workflows run exist and take the options given (the GPU step's as it expands)."""
    names = {name for name, _, _ in COMMANDS}
    for workflow in NAMES:
        for step in _steps(_load(workflow)):
            for line in step.get("run", "").splitlines():
                words = line.split()
                if "harness" in words and words[words.index("harness") - 1] == "-m":
                    assert words[words.index("harness") + 1] in names, line
    sim = next(s for s in _steps(_load("nightly-sim.yml")) if s.get("id") == "nightly")["run"].split()
    gpu = ["nightly", "sweeps/nightly.yaml", "--store", "history/", "--kernels", "vllm", "--vllm-ref", "abc123"]
    for argv in (sim[sim.index("harness") + 1:], gpu):
        args = _parser("nightly").parse_args(argv)
        assert args.command == "nightly" and str(args.store) == "history"
    assert _parser("nightly").parse_args(gpu).vllm_ref == "abc123"


@pytest.mark.parametrize("name", NAMES)
def test_workflows_run_python_only_through_harness_commands_pip_and_pytest(name: str) -> None:
    for step in _steps(_load(name)):
        for line in step.get("run", "").splitlines():
            for part in line.replace("&&", ";").split(";"):
                words = part.split()
                runs_python = [i for i, w in enumerate(words) if w.split("/")[-1] in ("python", "python3.11")]
                for i in runs_python:
                    assert words[i + 1:i + 3] in (["-m", "harness"], ["-m", "pytest"], ["-m", "venv"]), line
