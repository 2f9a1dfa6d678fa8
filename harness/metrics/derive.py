"""Per-point metrics from one point's /metrics scrapes and its EvalScope summary (docs/metrics.md).

Conventions, as the metric definitions require:
- Samples of one name are combined across label sets per scrape (several engines under data
  parallelism): counts add up, fractions (KV usage) are averaged.
- Counters are read as the sum of their increases between the first and the last good scrape
  of the window, per label set; a drop (server restart) counts the new value from zero.
- A metric the server does not expose, or one with nothing to divide by, is None, never 0.
- window_s is the span the counter deltas cover: first to last good scrape in the window.
- Latency percentiles and goodput come from the point's per-request rows (EvalScope's benchmark_data.db, or the
  simulated requests as such rows), over the requests that succeeded (RequestRow.ok), with one percentile
  method (PERCENTILE_METHOD) for both the served and the virtual-time path.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from harness import vllm_names as names
from harness.config.sweep import SloSettings
from harness.evidence import (
    HISPARSE_H2D_BYTES,
    HISPARSE_HITS,
    HISPARSE_HOST_USAGE,
    HISPARSE_MISSES,
    normalise_hisparse,
)
from harness.metrics.evalscope_requests import RequestRow
from harness.metrics.scrape import ScrapeRecord
from harness.records import EvalScopeSummary, PointMetrics

# Client and server TPOT share one formula, (last token - first token) / (tokens - 1) averaged over
# requests, and differ only in where the two instants are taken (docs/tpot.md).
TPOT_DISAGREEMENT = 0.10
# How far the sampled running gauge and the engine's decode batch may differ before a point says so.
OCCUPANCY_MARGIN_REQ = 0.3

# The series, by their names in harness/vllm_names.py; HiSparse series are read under the canonical names
# harness/evidence.py maps every build's names onto.
KV_USAGE = (names.KV_USAGE, names.KV_USAGE_OLD)
SERVER_TPOT = names.TPOT
# Counters every vLLM exposes: a restart shows in them even when no derived metric reads them.
RESET_WITNESSES = (names.PROMPT_TOKENS, names.GENERATION_TOKENS, names.REQUEST_SUCCESS)

LabelKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Snapshot:
    """One good scrape: every finite sample, by name then label set."""

    t: float
    series: dict[str, dict[LabelKey, float]]


@dataclass(frozen=True)
class CounterDelta:
    delta: float
    reset_steps: frozenset[int]  # indices of the snapshots at which some label set went down


@dataclass(frozen=True)
class Scrapes:
    snapshots: list[Snapshot]  # good scrapes in time order
    failed: int


def group_scrapes(records: Iterable[ScrapeRecord], window: tuple[float, float] | None = None) -> Scrapes:
    """The scrapes inside `window` (inclusive), good ones as snapshots, failed ones counted."""
    grouped: dict[tuple[int, float], list[ScrapeRecord]] = {}
    for r in records:
        if window is None or window[0] <= r.t <= window[1]:
            grouped.setdefault((r.scrape, r.t), []).append(r)
    snapshots: list[Snapshot] = []
    failed = 0
    for (_, t), recs in grouped.items():
        if any(r.failed for r in recs):
            failed += 1
            continue
        series: dict[str, dict[LabelKey, float]] = {}
        for r in recs:
            if r.name is not None and r.value is not None and math.isfinite(r.value):
                series.setdefault(r.name, {})[tuple(sorted(r.labels.items()))] = r.value
        snapshots.append(Snapshot(t=t, series=normalise_hisparse(series)))
    snapshots.sort(key=lambda s: s.t)
    return Scrapes(snapshots=snapshots, failed=failed)


# --- one helper per kind of series -------------------------------------------------------------

def _gauge_series(snapshots: list[Snapshot], name: str,
                 combine: Callable[[list[float]], float] = sum) -> list[float]:
    """Per scrape, the gauge's label sets combined into one value; scrapes without it are left out."""
    return [combine(list(s.series[name].values())) for s in snapshots if s.series.get(name)]


