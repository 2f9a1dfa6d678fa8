"""HiSparse evidence: proof that an arm which asked for HiSparse really runs it.

A build can accept HiSparse flags and ignore them (one that predates the connector switch, a branch
that is not the blog's, a misspelt connector); the arm would then be reported as HiSparse while it
measured the baseline. Two independent witnesses are read once the server is ready:

- the start-up log: vLLM logs HiSparse's pools and its steady-state maximum concurrency
  (format strings below, docs/facts.md §2);
- the first /metrics scrape: at least one `vllm:hisparse_` family.

An arm that asked for HiSparse and shows neither is refused ("HiSparse requested but not active").

HiSparse's metric names move between vLLM commits (docs/facts.md §2): counters with and without
`_total`, and the host-pool gauges named `..._host_cache_usage_perc` in some builds and
`..._host_blocks_used` / `..._host_blocks_total` / `..._host_blocks_usage` / `..._pending_spills` in
others. `normalise_hisparse` maps whichever a scrape holds onto one set of names (the 0.33.0
wheel's), so the per-point metrics come from whichever exists.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from harness import vllm_names as names
from harness.calc import CalcError, CalcInputs, calculate, sizing_for_launch
from harness.config import LaunchProfile
from harness.errors import HarnessError
from harness.metrics.prom import Sample
from harness.metrics.scrape import scrape_once
from harness.records import HiSparseEvidence
from harness.sim.engine_config import engine_config

HISPARSE_PREFIX = names.HISPARSE_PREFIX
INACTIVE = "HiSparse requested but not active"
# The counters are filled from the resolver's stats only every 2,000 worker steps (docs/facts.md §2).
SAMPLING_NOTE = "HiSparse counters are sampled every 2,000 worker steps: a short point may show none"

# vLLM 0.33.0's format strings (docs/facts.md §2); the blog branch adds `host_pool_gib=%s, ` to the first.
START_ENABLED = ("Enabled experimental HiSparse HMA hot cache: top_k=%d, device_buffer_size=%d (%d LRU rows), "
                 "max_num_seqs=%d.")
START_POOLS = ("HiSparse HMA: %.1f GiB host source (%d blocks), %.1f GiB shared GPU indexer/resident/hot pool "
               "(%d blocks).")
START_CONCURRENCY = ("HiSparse steady-state maximum concurrency for %s tokens per request: %.2fx (running requests "
                     "reading from host).")

_ENABLED_RE = re.compile(r"Enabled experimental HiSparse HMA hot cache:(?P<rest>.*)")
_POOLS_RE = re.compile(r"HiSparse HMA: (?P<host_gib>[\d.]+) GiB host source \((?P<host_blocks>\d+) blocks\), "
                       r"(?P<gpu_gib>[\d.]+) GiB shared GPU indexer/resident/hot pool \((?P<gpu_blocks>\d+) blocks\)")
_CONCURRENCY_RE = re.compile(r"HiSparse steady-state maximum concurrency for (?P<tokens>[\d,_]+) tokens per "
                             r"request: (?P<x>[\d.]+)x")
_KEY_VALUE_RE = re.compile(r"(host_pool_gib|top_k|device_buffer_size|max_num_seqs)=([\d.]+)")
_LRU_RE = re.compile(r"\((\d+) LRU rows\)")
START_MARKER = "===== harness: start "  # the line a launcher writes before every start (servers/process.py)

# canonical name (vLLM 0.33.0's, as exposed) <- the names other commits use, after the prefix
HISPARSE_ALIASES: dict[str, tuple[str, ...]] = {
    names.HISPARSE_HITS: ("cache_hits_total", "cache_hits"),
    names.HISPARSE_MISSES: ("cache_misses_total", "cache_misses"),
    names.HISPARSE_H2D_BYTES: ("host_to_device_bytes_total", "host_to_device_bytes"),
    names.HISPARSE_HOST_USAGE: ("host_cache_usage_perc", "host_blocks_usage"),
    names.HISPARSE_HOST_BLOCKS_USED: ("host_blocks_used",),
    names.HISPARSE_HOST_BLOCKS_TOTAL: ("host_blocks_total",),
    names.HISPARSE_PENDING: ("pending_page_transfers", "pending_spills"),
}
HISPARSE_HITS, HISPARSE_MISSES, HISPARSE_H2D_BYTES, HISPARSE_HOST_USAGE = list(HISPARSE_ALIASES)[:4]
_USED, _TOTAL = names.HISPARSE_HOST_BLOCKS_USED, names.HISPARSE_HOST_BLOCKS_TOTAL

V = TypeVar("V")


# ---- metric families --------------------------------------------------------------------------------

def _hisparse_family(sample_name: str) -> str | None:
    """The family a HiSparse sample belongs to (histogram suffixes and `_total` stripped); None if not one."""
    if not sample_name.startswith(HISPARSE_PREFIX):
        return None
    for suffix in ("_bucket", "_sum", "_count", "_created", "_total"):
        if sample_name.endswith(suffix) and not sample_name.endswith("_blocks_total"):
            return sample_name[: -len(suffix)]
    return sample_name


def normalise_hisparse(series: Mapping[str, V]) -> dict[str, V]:
    """`series` (name -> values) with every HiSparse name it holds also under its canonical name; the
    first alias present wins. The host-pool usage fraction is derived from used/total where a build
    exposes only those (values must then be label->float mappings)."""
    out = dict(series)
    for canonical, aliases in HISPARSE_ALIASES.items():
        if canonical in series:
            continue
        for alias in aliases:
            name = HISPARSE_PREFIX + alias
            if name in series:
                out[canonical] = series[name]
                break
    if HISPARSE_HOST_USAGE not in out and _USED in out and _TOTAL in out:
        used, total = out[_USED], out[_TOTAL]
        if isinstance(used, Mapping) and isinstance(total, Mapping):
            out[HISPARSE_HOST_USAGE] = {k: used[k] / total[k] for k in used  # type: ignore[assignment]
                                        if k in total and total[k] > 0}
    return out


def families_of(samples: Iterable[Sample]) -> list[str]:
    return sorted({f for s in samples if (f := _hisparse_family(s.name)) is not None})


# ---- start lines ---------------------------------------------------------------------------------------

def lines_since_last_start(log_path: Path, max_bytes: int = 16 * 2**20) -> list[str]:
    """The server log's lines since the last start marker (at most the last `max_bytes`)."""
    try:
        with Path(log_path).open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(START_MARKER)]
    return lines[starts[-1] + 1:] if starts else lines


