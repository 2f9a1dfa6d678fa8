"""One EvalScope `perf` invocation per point: its command, its run, where its summary lands.

The command is the one a person would type (the manifest records it); it runs forked from a server that
imported EvalScope once per sweep (harness/forkserver.py), since the import alone costs more CPU than a
simulated point's traffic. A command no fork server can run starts from scratch, as does every point
where the server cannot start or stops answering.

Each attempt gets a fresh output folder: EvalScope fails when it reuses one with
`--no-timestamp` (docs/facts.md §6). The offset is always explicit, so a point never
depends on EvalScope's own offset bookkeeping between runs.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from harness import forkserver
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

# What a fork server imports once for every point: the CLI and `perf` (seconds of CPU per point otherwise).
PRELOAD = ("evalscope.cli.cli", "evalscope.perf.main")
# For the server's import of EvalScope (about 2 s on an idle core) and each answer; past it, clients start from scratch.
ANSWER_TIMEOUT_S = 120.0


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
                  on_started: Callable[[int], None] | None = None,
                  fork: tuple[_ForkServer, list[str]] | None = None) -> LoadRun:
    """Run one EvalScope process to completion, its output into `log_path`: forked from a server where `fork`
    gives one (with what follows the interpreter in argv) and it answers, else started from scratch.

    `should_stop()` is polled: when it turns true (the server died), EvalScope is
    stopped rather than left to time out request by request. The client dies with the
    harness (parent-death signal) even when the harness is killed outright.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    env = _client_env(argv)
    with open(log_path, "ab") as log:  # there from the start, however soon the client is stopped
        proc = fork[0].start(fork[1], env, log_path) if fork is not None else None
        if proc is None:
            proc = subprocess.Popen(die_with_parent(argv), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, env=env)
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


def _stop_group(proc: subprocess.Popen | _ForkedRun) -> None:
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


def forkable(argv: list[str]) -> tuple[list[str], list[str]] | None:
    """(the command up to and including its Python interpreter, what follows it) for a command a fork server
    can run: `[nice -n N] PYTHON -m MODULE ...`, `[nice -n N] PYTHON SCRIPT ...` or `[nice -n N] SCRIPT ...` whose
    first line names its Python (a console script); None for anything else, which then starts from scratch."""
    head = 3 if argv[:2] == ["nice", "-n"] else 0
    rest = argv[head:]
    if len(rest) >= 2 and Path(rest[0]).name.startswith("python"):
        if rest[1] == "-m" and len(rest) >= 3 or not rest[1].startswith("-"):
            return argv[:head + 1], rest[1:]
        return None
    try:
        with open(rest[0], "rb") as script:
            first = script.readline(512).decode(errors="replace").strip()
    except (OSError, IndexError):
        return None
    python = first[2:].strip() if first.startswith("#!") else ""
    if not python or " " in python or not Path(python).name.startswith("python") or not Path(python).exists():
        return None
    return [*argv[:head], python], rest


class _ForkedRun:
    """A run the fork server started: the Popen calls `_run_evalscope` makes, answered from the server's lines."""

    def __init__(self, server: _ForkServer, pid: int):
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid, timeout_s=0.0)
        return self.returncode

    def wait(self, timeout: float) -> int:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid, timeout_s=timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired("evalscope", timeout)
        return self.returncode