def counter_delta(snapshots: list[Snapshot], name: str) -> CounterDelta | None:
    """Increase over the snapshots, per label set, summed; None when fewer than two scrapes show it."""
    by_label: dict[LabelKey, list[tuple[int, float]]] = {}
    for i, s in enumerate(snapshots):
        for key, value in s.series.get(name, {}).items():
            by_label.setdefault(key, []).append((i, value))
    steps = [pts for pts in by_label.values() if len(pts) >= 2]
    if not steps:
        return None
    delta = 0.0
    resets: set[int] = set()
    for points in steps:
        for (_, before), (i, after) in zip(points, points[1:], strict=False):
            if after >= before:
                delta += after - before
            else:  # restarted: it counted from zero up to `after` since
                delta += after
                resets.add(i)
    return CounterDelta(delta=delta, reset_steps=frozenset(resets))


def histogram_mean(snapshots: list[Snapshot], base: str) -> tuple[float | None, frozenset[int]]:
    """d(sum)/d(count) of a histogram over the snapshots, with the reset steps its counters saw."""
    total, count = counter_delta(snapshots, f"{base}_sum"), counter_delta(snapshots, f"{base}_count")
    resets = _resets(total, count)
    if total is None or count is None or count.delta <= 0:
        return None, resets
    return total.delta / count.delta, resets


def _resets(*deltas: CounterDelta | None) -> frozenset[int]:
    return frozenset().union(*(d.reset_steps for d in deltas if d is not None))


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def _value(delta: CounterDelta | None) -> float | None:
    return None if delta is None else delta.delta


# --- the point's metrics -----------------------------------------------------------------------

def _client_metrics(summary: EvalScopeSummary | None, gpus_per_server: int) -> dict[str, float | None]:
    if summary is None:
        return {}
    tpot = summary.mean_tpot_ms
    return {
        "interactivity_tok_s_user": 1000.0 / tpot if tpot is not None and tpot > 0 else None,
        "total_tok_s_per_gpu": _ratio(summary.total_throughput_tok_s, gpus_per_server),
        "output_tok_s_per_gpu": _ratio(summary.output_throughput_tok_s, gpus_per_server),
        "mean_ttft_ms": summary.mean_ttft_ms,
        "mean_tpot_ms": tpot,
    }


def _gauge_metrics(snapshots: list[Snapshot]) -> dict[str, float | None]:
    running = _gauge_series(snapshots, names.RUNNING)
    waiting = _gauge_series(snapshots, names.WAITING)
    kv_name = next((n for n in KV_USAGE if _gauge_series(snapshots, n)), None)
    kv_mean = _gauge_series(snapshots, kv_name, statistics.fmean) if kv_name else []
    kv_max = _gauge_series(snapshots, kv_name, max) if kv_name else []
    busy = [v for v in running if v != 0]
    host_usage = _gauge_series(snapshots, HISPARSE_HOST_USAGE, max)
    return {
        "hisparse_host_usage_max": max(host_usage) if host_usage else None,
        # no scrape in the window saw a request running (a short point, a late gauge): unknown, not 0
        "occupancy_mean_running": statistics.fmean(busy) if busy else None,
        "mean_waiting": statistics.fmean(waiting) if waiting else None,
        "max_running": max(running) if running else None,
        "kv_usage_mean": statistics.fmean(kv_mean) if kv_mean else None,
        "kv_usage_max": max(kv_max) if kv_max else None,
    }


