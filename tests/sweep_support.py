"""Helpers for the end-to-end sweep tests: a small sweep over simulated arms, `harness sweep` as a
subprocess, reading the run folder back, and process checks."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.records import PointRecord

ROOT = Path(__file__).resolve().parents[1]

RECIPE = f"""
name: tiny-sweep
source: {{kind: sample, path: {ROOT}/harness/data/samples/openhands-sample.jsonl}}
tokenizer: {ROOT}/harness/data/tokenizers/harness-bpe
pad: {{kind: synthetic}}
first_turn_length: 300
subsequent_turn_length: 40
num_turns: 2
conversations: 12
assumed_output_length: 64
"""


def write_sweep(tmp_path: Path, arms: dict[str, str], points: list[tuple[int, int]],
                policy: str = "continue", correctness: bool = False, extra: str = "") -> Path:
    """A small sweep over simulated arms; each arm's text is appended to a profile extending sim-hisparse.
    The correctness probe is off unless asked for: its requests would shift the request-counting faults."""
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    deployments = []
    for name, arm_text in arms.items():
        (tmp_path / f"{name}.yaml").write_text(f"extends: {ROOT}/launch/sim-hisparse.yaml\n{arm_text}")
        deployments.append(f"  - {{name: {name}, launch: {name}.yaml}}")
    point_lines = "\n".join(f"    - {{concurrency: {c}, conversations: {n}}}" for c, n in points)
    (tmp_path / "sweep.yaml").write_text(f"""
name: tiny
dataset: recipe.yaml
gpus_per_server: 8
on_point_failure: {policy}
client:
  max_tokens: 64
  extra_args: {{ignore_eos: true}}
  timeout_s: 300
  points:
{point_lines}
scrape: {{interval_s: 0.25}}
correctness: {{enabled: {str(correctness).lower()}}}
deployments:
{chr(10).join(deployments)}
{extra}""")
    return tmp_path / "sweep.yaml"


def sweep_argv(sweep: Path, run_id: str, launcher: str = "local", *extra: str) -> list[str]:
    return [sys.executable, "-m", "harness", "sweep", str(sweep), "--run-id", run_id,
            "--results-dir", str(sweep.parent / "results"), "--launcher", launcher, "--no-report", *extra]


def run_sweep(sweep: Path, run_id: str, launcher: str = "local", *extra: str,
              timeout_s: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(sweep_argv(sweep, run_id, launcher, *extra), capture_output=True, text=True,
                          timeout=timeout_s, cwd=ROOT)


def points_of(run_dir: Path) -> dict[tuple[str, int], PointRecord]:
    out = {}
    for path in run_dir.glob("points/*/[cp][0-9]*/point.json"):
        record = PointRecord.model_validate_json(path.read_bytes())
        out[(record.deployment, record.concurrency)] = record
    return out


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def descendants(pid: int) -> set[int]:
    found, frontier = set(), [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    frontier.append(child)
    return found




def wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


@dataclass
class Interrupted:
    """A `harness` run stopped by SIGINT: its exit code, how long it took to exit, every process it had
    started (its descendants as seen up to the signal) and its output."""
    returncode: int
    took_s: float
    seen: set[int] = field(default_factory=set)
    log: str = ""


def interrupt_when(argv: list[str], started: Callable[[], bool], out_path: Path, *, start_timeout_s: float,
                   settle_s: float, stop_timeout_s: float, env: dict[str, str] | None = None,
                   before_signal: Callable[[], None] = lambda: None) -> Interrupted:
    """Start `argv`, wait until `started()` holds, let it run `settle_s` more, then SIGINT it and wait for it
    to exit. The run is killed if anything here fails, so no test leaves it behind."""
    seen: set[int] = set()
    with out_path.open("w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            def watched() -> bool:
                seen.update(descendants(proc.pid))
                return started()
            assert wait_for(watched, start_timeout_s), "the run never reached the moment to interrupt: " + out_path.read_text()[-3000:]
            time.sleep(settle_s)
            seen.update(descendants(proc.pid))
            before_signal()
            signalled = time.monotonic()
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=stop_timeout_s)
            took_s = time.monotonic() - signalled
        finally:
            if proc.poll() is None:
                proc.kill()
    return Interrupted(proc.returncode, took_s, seen, out_path.read_text())
