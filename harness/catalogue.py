"""The metric catalogue: every number a point measures, declared once.

Each entry says what the number is (name, unit, meaning), which way is better, the regression rule it
gets by default, where it comes from, and how tables show it. Everything else reads this list:
`records.PointMetrics` (the fields), summary.csv and its documented columns (harness/summary.py), the
nightly gate's default thresholds and what a sweep may gate (harness/config/nightly.py), `compare` and
the one judge both apply (harness/judge.py), the change points and the dashboard's charts. Adding a
metric is one entry here (and the code in harness/metrics/ that computes it); a metric nothing computes
yet reads as empty, never as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["float", "int", "bool", "str"]
Better = Literal["higher", "lower"]
# where the number comes from: the server's /metrics scrapes, EvalScope's summary or its per-request rows,
# a formula over those, or the GPUs' telemetry
Source = Literal["scrapes", "client", "requests", "derived"]
# which record of point.json holds it: PointMetrics (`metrics`) or EvalScope's summary (`summary`)
Record = Literal["metrics", "summary"]
RuleKind = Literal["min_ratio", "max_ratio", "max_drop", "max_rise"]


@dataclass(frozen=True)
class Metric:
    name: str  # the field, the summary.csv column, the key a sweep's `nightly: thresholds:` uses
    unit: str
    meaning: str
    source: Source
    kind: Kind = "float"
    better: Better | None = None  # None: shown, never a regression by direction
    rule: tuple[RuleKind, float] | None = None  # the gate's default limit against the baseline; None: not gated
    label: str | None = None  # short header: set for the metrics comparison tables and the dashboard show
    digits: int = 2
    record: Record = "metrics"
    default: object = None  # the value before anything is measured (counts start at 0)

    @property
    def numeric(self) -> bool:
        return self.kind in ("float", "int")


def _m(name: str, unit: str, meaning: str, source: Source, **kw) -> Metric:
    return Metric(name, unit, meaning, source, **kw)


# Order is summary.csv's column order.
CATALOGUE: tuple[Metric, ...] = (
    _m("interactivity_tok_s_user", "tok/s/user", "1000 / mean TPOT (ms)", "derived", better="higher",
       rule=("min_ratio", 0.90), label="interactivity (tok/s/user)", digits=1),
    _m("total_tok_s_per_gpu", "tok/s/GPU",
       "EvalScope total token throughput (re-sent history included) / gpus_per_server", "derived",
       better="higher", rule=("min_ratio", 0.90), label="total (tok/s/GPU)", digits=0),
    _m("output_tok_s_per_gpu", "tok/s/GPU", "EvalScope output token throughput / gpus_per_server", "derived",
       better="higher", rule=("min_ratio", 0.90), label="output (tok/s/GPU)", digits=1),
    _m("mean_ttft_ms", "ms", "mean time to first token (EvalScope)", "client", better="lower",
       rule=("max_ratio", 1.15), label="TTFT (ms)", digits=0),
    _m("mean_tpot_ms", "ms", "mean time per output token after the first (EvalScope)", "client", better="lower"),
    # Percentiles over the point's succeeded requests, from EvalScope's per-request rows (benchmark_data.db; in
    # virtual time the simulated requests): numpy's linear interpolation (harness/metrics/derive.py PERCENTILE_METHOD)
    _m("ttft_p50_ms", "ms", "median time to first token over the succeeded requests", "requests", better="lower",
       digits=0),
    _m("ttft_p90_ms", "ms", "p90 time to first token over the succeeded requests", "requests", better="lower",
       digits=0),
    _m("ttft_p99_ms", "ms", "p99 time to first token over the succeeded requests", "requests", better="lower",
       digits=0),
    _m("tpot_p50_ms", "ms", "median per-request TPOT, (latency - TTFT) / (output tokens - 1), over the succeeded "
       "requests of two tokens or more", "requests", better="lower"),
    _m("tpot_p90_ms", "ms", "p90 per-request TPOT over the succeeded requests of two tokens or more", "requests",
       better="lower"),
    _m("tpot_p99_ms", "ms", "p99 per-request TPOT over the succeeded requests of two tokens or more", "requests",
       better="lower"),
    _m("itl_p50_ms", "ms", "median inter-token latency: every gap between streamed chunks of the succeeded "
       "requests, pooled", "requests", better="lower"),
    _m("itl_p90_ms", "ms", "p90 inter-token latency over every chunk gap of the succeeded requests", "requests",
       better="lower"),
    _m("itl_p99_ms", "ms", "p99 inter-token latency over every chunk gap of the succeeded requests", "requests",
       better="lower"),
    _m("e2e_p50_s", "s", "median end-to-end request latency over the succeeded requests", "requests",
       better="lower", digits=3),
    _m("e2e_p90_s", "s", "p90 end-to-end request latency over the succeeded requests", "requests", better="lower",
       digits=3),
    _m("e2e_p99_s", "s", "p99 end-to-end request latency over the succeeded requests", "requests", better="lower",
       digits=3),
    # Goodput under the sweep's `slo:` section (empty without one): the requests that met every limit on their own
    _m("goodput_req_s", "req/s", "succeeded requests that met every SLO limit on their own (TTFT, TPOT, "
       "interactivity, latency) / EvalScope duration; empty without an slo", "requests", better="higher"),
    _m("goodput_tok_s_per_gpu", "tok/s/GPU", "prompt + completion tokens of the requests that met the SLO / "
       "EvalScope duration / gpus_per_server; empty without an slo", "requests", better="higher", digits=0),
    _m("slo_met", "", "the point met the sweep's SLO: its p90 TTFT, TPOT and latency and its interactivity "
       "within every limit given; empty without an slo or where a limit's value is unknown", "derived",
       kind="bool"),
    _m("occupancy_mean_running", "requests", "mean of the non-zero vllm:num_requests_running samples", "scrapes",
       better="higher", rule=("max_drop", 1.0), label="occupancy (req)", digits=1),
    _m("mean_waiting", "requests", "mean of vllm:num_requests_waiting samples", "scrapes"),
    _m("max_running", "requests", "largest vllm:num_requests_running sample", "scrapes"),
    _m("decode_batch_mean", "requests",
       "d(vllm:generation_tokens_total) / d(engine steps) / MTP acceptance length: requests per step", "scrapes"),
    _m("occupancy_disagrees", "", "abs(occupancy_mean_running - decode_batch_mean) > 0.3 requests: the sampled "
       "gauge and the engine's counters tell another occupancy; the report and figure show both", "derived",
       kind="bool"),
    _m("mtp_acceptance_length", "tokens/step", "1 + d(accepted tokens) / d(drafts); empty without MTP", "scrapes",
       better="higher", rule=("min_ratio", 0.95), label="accept len", digits=2),
    _m("preemptions", "count", "d(vllm:num_preemptions_total) over the point", "scrapes", better="lower"),
    _m("kv_usage_mean", "fraction", "mean GPU KV cache usage (0..1)", "scrapes"),
    _m("kv_usage_max", "fraction", "largest GPU KV cache usage sample (0..1)", "scrapes"),
    _m("offload_load_bytes", "bytes", "d(vllm:kv_offload_load_bytes_total), host to GPU", "scrapes"),
    _m("offload_store_bytes", "bytes", "d(vllm:kv_offload_store_bytes_total), GPU to host", "scrapes"),
    _m("offload_load_bytes_per_s", "B/s", "offload load bytes / point window", "scrapes"),
    _m("offload_store_bytes_per_s", "B/s", "offload store bytes / point window", "scrapes"),
    _m("hisparse_hit_rate", "fraction", "d(hisparse hits) / (d(hits) + d(misses))", "scrapes", better="higher"),
    _m("hisparse_misses", "count", "d(HiSparse misses) over the point (sampled every 2,000 steps)", "scrapes"),
    _m("hisparse_h2d_bytes", "bytes", "d(HiSparse host-to-device bytes) over the point", "scrapes"),
    _m("hisparse_h2d_bytes_per_s", "B/s", "d(vllm:hisparse_host_to_device_bytes_total) / window", "scrapes"),
    _m("hisparse_host_usage_max", "fraction", "largest HiSparse host pool usage sample (0..1)", "scrapes"),
    _m("server_prompt_tokens", "tokens", "d(vllm:prompt_tokens_total) over the point: re-sent history included",
       "scrapes"),
    _m("prefix_cache_hit_rate", "fraction", "d(prefix cache hits) / d(prefix cache queries)", "scrapes"),
    _m("server_tpot_ms", "ms", "server TPOT: d(sum) / d(count) of vllm:request_time_per_output_token_seconds",
       "scrapes", better="lower"),
    _m("tpot_rel_diff", "fraction", "(server - client) / client TPOT", "derived"),
    _m("tpot_disagrees", "", "abs(tpot_rel_diff) > 0.10: the measurement itself is in doubt", "derived",
       kind="bool"),
    _m("tpot_client_low", "", "tpot_rel_diff > 0.10: the client got the stream late and in bursts; "
       "interactivity is overstated", "derived", kind="bool"),
    _m("server_interactivity_tok_s_user", "tok/s/user", "1000 / server_tpot_ms", "derived", better="higher"),
    _m("counter_resets", "count", "counters seen going down (server restart) in the point", "scrapes", kind="int",
       default=0),
    _m("scrapes_ok", "count", "/metrics scrapes that succeeded in the point", "scrapes", kind="int", default=0),
    _m("scrapes_failed", "count", "/metrics scrapes that failed in the point", "scrapes", kind="int", default=0),
    _m("window_s", "s", "time between the point's first and last scrape", "scrapes"),
    # EvalScope's own summary (benchmark_summary.json), under one key set whatever its version
    _m("total_requests", "requests", "requests EvalScope sent", "client", kind="int", record="summary"),
    _m("success_requests", "requests", "requests that succeeded", "client", kind="int", record="summary"),
    _m("failed_requests", "requests", "requests that failed", "client", kind="int", record="summary"),
    _m("total_throughput_tok_s", "tok/s", "EvalScope total token throughput of the server", "client",
       record="summary"),
    _m("output_throughput_tok_s", "tok/s", "EvalScope output token throughput of the server", "client",
       record="summary"),
    _m("request_throughput_req_s", "req/s", "EvalScope request throughput", "client", record="summary"),
    _m("mean_itl_ms", "ms", "mean inter-token latency (EvalScope)", "client", record="summary"),
    _m("mean_latency_s", "s", "mean request latency (EvalScope)", "client", record="summary"),
    _m("mean_input_tokens", "tokens", "mean prompt tokens per request (EvalScope)", "client", record="summary"),
    _m("mean_output_tokens", "tokens", "mean output tokens per request (EvalScope)", "client", record="summary"),
    _m("time_taken_s", "s", "EvalScope benchmark duration", "client", record="summary"),
    _m("key_set", "", "EvalScope summary key set read: <=1.9 or >=1.10", "client", kind="str", record="summary"),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in CATALOGUE}
assert len(BY_NAME) == len(CATALOGUE), "a metric is declared twice"


def metrics(record: Record | None = None) -> tuple[Metric, ...]:
    """The catalogue, or the entries one record holds, in column order."""
    return tuple(m for m in CATALOGUE if record is None or m.record == record)


def gated_by_default() -> tuple[Metric, ...]:
    """The metrics the nightly gate and `compare` judge unless a sweep says otherwise."""
    return tuple(m for m in CATALOGUE if m.rule is not None)


def table_metrics() -> tuple[Metric, ...]:
    """The metrics comparison tables and the dashboard show, in order."""
    return tuple(m for m in CATALOGUE if m.label is not None)


def gateable() -> frozenset[str]:
    """What a sweep may gate: every numeric metric a point measures."""
    return frozenset(m.name for m in CATALOGUE if m.numeric)


def better(name: str) -> Better | None:
    metric = BY_NAME.get(name)
    return metric.better if metric is not None else None