def _number(text: str) -> float:
    return float(text.replace(",", "").replace("_", ""))


def parse_start_lines(lines: Iterable[str]) -> HiSparseEvidence:
    """What HiSparse's start-up lines say (the first of each kind; TP workers repeat them)."""
    found: dict = {"start_lines": []}
    for line in lines:
        if "HiSparse" not in line:
            continue
        if "top_k" not in found and (m := _ENABLED_RE.search(line)):
            values = dict(_KEY_VALUE_RE.findall(m.group("rest")))
            found.update({k: _number(v) for k, v in values.items()})
            if lru := _LRU_RE.search(m.group("rest")):
                found["lru_rows"] = int(lru.group(1))
            found["top_k"] = found.get("top_k")
            found["start_lines"].append(line.strip())
        elif "host_source_gib" not in found and (m := _POOLS_RE.search(line)):
            found.update(host_source_gib=float(m.group("host_gib")), host_source_blocks=int(m.group("host_blocks")),
                         gpu_pool_gib=float(m.group("gpu_gib")), gpu_pool_blocks=int(m.group("gpu_blocks")))
            found["start_lines"].append(line.strip())
        elif "logged_max_concurrency" not in found and (m := _CONCURRENCY_RE.search(line)):
            found.update(logged_concurrency_tokens=int(_number(m.group("tokens"))),
                         logged_max_concurrency=float(m.group("x")))
            found["start_lines"].append(line.strip())
    for key in ("top_k", "device_buffer_size", "max_num_seqs"):
        if found.get(key) is not None:
            found[key] = int(found[key])
    return HiSparseEvidence.model_validate({k: v for k, v in found.items() if v is not None})


# ---- the calculator beside the logged concurrency -----------------------------------------------------

def predicted_concurrency(profile: LaunchProfile, seq_len: int) -> int | None:
    """The calculator's prediction for this arm at `seq_len` tokens per request (docs/facts.md §4).

    For the simulated engine the calculator is given the engine's own scaled pool and hot rows, so
    a difference means the engine and the calculator disagree, not that the sim is scaled."""
    try:
        if profile.engine == "sim":
            config = engine_config(profile)
            if config.policy != "hisparse":
                return None
            hisparse = profile.kv.hisparse
            inputs = CalcInputs.build(
                seq_len=seq_len, tp=profile.serve.tensor_parallel_size, dp=profile.serve.data_parallel_size or 1,
                kv_hbm_gib=config.sizing.kv_bytes_per_gpu / 2**30, max_num_seqs=config.max_num_seqs,
                layout="vllm", kv_dtype="fp8" if config.sizing.sparse_row_bytes < 1000 else "bf16",
                hot_rows=min(config.hot_rows, 32768), host_pool_gib=hisparse.host_pool_gib if hisparse else None,
                hisparse_enabled=True, gpu=profile.gpu or "H200")
            return calculate(inputs).predicted_total
        if profile.engine != "vllm" or "glm-5" not in profile.serve.model.lower():
            return None
        return sizing_for_launch(profile, seq_len).predicted_total
    except (CalcError, HarnessError, ValueError):
        return None