def _counter_metrics(snapshots: list[Snapshot], window_s: float | None) -> tuple[dict, frozenset[int]]:
    d = {name: counter_delta(snapshots, name) for name in (
        names.PREEMPTIONS, names.SPEC_ACCEPTED, names.SPEC_DRAFTS, names.OFFLOAD_LOAD_BYTES, names.OFFLOAD_STORE_BYTES, HISPARSE_HITS,
        HISPARSE_MISSES, HISPARSE_H2D_BYTES, names.PREFIX_QUERIES, names.PREFIX_HITS, *RESET_WITNESSES,
        f"{names.ITERATION_TOKENS}_count")}
    seconds = window_s if window_s is not None and window_s > 0 else None
    hits, misses = _value(d[HISPARSE_HITS]), _value(d[HISPARSE_MISSES])
    accepted_per_draft = _ratio(_value(d[names.SPEC_ACCEPTED]), _value(d[names.SPEC_DRAFTS]))
    server_tpot_s, tpot_resets = histogram_mean(snapshots, SERVER_TPOT)
    acceptance = None if accepted_per_draft is None else 1.0 + accepted_per_draft
    metrics = {
        "mtp_acceptance_length": acceptance,
        "decode_batch_mean": _decode_batch(_value(d[names.GENERATION_TOKENS]), _value(d[f"{names.ITERATION_TOKENS}_count"]),
                                           acceptance, speculating=d[names.SPEC_DRAFTS] is not None),
        "preemptions": _value(d[names.PREEMPTIONS]),
        "offload_load_bytes": _value(d[names.OFFLOAD_LOAD_BYTES]),
        "offload_store_bytes": _value(d[names.OFFLOAD_STORE_BYTES]),
        "offload_load_bytes_per_s": _ratio(_value(d[names.OFFLOAD_LOAD_BYTES]), seconds),
        "offload_store_bytes_per_s": _ratio(_value(d[names.OFFLOAD_STORE_BYTES]), seconds),
        "hisparse_hit_rate": _ratio(hits, None if hits is None or misses is None else hits + misses),
        "hisparse_misses": misses,
        "hisparse_h2d_bytes": _value(d[HISPARSE_H2D_BYTES]),
        "hisparse_h2d_bytes_per_s": _ratio(_value(d[HISPARSE_H2D_BYTES]), seconds),
        "prefix_cache_hit_rate": _ratio(_value(d[names.PREFIX_HITS]), _value(d[names.PREFIX_QUERIES])),
        "server_prompt_tokens": _value(d[names.PROMPT_TOKENS]),
        "server_tpot_ms": None if server_tpot_s is None else 1000.0 * server_tpot_s,
        # the engine's own decode rate per user: the figure to put beside the headline when the
        # client's stream arrived late and in bursts (tpot_client_low)
        "server_interactivity_tok_s_user": (1.0 / server_tpot_s if server_tpot_s is not None
                                            and server_tpot_s > 0 else None),
    }
    return metrics, _resets(*d.values()) | tpot_resets


def _decode_batch(generated: float | None, steps: float | None, acceptance: float | None, *,
                  speculating: bool) -> float | None:
    """Requests that generated per engine step: tokens generated / steps, over tokens per request-step.

    Counters, so only the first and last scrape matter: where the frontend answers /metrics late (a
    busy host) the running gauge can miss every busy moment of a point, these cannot."""
    per_step = _ratio(generated, steps)
    if not speculating or per_step is None:
        return per_step
    return None if acceptance is None else per_step / acceptance


def derive_point_metrics(records: list[ScrapeRecord], summary: EvalScopeSummary | None,
                         gpus_per_server: int,
                         window: tuple[float, float] | None = None,
                         rows: Sequence[RequestRow] | None = None,
                         slo: SloSettings | None = None) -> PointMetrics:
    """The point's metrics from its scrapes (those inside `window` when given), EvalScope summary, and
    per-request rows (latency percentiles; goodput and the SLO verdict under `slo`)."""
    if gpus_per_server < 1:
        raise ValueError(f"gpus_per_server must be >= 1, got {gpus_per_server}")
    scrapes = group_scrapes(records, window)
    snapshots = scrapes.snapshots
    window_s = snapshots[-1].t - snapshots[0].t if snapshots else None
    client = _client_metrics(summary, gpus_per_server)
    counters, resets = _counter_metrics(snapshots, window_s)
    gauges = _gauge_metrics(snapshots)
    latency = latency_percentiles(rows) if rows is not None else {}
    service: dict[str, float | bool | None] = {}
    if slo is not None:
        duration = summary.time_taken_s if summary is not None else None
        service = goodput(rows, slo, duration, gpus_per_server) if rows is not None else {}
        service["slo_met"] = slo_met(slo_checks(slo, {**client, **latency}))
    return PointMetrics(
        **client, **gauges, **counters, **latency, **service,
        **_tpot_check(counters["server_tpot_ms"], client.get("mean_tpot_ms")),
        **_occupancy_check(gauges.get("occupancy_mean_running"), counters.get("decode_batch_mean")),
        counter_resets=len(resets), scrapes_ok=len(snapshots), scrapes_failed=scrapes.failed,
        window_s=window_s,
    )


