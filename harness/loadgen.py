"""One EvalScope `perf` invocation per point: its command, its run, where its summary lands.

Each attempt gets a fresh output folder: EvalScope fails when it reuses one with
`--no-timestamp` (docs/facts.md §6). The offset is always explicit, so a point never
depends on EvalScope's own offset bookkeeping between runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from harness.builds.client import client_env_dir, client_program, planned_version, read_client_marker
from harness.config import ClientSettings
from harness.io import compact_json, die_with_parent, package_version
from harness.metrics.evalscope_requests import DB_NAME, read_requests
from harness.metrics.evalscope_summary import parse_summary
from harness.records import ClientRequests, EvalScopeSummary
from harness.redact import scrub_text_files
from harness.servers.reaper import track_client

BASE_URL_PLACEHOLDER = "{base_url}"
DATASET_PLACEHOLDER = "{dataset}"
OUTPUTS_PLACEHOLDER = "{outputs}"


# What changes when a sweep meant to reproduce the blog runs another EvalScope (docs/facts.md §6).
BLOG_EVALSCOPE = "1.7.0"
CLIENT_DIFFERENCE = (
    "EvalScope 1.7.0 (the blog's) leaves the server's streamed `delta.reasoning` text out of the history it "
    "re-sends; later releases keep it, so with a reasoning parser every later turn sends more prompt tokens "
    "(prefix-cache hits, TTFT and the Pareto's total-token axis move)")


@dataclass(frozen=True)
class ClientPlan:
    """Which EvalScope the points run: its command prefix and version (resolved once, by the plan)."""

    program: tuple[str, ...]
    version: str | None
    source: str  # "harness" (the harness's own environment) or the pinned spec it was built from
    spec: str | None = None  # client.evalscope: built into a cached environment before the points run
    env_dir: Path | None = None
    nice: int = 0

    def describe(self) -> str:
        where = "the harness's own environment" if self.spec is None else f"pinned {self.spec}, cached at {self.env_dir}"
        nice = f", nice {self.nice}" if self.nice else ""
        return f"EvalScope {self.version or '? (known once built)'} ({where}{nice})"


def _evalscope_program() -> list[str]:
    # The console script beside this interpreter, so the harness's own EvalScope runs
    # even when PATH points elsewhere; the module form where no script is installed.
    script = Path(sys.executable).with_name("evalscope")
    if script.exists():
        return [str(script)]
    found = shutil.which("evalscope")
    return [found] if found else [sys.executable, "-m", "evalscope.cli.cli"]


def resolve_client(client: ClientSettings, clients_dir: Path | None = None) -> ClientPlan:
    """The EvalScope the points run: the sweep's pinned one (client.evalscope) or the harness's own,
    behind `nice -n N` when client.nice asks for a lower CPU priority."""
    nice = ("nice", "-n", str(client.nice)) if client.nice else ()
    if client.evalscope is None:
        return ClientPlan(program=nice + tuple(_evalscope_program()), version=package_version("evalscope"),
                          source="harness", nice=client.nice)
    env_dir = client_env_dir(client.evalscope, clients_dir)
    built = read_client_marker(env_dir)
    version = built.evalscope_version if built is not None else planned_version(client.evalscope)
    return ClientPlan(program=nice + client_program(client.evalscope, clients_dir), version=version,
                      source=f"evalscope {client.evalscope}", spec=client.evalscope, env_dir=env_dir,
                      nice=client.nice)


def blog_client_warning(plan: ClientPlan, reasoning_parser: str | None) -> str | None:
    """Where a sweep reproduces the blog with another EvalScope than the blog's: what differs."""
    if plan.version == BLOG_EVALSCOPE:
        return None
    parser = (f"the arms run --reasoning-parser {reasoning_parser}" if reasoning_parser
              else "no arm sets a reasoning parser, so this matters only for servers that stream reasoning")
    return (f"client: EvalScope {plan.version or plan.spec or '?'} is not the blog's {BLOG_EVALSCOPE} "
            f"(pin it with client.evalscope: \"{BLOG_EVALSCOPE}\"): {CLIENT_DIFFERENCE}; {parser}")


def client_argv_template(plan: ClientPlan, client: ClientSettings, *, model: str, concurrency: int, conversations: int,
                         dataset_offset: int, name: str, api_key: str | None = None) -> list[str]:
    """One point's EvalScope argv, with the server URL, dataset path and output folder left as
    placeholders that only a run knows (fill_client_argv)."""
    argv = list(plan.program) + [
        "perf",
        "--model", model,
        "--url", f"{BASE_URL_PLACEHOLDER}/v1/chat/completions",
        "--api", client.api,
        "--dataset", client.dataset,
        "--dataset-path", DATASET_PLACEHOLDER,
        "--dataset-offset", str(dataset_offset),
        "--max-tokens", str(client.max_tokens),
    ]
    if client.multi_turn:
        argv.append("--multi-turn")
    argv += ["--number", str(conversations), "--parallel", str(concurrency)]
    if client.extra_args:
        argv += ["--extra-args", compact_json(client.extra_args)]
    argv += ["--name", name, "--outputs-dir", OUTPUTS_PLACEHOLDER, "--no-timestamp"]
    if api_key and "--api-key" not in client.evalscope_args:
        argv += ["--api-key", api_key]  # the server's own key (files that record it are redacted)
    return argv + list(client.evalscope_args)