def assess(requested: bool, start: HiSparseEvidence, families: list[str],
           predicted: int | None) -> HiSparseEvidence:
    """The deployment's evidence record: what was seen, whether HiSparse is active, and the refusal
    (`problem`) when it was asked for and neither witness shows it."""
    active = bool(start.start_lines) or bool(families)
    problem = None
    if requested and not active:
        problem = (f"{INACTIVE}: no HiSparse start line in the server log and no {HISPARSE_PREFIX}* family in "
                   "its first /metrics scrape (a build that ignores the HiSparse flags?)")
    return start.model_copy(update={"hisparse_requested": requested, "hisparse_active": active, "metric_families": families,
                                    "predicted_concurrency": predicted, "problem": problem})


def concurrency_mismatch(evidence: HiSparseEvidence) -> str | None:
    """A warning where the logged steady-state concurrency and the calculator differ by more than one request."""
    logged, predicted = evidence.logged_max_concurrency, evidence.predicted_concurrency
    if logged is None or predicted is None or math.isclose(logged, predicted) or abs(logged - predicted) <= 1:
        return None
    return (f"the server logged a HiSparse steady-state maximum concurrency of {logged:g} for "
            f"{evidence.logged_concurrency_tokens:,} tokens per request; the calculator predicts {predicted}")


def check_hisparse(profile: LaunchProfile, log_path: Path, metrics_url: str, api_key: str | None = None,
                   log_wait_s: float = 2.0) -> HiSparseEvidence:
    """Read both witnesses of a ready server: its log since the last start, and one /metrics scrape
    (a scrape that fails counts as no family). The log is pumped by another thread: a start line not
    there yet gets `log_wait_s` to arrive."""
    requested = profile.kv.hisparse is not None
    deadline = time.monotonic() + log_wait_s
    while True:
        start = parse_start_lines(lines_since_last_start(log_path))
        if start.start_lines or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    try:
        families = families_of(scrape_once(metrics_url, keep_prefixes=[HISPARSE_PREFIX], api_key=api_key))
    except HarnessError:
        families = []
    tokens = start.logged_concurrency_tokens
    predicted = predicted_concurrency(profile, tokens) if tokens else None
    return assess(requested, start, families, predicted)


# ---- KV capacity at start-up (docs/facts.md §10) -------------------------------------------------------

_KV_LINE_RE = re.compile(r"(?:(?P<pools>[A-Z][\w +]*) KV cache size: (?P<tokens>[\d,]+) tokens, )?Maximum concurrency "
                         r"for (?P<length>[\d,]+) tokens per request: (?P<x>[\d.]+)x")
_REFUSAL_RE = re.compile(r"To serve at least one request with the model'?s max seq len \((?P<length>\d+)\)")
_ESTIMATE_RE = re.compile(r"estimated maximum model length is (?P<tokens>\d+)")


@dataclass(frozen=True)
class LoggedKvCapacity:
    """vLLM's start-up line on its KV cache: how many requests of max_model_len it holds at once."""

    max_concurrency: float
    tokens_per_request: int
    kv_cache_tokens: int | None
    pools: str | None


@dataclass(frozen=True)
class DoesNotFit:
    """vLLM refused the max_model_len at start-up: one request cannot fit the KV cache."""

    max_model_len: int
    estimated_max_len: int | None
    reason: str  # vLLM's message, as logged

    @property
    def summary(self) -> str:
        estimate = f"; vLLM estimates {self.estimated_max_len:,} tokens would fit" if self.estimated_max_len else ""
        return f"one request of {self.max_model_len:,} tokens cannot fit the KV cache{estimate}"


def parse_kv_capacity(lines: Iterable[str]) -> LoggedKvCapacity | None:
    """The last `Maximum concurrency for N tokens per request: X.XXx` line (with the KV cache size where the
    same line has it), or None."""
    found = None
    for line in lines:
        m = _KV_LINE_RE.search(line)
        if m:
            found = LoggedKvCapacity(max_concurrency=float(m.group("x")),
                                     tokens_per_request=int(m.group("length").replace(",", "")),
                                     kv_cache_tokens=int(m.group("tokens").replace(",", "")) if m.group("tokens")
                                     else None, pools=m.group("pools"))
    return found


def parse_does_not_fit(lines: Iterable[str]) -> DoesNotFit | None:
    """vLLM's refusal of a max_model_len that one request cannot fit, from a server's log lines."""
    for line in lines:
        m = _REFUSAL_RE.search(line)
        if m:
            text = line[m.start():].strip()
            estimate = _ESTIMATE_RE.search(text)
            return DoesNotFit(max_model_len=int(m.group("length")),
                              estimated_max_len=int(estimate.group("tokens")) if estimate else None, reason=text)
    return None
