"""Checks before a server starts: what would make it fail minutes later, said now.

A vLLM with HiSparse or offload pins its host pools at start and refuses pools above
95% of the RAM it can see (docs/facts.md §2); a server needing more GPUs than the host has
waits out its whole ready timeout. Both are known before anything starts.

HiSparse's own refusals (pipeline or decode context parallel > 1, cudagraph_mode FULL, a pool too
small for one request, a pinned pool above 95% of RAM) come from vLLM only after it has loaded the
weights, about 700 GiB for GLM-5.3: `hisparse_start_refusals` says them from the profile alone, so the plan
refuses such a profile and the sweep never starts it. The pinned memory is counted per node for the
executor vLLM will really use (docs/facts.md §2): one HiSparse pool per DP replica, shared by its TP
ranks, under the default multiprocessing executor on one node; one per TP rank under Ray or across
nodes.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.calc.formulas import BLOCK_BYTES, BLOCK_TOKENS, GIB
from harness.config import LaunchProfile
from harness.io import atomic_write_json, utc_now_iso
from harness.provenance import gpu_info, host_ram_gib
from harness.weights import WeightsOutcome

PINNED_RAM_LIMIT = 0.95  # vLLM refuses a pinned pool above this share of available RAM
MIN_FREE_DISK_GIB = 1.0  # logs, EvalScope databases and scrapes of a long sweep
SPARE_POOL_BLOCKS = 2  # vLLM wants ceil(max_model_len / block) + 2 blocks in the host pool
_BF16_DTYPES = ("auto", "bfloat16", "float16")


@dataclass(frozen=True)
class PinnedMemory:
    """The host memory one node pins for a profile, under the executor vLLM will use."""

    executor: str  # "mp" (vLLM's default on one node) or "ray"
    nodes: int
    hisparse_pools: int  # HiSparse pools pinned on one node
    per_node_gib: float

    def describe(self) -> str:
        if self.hisparse_pools == 0:
            return f"{self.per_node_gib:g} GiB pinned per node (executor {self.executor})"
        shared = ("one HiSparse pool per DP replica, shared by its TP ranks" if self.executor == "mp" and self.nodes == 1
                  else "one HiSparse pool per TP rank")
        return (f"{self.per_node_gib:g} GiB pinned per node (executor {self.executor}"
                f"{f', {self.nodes} nodes' if self.nodes > 1 else ''}: {shared}, {self.hisparse_pools} on a node)")


def _flag_value(args: list[str], *names: str) -> str | None:
    """The value of `--name v`, `--name=v` (the last one wins, as argparse does)."""
    found = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


def _int_flag(args: list[str], *names: str) -> int | None:
    value = _flag_value(args, *names)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _executor_of(profile: LaunchProfile) -> tuple[str, int]:
    """(vLLM's distributed executor, nodes) for a profile: serve.distributed_executor_backend or
    --distributed-executor-backend in extra_args, and --nnodes; vLLM's default is mp on one node."""
    serve, extra = profile.serve, list(profile.extra_args)
    backend = getattr(serve, "distributed_executor_backend", None) or _flag_value(
        extra, "--distributed-executor-backend")
    nodes = _int_flag(extra, "--nnodes") or 1
    return (backend or "mp"), max(1, nodes)


# A stop's grace: the base a server gets, and what each pinned GiB adds. Unpinning is not measured yet on a
# GPU node (vLLM logs "HiSparse: unpinned X GiB of host pool in Y s" at teardown: the first GPU run should
# read it); a process killed mid-unpin has outlived a scheduler's kill wait (prime-rl #2949), so the guess
# leans long: 512 GiB pinned waits up to 271 s.
STOP_GRACE_BASE_S = 15.0
STOP_GRACE_PER_PINNED_GIB_S = 0.5


def stop_grace_for(pinned_gib: float) -> float:
    """How long a server that pins `pinned_gib` per node gets to exit after SIGTERM before anything else is
    signalled (a profile's `stop_grace_s` overrides it)."""
    return STOP_GRACE_BASE_S + STOP_GRACE_PER_PINNED_GIB_S * max(0.0, pinned_gib)


def pinned_memory(profile: LaunchProfile) -> PinnedMemory:
    """Pinned host memory per node: the HiSparse pools (per DP replica or per TP rank) plus the
    offload pool (cpu_bytes, counted once per node)."""
    serve = profile.serve
    executor, nodes = _executor_of(profile)
    pools = 0
    if profile.kv.hisparse is not None:
        dp = serve.data_parallel_size or 1
        ranks = serve.tensor_parallel_size * dp
        per_rank = executor != "mp" or nodes > 1
        pools = math.ceil((ranks if per_rank else dp) / nodes)
    gib = pools * (profile.kv.hisparse.host_pool_gib if profile.kv.hisparse else 0.0)
    if profile.kv.offload is not None:
        gib += profile.kv.offload.cpu_bytes / GIB
    return PinnedMemory(executor=executor, nodes=nodes, hisparse_pools=pools, per_node_gib=round(gib, 1))


def _compilation_config(profile: LaunchProfile) -> dict[str, Any]:
    serve_value = getattr(profile.serve, "compilation_config", None)
    config: dict[str, Any] = dict(serve_value) if isinstance(serve_value, dict) else {}
    raw = _flag_value(list(profile.extra_args), "--compilation-config", "-O")
    if raw is not None:
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            config.update(parsed)
    mode = _flag_value(list(profile.extra_args), "--compilation-config.cudagraph_mode", "-O.cudagraph_mode")
    if mode is not None:
        config["cudagraph_mode"] = mode
    return config


def _host_block_bytes(profile: LaunchProfile) -> int | None:
    """Bytes of one 64-token block in the HiSparse host pool, for the model the calculator knows."""
    if "glm-5" not in profile.serve.model.lower():
        return None
    dtype = profile.serve.kv_cache_dtype or "auto"
    return BLOCK_BYTES[("vllm", "bf16" if dtype in _BF16_DTYPES else "fp8")].host


def hisparse_start_refusals(profile: LaunchProfile, ram_gib: float | None) -> list[str]:
    """What vLLM would refuse at start, one line each, said from the profile (and this node's RAM)."""
    problems: list[str] = []
    hisparse = profile.kv.hisparse
    serve, extra = profile.serve, list(profile.extra_args)
    if hisparse is not None and profile.engine == "vllm":
        pp = serve.pipeline_parallel_size or _int_flag(extra, "--pipeline-parallel-size", "-pp") or 1
        if pp > 1:
            problems.append(f"pipeline_parallel_size {pp}: vLLM refuses HiSparse with pipeline parallelism "
                            "(docs/facts.md §2)")
        dcp = (getattr(serve, "decode_context_parallel_size", None)
               or _int_flag(extra, "--decode-context-parallel-size", "-dcp") or 1)
        if dcp > 1:
            problems.append(f"decode_context_parallel_size {dcp}: vLLM refuses HiSparse with decode context "
                            "parallelism (docs/facts.md §2)")
        mode = _compilation_config(profile).get("cudagraph_mode")
        if str(mode).upper() == "FULL" or mode == 2:
            problems.append("compilation_config cudagraph_mode FULL: vLLM refuses HiSparse with full CUDA graphs; "
                            "use FULL_AND_PIECEWISE or PIECEWISE (docs/facts.md §2)")
        block_bytes = _host_block_bytes(profile)
        if block_bytes is not None and serve.max_model_len is not None:
            blocks = int(hisparse.host_pool_gib * GIB // block_bytes)
            needed = math.ceil(serve.max_model_len / BLOCK_TOKENS) + SPARE_POOL_BLOCKS
            if blocks < needed:
                problems.append(f"kv.hisparse.host_pool_gib {hisparse.host_pool_gib:g} holds {blocks} blocks but "
                                f"max_model_len {serve.max_model_len} needs ceil({serve.max_model_len}/"
                                f"{BLOCK_TOKENS}) + {SPARE_POOL_BLOCKS} = {needed}: vLLM refuses the pool")
    if profile.engine == "vllm" and ram_gib:
        pinned = pinned_memory(profile)
        if pinned.per_node_gib > PINNED_RAM_LIMIT * ram_gib:
            problems.append(f"the pinned host pools ({pinned.describe()}) exceed {PINNED_RAM_LIMIT:.0%} of the "
                            f"node's {ram_gib:g} GiB RAM: vLLM refuses to start; shrink kv.hisparse.host_pool_gib "
                            "or kv.offload.cpu_bytes")
    return problems


@dataclass(frozen=True)
class WeightsDiskCheck:
    """One node's free-disk check for a hub model, made before any byte of it moved there."""

    node: str
    hostname: str
    needed_bytes: int | None  # still to come (None: the hub did not say; nothing checked)
    free_bytes: int | None
    bytes_transferred: int
    local_path: str


@dataclass
class PreflightReport:
    deployment: str
    checked_at: str = field(default_factory=utc_now_iso)
    host_ram_gib: float | None = None
    pinned_pools_gib: float = 0.0  # per node, for the executor vLLM will use
    executor: str | None = None
    gpus_needed: int = 0
    gpus_visible: int | None = None  # None: no nvidia-smi here
    gpu_model: str | None = None
    results_free_gib: float | None = None
    weights: str | None = None  # the hub model fetched onto the server nodes
    weights_disk: list[WeightsDiskCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def run_preflight(deployment: str, profile: LaunchProfile, gpus_needed: int, results_dir: Path,
                  out_path: Path, server_on_this_host: bool = True,
                  weights: WeightsOutcome | None = None) -> PreflightReport:
    """Check this host for the profile; write preflight.json whatever the outcome.

    RAM and GPUs are checked only when the server will run on this host (a local launcher,
    or a one-node Ray cluster); on a multi-node cluster Ray places it elsewhere. A hub model's
    free-disk check ran on each server node before its fetch moved a byte (harness/fetch.py):
    `weights` is that fetch; what each node found is recorded, and its refusal (too little disk,
    offline with nothing cached, ...) fails the preflight.
    """
    report = PreflightReport(deployment=deployment, host_ram_gib=host_ram_gib(), gpus_needed=gpus_needed)
    if weights is not None:
        report.weights = str(weights.need.ref)
        report.weights_disk = [WeightsDiskCheck(n.node_id, n.hostname, n.needed_bytes, n.free_bytes,
                                                n.bytes_transferred, str(n.local_path)) for n in weights.nodes]
        if weights.problem:
            report.problems.append(f"weights: {weights.problem}")
    if profile.engine == "vllm" and server_on_this_host:
        pinned = pinned_memory(profile)
        report.pinned_pools_gib = pinned.per_node_gib
        report.executor = pinned.executor
        report.problems += hisparse_start_refusals(profile, report.host_ram_gib)
        gpus = gpu_info()
        report.gpu_model = gpus.model
        report.gpus_visible = gpus.count if gpus.model else None
        if report.gpus_visible is not None and report.gpus_visible < gpus_needed:
            report.problems.append(f"the server needs {gpus_needed} GPU(s) but this host shows "
                                   f"{report.gpus_visible}")
    try:
        report.results_free_gib = round(shutil.disk_usage(results_dir).free / 2**30, 1)
    except OSError:
        report.results_free_gib = None
    if report.results_free_gib is not None and report.results_free_gib < MIN_FREE_DISK_GIB:
        report.problems.append(f"only {report.results_free_gib:g} GiB free under {results_dir}")
    atomic_write_json(out_path, asdict(report))
    return report