def with_offset(argv: tuple[str, ...] | list[str], offset: int) -> list[str]:
    """A point's argv with another --dataset-offset (a retry that shifts to fresh conversations)."""
    out = list(argv)
    out[out.index("--dataset-offset") + 1] = str(offset)
    return out


def conversations_read(offset: int, conversations: int, built: int) -> list[int]:
    """The conversation indices one EvalScope run reads (docs/facts.md §6): the list rotated by the
    offset (an offset at or past its length does nothing), then `conversations` of them, cycling."""
    if built <= 0:
        return []
    order = list(range(built))
    if 0 < offset < built:
        order = order[offset:] + order[:offset]
    return [order[i % built] for i in range(conversations)]


def warmed_resends(points: list[tuple[int, int, int]], built: int) -> dict[int, int]:
    """Per concurrency, how many conversations its run re-sends that an earlier point (or itself)
    already sent; `points` are (concurrency, offset, conversations) in run order."""
    sent: set[int] = set()
    out: dict[int, int] = {}
    for concurrency, offset, conversations in points:
        read = conversations_read(offset, conversations, built)
        again = sum(1 for c in read if c in sent) + len(read) - len(set(read))
        if again:
            out[concurrency] = again
        sent.update(read)
    return out


def fill_client_argv(template: tuple[str, ...] | list[str], *, base_url: str, dataset_path: Path,
                     outputs_dir: Path) -> list[str]:
    values = {BASE_URL_PLACEHOLDER: base_url.rstrip("/"), DATASET_PLACEHOLDER: str(dataset_path),
              OUTPUTS_PLACEHOLDER: str(outputs_dir)}
    out = []
    for arg in template:
        for placeholder, value in values.items():
            arg = arg.replace(placeholder, value)
        out.append(arg)
    return out


def summary_dir(outputs_dir: Path, name: str, concurrency: int, conversations: int) -> Path:
    """Where EvalScope writes one run's benchmark_summary.json."""
    return outputs_dir / name / f"parallel_{concurrency}_number_{conversations}"


@dataclass(frozen=True)
class LoadRun:
    returncode: int
    wall_s: float
    stdout_path: Path
    timed_out: bool
    interrupted: bool = False


def _client_env(argv: list[str]) -> dict[str, str]:
    """The client's environment: traffic to the server the harness started never goes through a
    proxy (the server's host joins NO_PROXY), whatever HTTP(S)_PROXY the harness itself inherited."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    host = urlsplit(argv[argv.index("--url") + 1]).hostname if "--url" in argv else None
    if host:
        current = [h for h in (env.get("NO_PROXY") or env.get("no_proxy") or "").split(",") if h]
        env["NO_PROXY"] = env["no_proxy"] = ",".join(dict.fromkeys([*current, host]))
    return env


def _run_evalscope(argv: list[str], log_path: Path, timeout_s: float,
                  should_stop: Callable[[], bool] | None = None,
                  on_started: Callable[[int], None] | None = None) -> LoadRun:
    """Run one EvalScope process to completion, its output into `log_path`.

    `should_stop()` is polled: when it turns true (the server died), EvalScope is
    stopped rather than left to time out request by request. The client dies with the
    harness (parent-death signal) even when the harness is killed outright.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(die_with_parent(argv), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=_client_env(argv))
        if on_started is not None:
            on_started(proc.pid)
        timed_out = interrupted = False
        try:
            while proc.poll() is None:
                if time.monotonic() - start > timeout_s:
                    timed_out = True
                    break
                if should_stop is not None and should_stop():
                    interrupted = True
                    break
                try:
                    proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            if proc.poll() is None:
                _stop_group(proc)
    return LoadRun(returncode=proc.returncode if proc.returncode is not None else -1,
                   wall_s=time.monotonic() - start, stdout_path=log_path,
                   timed_out=timed_out, interrupted=interrupted)


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


class LoadGenerator:
    """What the runner asks of a load generator: run one point's command, read its summary,
    and leave no secret in the files it wrote.

    EvalScope is the real one; tests pass in-process fakes with the same methods. With a pid dir,
    each client gets a pidfile there, so a later harness reaps one a killed harness left.
    """

    def __init__(self, pid_dir: Path | None = None):
        self.pid_dir = pid_dir

    def run(self, argv: list[str], log_path: Path, timeout_s: float,
            should_stop: Callable[[], bool] | None = None) -> LoadRun:
        pidfiles: list[Path] = []

        def track(pid: int) -> None:
            if self.pid_dir is not None:
                pidfiles.append(track_client(log_path.parent.name, pid, argv, self.pid_dir))

        try:
            return _run_evalscope(argv, log_path, timeout_s, should_stop, on_started=track)
        finally:
            for path in pidfiles:
                path.unlink(missing_ok=True)

    def scrub(self, outputs_dir: Path) -> None:
        """Mask secrets in the text files the client wrote (its log, benchmark_args.json, ...)."""
        scrub_text_files(outputs_dir)

    def read_summary(self, run_summary_dir: Path) -> EvalScopeSummary | None:
        """The run's summary; None where it wrote none; HarnessError where it is unreadable."""
        path = run_summary_dir / "benchmark_summary.json"
        if not path.exists():
            return None
        return parse_summary(path)

    def read_requests(self, run_summary_dir: Path) -> ClientRequests | None:
        """The run's per-request rows, summarised; None where it wrote no database."""
        return read_requests(run_summary_dir / DB_NAME)