class _ForkServer:
    """One client interpreter that imported EvalScope once and forks a process per point (harness/forkserver.py):
    a point's client starts in milliseconds instead of re-importing for seconds of CPU. Any trouble with the
    server (it cannot start, stops answering) ends it, and the points start their clients from scratch again."""

    def __init__(self, python_argv: list[str], env: dict[str, str], preload: tuple[str, ...] = PRELOAD):
        self.proc: subprocess.Popen | None = subprocess.Popen(
            die_with_parent([*python_argv, "-u", forkserver.__file__, *preload]), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
        self._pending = b""
        if self._read(ANSWER_TIMEOUT_S) != {"ready": True}:
            self.close()

    def _read(self, timeout_s: float) -> dict | None:
        """The server's next answer, waiting up to timeout_s; None when none came (or the server is gone).
        Read from the descriptor with a buffer of its own: a buffered reader could hold a second line that
        select() then never reports."""
        if self.proc is None or self.proc.stdout is None:
            return None
        deadline = time.monotonic() + max(0.0, timeout_s)
        while b"\n" not in self._pending:
            try:
                ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            except (OSError, ValueError):
                return None
            if not ready:
                return None
            try:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
            except (OSError, ValueError):  # closed by close() from another thread: the server is gone
                return None
            if not chunk:
                return None
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        try:
            answer = json.loads(line)
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None

    def start(self, argv_after_python: list[str], env: dict[str, str], log_path: Path) -> _ForkedRun | None:
        """Fork one run; None where the server is gone or does not answer (it is then ended)."""
        if self.proc is None or self.proc.stdin is None:
            return None
        request = {"argv": argv_after_python, "log": str(log_path), "env": env, "cwd": os.getcwd()}
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            self.close()
            return None
        answer = self._read(ANSWER_TIMEOUT_S)
        while answer is not None and "returncode" in answer:  # the end of an earlier run, never waited for
            answer = self._read(ANSWER_TIMEOUT_S)
        if not answer or "pid" not in answer:
            self.close()
            return None
        return _ForkedRun(self, int(answer["pid"]))

    def returncode(self, pid: int, timeout_s: float) -> int | None:
        """The run's exit status once the server reports it; None while it runs; -1 where the server is gone."""
        while True:
            answer = self._read(timeout_s)
            if answer is None:
                proc = self.proc
                if proc is None or proc.poll() is not None:  # the server died, so did its run (parent-death signal)
                    self.close()
                    return -1
                return None
            if answer.get("pid") == pid and "returncode" in answer:
                return int(answer["returncode"])

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            try:
                proc.stdin.close()  # the server's loop ends; it exits once no run is going
            except OSError:
                pass
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


class LoadGenerator:
    """What the runner asks of a load generator: run one point's command, read its summary,
    and leave no secret in the files it wrote.

    EvalScope is the real one; tests pass in-process fakes with the same methods. With a pid dir,
    each client gets a pidfile there, so a later harness reaps one a killed harness left.
    """

    def __init__(self, pid_dir: Path | None = None, preload: tuple[str, ...] = PRELOAD):
        self.pid_dir = pid_dir
        self.preload = preload  # what each fork server imports once
        self._servers: dict[tuple[int, tuple[str, ...]], _ForkServer] = {}
        self._lock = threading.Lock()

    def _fork(self, argv: list[str]) -> tuple[_ForkServer, list[str]] | None:
        """This thread's fork server for the command's interpreter (started on first use) and what follows the
        interpreter in argv; None where the command is not one a server can run. Per thread: the server gets its
        parent-death signal when the thread that started it ends."""
        found = forkable(argv)
        if found is None:
            return None
        python, after_python = found
        key = (threading.get_ident(), tuple(python))
        with self._lock:
            server = self._servers.get(key)
        if server is None or server.proc is None or server.proc.poll() is not None:
            try:
                server = _ForkServer(python, _client_env(argv), self.preload)
            except OSError:
                return None  # the interpreter cannot start: the point starts its client itself and says why
            with self._lock:
                self._servers[key] = server
        return server, after_python

    def run(self, argv: list[str], log_path: Path, timeout_s: float,
            should_stop: Callable[[], bool] | None = None) -> LoadRun:
        pidfiles: list[Path] = []

        def track(pid: int) -> None:
            if self.pid_dir is not None:
                pidfiles.append(track_client(log_path.parent.name, pid, argv, self.pid_dir))

        try:
            return _run_evalscope(argv, log_path, timeout_s, should_stop, on_started=track,
                                  fork=self._fork(argv))
        finally:
            for path in pidfiles:
                path.unlink(missing_ok=True)

    def close(self) -> None:
        """End the fork servers (each exits once its run, if any, has ended)."""
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.close()

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
