"""The engine's state as Prometheus text with vLLM's names (docs/facts.md §2): the same families a vLLM
server of that arm exposes, labelled model_name=<served name> and engine="0" as vLLM v1 does. Offload
series only with an offload pool, HiSparse series only with HiSparse, spec-decode only with MTP."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from harness import vllm_names as names
from harness.metrics.prom import Sample, family_kept
from harness.sim.counters import EngineGauges, Histogram
from harness.sim.engine import Engine
from harness.vllm_names import family

MALFORMED_METRICS_TEXT = (
    f"# HELP {names.RUNNING} Number of requests in model execution batches.\n"
    f"# TYPE {names.RUNNING} gauge\n"
    f'{names.RUNNING}{{model_name="broken" 1.0\n'
    f"{names.KV_USAGE}{{{{{{ not a sample\n")


class EngineCollector:
    """`gauges` gives the scheduler's stats to show: by default the engine's state now (right for a
    driver that scrapes between steps); a live server passes the stats of the last step that ended."""

    def __init__(self, engine: Engine, served_model_name: str, gauges: Callable[[], EngineGauges] | None = None):
        self.engine = engine
        self.gauges = gauges or engine.gauges
        self.labels = ["model_name", "engine"]
        self.values = [served_model_name, "0"]

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=self.labels)
        g.add_metric(self.values, float(value))
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=self.labels)
        c.add_metric(self.values, float(value))
        return c

    def _histogram(self, name: str, doc: str, hist: Histogram) -> HistogramMetricFamily:
        h = HistogramMetricFamily(name, doc, labels=self.labels)
        h.add_metric(self.values, buckets=[(le, float(n)) for le, n in hist.cumulative()], sum_value=hist.sum_s)
        return h

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        g, c, h = self.gauges(), e.counters, e.histograms
        yield self._gauge(names.RUNNING, "Number of requests in model execution batches.",
                          g.num_requests_running)
        yield self._gauge(names.WAITING, "Number of requests waiting to be processed.",
                          g.num_requests_waiting)
        yield self._gauge(names.KV_USAGE, "KV-cache usage. 1 means 100 percent usage.",
                          g.kv_cache_usage_perc)
        yield self._counter(family(names.PREEMPTIONS), "Cumulative number of preemption from the engine.",
                            c.preemptions)
        yield self._counter(family(names.PROMPT_TOKENS), "Number of prefill tokens processed.", c.prompt_tokens)
        yield self._counter(family(names.GENERATION_TOKENS), "Number of generation tokens processed.",
                            c.generation_tokens)
        yield self._counter(family(names.PREFIX_QUERIES), "Prefix cache queries, in terms of number of "
                            "queried tokens.", c.prefix_cache_queries)
        yield self._counter(family(names.PREFIX_HITS), "Prefix cache hits, in terms of number of cached "
                            "tokens.", c.prefix_cache_hits)
        ok = CounterMetricFamily(family(names.REQUEST_SUCCESS), "Count of successfully processed requests.",
                                 labels=[*self.labels, "finished_reason"])
        ok.add_metric([*self.values, "length"], float(c.request_success - c.request_success_stop))
        ok.add_metric([*self.values, "stop"], float(c.request_success_stop))
        yield ok
        if e.cpu is not None:
            yield self._counter(family(names.EXTERNAL_PREFIX_QUERIES), "External prefix cache queries "
                                "from KV connector cross-instance cache sharing, in terms of number of "
                                "queried tokens.", c.external_prefix_cache_queries)
            yield self._counter(family(names.EXTERNAL_PREFIX_HITS), "External prefix cache hits from KV "
                                "connector cross-instance cache sharing, in terms of number of cached "
                                "tokens.", c.external_prefix_cache_hits)
            yield self._counter(family(names.OFFLOAD_LOAD_BYTES), "Bytes loaded from the CPU offload cache.",
                                c.kv_offload_load_bytes)
            yield self._counter(family(names.OFFLOAD_STORE_BYTES), "Bytes stored to the CPU offload cache.",
                                c.kv_offload_store_bytes)
            yield self._counter(family(names.OFFLOAD_LOAD_TIME), "Seconds spent loading from the CPU offload "
                                "cache.", c.kv_offload_load_time_s)
            yield self._counter(family(names.OFFLOAD_STORE_TIME), "Seconds spent storing to the CPU offload "
                                "cache.", c.kv_offload_store_time_s)
            yield self._gauge(names.OFFLOAD_CPU_USAGE, "CPU offload cache usage. 1 means "
                              "100 percent usage.", g.kv_offload_cpu_cache_usage_perc or 0.0)
        if e.host is not None:
            yield self._counter(family(names.HISPARSE_HITS), "HiSparse top-K rows served from GPU "
                                "(resident or hot buffer).", c.hisparse_cache_hits)
            yield self._counter(family(names.HISPARSE_MISSES), "HiSparse top-K rows copied from pinned host "
                                "memory.", c.hisparse_cache_misses)
            yield self._counter(family(names.HISPARSE_H2D_BYTES), "HiSparse bytes copied host to "
                                "device.", c.hisparse_host_to_device_bytes)
            yield self._gauge(names.HISPARSE_HOST_USAGE, "HiSparse host pool usage. 1 means "
                              "100 percent usage.", g.hisparse_host_cache_usage_perc or 0.0)
            yield self._gauge(names.HISPARSE_PENDING_PAGES, "HiSparse page copies queued.",
                              g.hisparse_pending_page_transfers or 0)
        if e.config.num_speculative_tokens:
            yield self._counter(family(names.SPEC_DRAFTS), "Number of spec decoding drafts.",
                                c.spec_decode_num_drafts)
            yield self._counter(family(names.SPEC_DRAFT_TOKENS), "Number of draft tokens.",
                                c.spec_decode_num_draft_tokens)
            yield self._counter(family(names.SPEC_ACCEPTED), "Number of accepted tokens.",
                                c.spec_decode_num_accepted_tokens)
        # vLLM's tokens-per-step histogram; only its count (the steps) and sum are modelled
        steps = HistogramMetricFamily(names.ITERATION_TOKENS, "Histogram of number of tokens per "
                                      "engine_step.", labels=self.labels)
        steps.add_metric(self.values, buckets=[("+Inf", float(c.steps))], sum_value=float(c.step_tokens))
        yield steps
        yield self._histogram(names.TTFT, "Histogram of time to first token in "
                              "seconds.", h.time_to_first_token)
        yield self._histogram(names.ITL, "Histogram of inter-token latency in "
                              "seconds.", h.inter_token_latency)
        yield self._histogram(names.TPOT, "Histogram of time_per_output_"
                              "token_seconds per request.", h.request_time_per_output_token)
        yield self._histogram(names.E2E_LATENCY, "Histogram of e2e request latency in "
                              "seconds.", h.e2e_request_latency)
        yield self._histogram(names.QUEUE_TIME, "Histogram of time spent in WAITING "
                              "phase for request.", h.request_queue_time)
        yield self._histogram(names.PREFILL_TIME, "Histogram of time spent in PREFILL "
                              "phase for request.", h.request_prefill_time)
        yield self._histogram(names.DECODE_TIME, "Histogram of time spent in DECODE "
                              "phase for request.", h.request_decode_time)


class MetricsText:
    """Renders an engine's metrics; one registry per engine (never the process-global one)."""

    def __init__(self, engine: Engine, served_model_name: str, gauges: Callable[[], EngineGauges] | None = None):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EngineCollector(engine, served_model_name, gauges))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def samples(self, keep_prefixes: Sequence[str] = ()) -> list[Sample]:
        """What `parse_exposition(render(), keep_prefixes)` gives, read from the families without the
        text: a simulated run scrapes thousands of times in virtual time, and writing then parsing the
        text was half its CPU. tests/test_sim_simulate.py holds the two equal on both arms."""
        return [Sample(name=s.name, labels=dict(s.labels), value=float(s.value))
                for family_ in self.registry.collect() if family_kept(family_.name, keep_prefixes)
                for s in family_.samples]