def _occupancy_check(gauge: float | None, batch: float | None) -> dict[str, bool]:
    """Occupancy measured two ways (docs/metrics.md): the sampled running gauge and the engine's requests
    per step from its counters. Where both exist and differ by more than OCCUPANCY_MARGIN_REQ, the point
    says so, and the report and figure show both."""
    if gauge is None or batch is None:
        return {}
    return {"occupancy_disagrees": abs(gauge - batch) > OCCUPANCY_MARGIN_REQ}


def _tpot_check(server_ms: float | None, client_ms: float | None) -> dict[str, float | bool | None]:
    """The harness checks its own measurement: client TPOT against the server's histogram.

    The direction says which side to doubt. The engine stamps first and last token as it makes
    them; the client as chunks arrive. A client TPOT well below the server's means the client got
    its first token late and the rest in a burst (an API server short of CPU, a buffering proxy):
    the decode it timed is shorter than the one that ran, so the headline interactivity is
    overstated. A client TPOT well above means delivery added time the engine did not spend: what
    users saw, but not the engine's speed.
    """
    if server_ms is None or client_ms is None or client_ms <= 0:
        return {}
    rel = (server_ms - client_ms) / client_ms
    return {"tpot_rel_diff": rel, "tpot_disagrees": abs(rel) > TPOT_DISAGREEMENT,
            "tpot_client_low": rel > TPOT_DISAGREEMENT}


# --- latency percentiles and goodput, from the per-request rows ---------------------------------------

PERCENTILES = (50, 90, 99)
# numpy.percentile's default: linear interpolation between the closest ranks, (n - 1) * q / 100 as the
# 0-based position. EvalScope's own benchmark_percentile.json takes the nearest rank (and rounds to 4 digits),
# so on few requests its figures differ from these.
PERCENTILE_METHOD = "linear"
# (column prefix, unit): ttft_p90_ms, tpot_p90_ms, itl_p90_ms, e2e_p90_s
LATENCIES = (("ttft", "ms"), ("tpot", "ms"), ("itl", "ms"), ("e2e", "s"))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) of values by PERCENTILE_METHOD; None for no values."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q, method=PERCENTILE_METHOD))


def percentile_name(base: str, q: int, unit: str) -> str:
    return f"{base}_p{q}_{unit}"


def _latency_samples(rows: Iterable[RequestRow]) -> dict[str, list[float]]:
    """Per latency, its samples in the column's unit, over the succeeded requests (RequestRow.ok): TTFT and
    end-to-end latency one per request, TPOT one per request of two output tokens or more (EvalScope's
    definition, RequestRow.tpot_s), ITL every gap between streamed chunks, pooled over the requests."""
    ok = [r for r in rows if r.ok]
    return {
        "ttft": [1000.0 * r.first_chunk_s for r in ok if r.first_chunk_s is not None],
        "tpot": [1000.0 * r.tpot_s for r in ok if r.tpot_s is not None],
        "itl": [1000.0 * gap for r in ok for gap in r.chunk_gaps_s],
        "e2e": [r.latency_s for r in ok if r.latency_s is not None],
    }


def latency_percentiles(rows: Iterable[RequestRow]) -> dict[str, float | None]:
    """p50/p90/p99 of TTFT, TPOT, ITL (ms) and end-to-end latency (s): ttft_p90_ms and so on."""
    samples = _latency_samples(rows)
    return {percentile_name(base, q, unit): percentile(samples[base], q)
            for base, unit in LATENCIES for q in PERCENTILES}


def request_meets_slo(row: RequestRow, slo: SloSettings) -> bool:
    """A succeeded request within every limit given, on its own numbers: its TTFT, its TPOT (and 1000 / TPOT
    in ms as its interactivity), its latency. A reply of one token has no TPOT: the TPOT and interactivity
    limits do not apply to it (as vLLM's benchmark counts it)."""
    if not row.ok:
        return False
    tpot = row.tpot_s
    if slo.ttft_p90_max_s is not None and row.first_chunk_s > slo.ttft_p90_max_s:
        return False
    if slo.e2e_p90_max_s is not None and row.latency_s > slo.e2e_p90_max_s:
        return False
    if tpot is not None:
        if slo.tpot_p90_max_ms is not None and 1000.0 * tpot > slo.tpot_p90_max_ms:
            return False
        if slo.interactivity_min_tok_s_user is not None and tpot > 0 \
                and 1.0 / tpot < slo.interactivity_min_tok_s_user:
            return False
    return True


def goodput(rows: Iterable[RequestRow], slo: SloSettings, duration_s: float | None,
            gpus_per_server: int) -> dict[str, float | None]:
    """Requests per second, and prompt + completion tokens per second per GPU, of the requests that met the
    SLO, over the point's EvalScope duration; empty without a duration."""
    if duration_s is None or duration_s <= 0:
        return {"goodput_req_s": None, "goodput_tok_s_per_gpu": None}
    good = [r for r in rows if request_meets_slo(r, slo)]
    tokens = sum((r.prompt_tokens or 0) + (r.completion_tokens or 0) for r in good)
    return {"goodput_req_s": len(good) / duration_s,
            "goodput_tok_s_per_gpu": tokens / duration_s / gpus_per_server}


@dataclass(frozen=True)
class SloCheck:
    """One limit of the SLO against the point's value (in the limit's unit)."""

    limit: str  # the sweep's key: ttft_p90_max_s, tpot_p90_max_ms, e2e_p90_max_s, interactivity_min_tok_s_user
    what: str
    unit: str
    bound: float
    value: float | None
    at_least: bool = False

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.bound if self.at_least else self.value <= self.bound

    def text(self) -> str:
        """`p90 TTFT 2.31 s > 2 s (ttft_p90_max_s)`."""
        if self.value is None:
            return f"{self.what} unknown ({self.limit} {self.bound:g} {self.unit})"
        sign = ("<" if self.met is False else ">=") if self.at_least else (">" if self.met is False else "<=")
        return f"{self.what} {self.value:.4g} {self.unit} {sign} {self.bound:g} {self.unit} ({self.limit})"


def slo_checks(slo: SloSettings, metrics: Mapping[str, object]) -> list[SloCheck]:
    """Every limit the SLO gives, against the point's p90s and mean interactivity (metrics by column name: a
    PointMetrics dump or the values being derived)."""

    def value(name: str, per: float = 1.0) -> float | None:
        raw = metrics.get(name)
        return None if raw is None else float(raw) / per  # type: ignore[arg-type]

    checks = []
    if slo.ttft_p90_max_s is not None:
        checks.append(SloCheck("ttft_p90_max_s", "p90 TTFT", "s", slo.ttft_p90_max_s, value("ttft_p90_ms", 1000.0)))
    if slo.tpot_p90_max_ms is not None:
        checks.append(SloCheck("tpot_p90_max_ms", "p90 TPOT", "ms", slo.tpot_p90_max_ms, value("tpot_p90_ms")))
    if slo.e2e_p90_max_s is not None:
        checks.append(SloCheck("e2e_p90_max_s", "p90 latency", "s", slo.e2e_p90_max_s, value("e2e_p90_s")))
    if slo.interactivity_min_tok_s_user is not None:
        checks.append(SloCheck("interactivity_min_tok_s_user", "interactivity", "tok/s/user",
                               slo.interactivity_min_tok_s_user, value("interactivity_tok_s_user"), at_least=True))
    return checks


def slo_met(checks: Sequence[SloCheck]) -> bool | None:
    """False where some limit is missed, None where none is but some value is unknown, else True."""
    verdicts = [c.met for c in checks]
    if False in verdicts:
        return False
    return None if None in verdicts else True
