"""`GET /metrics` on `prometheus_client`: one `CollectorRegistry` per service, holding one
custom collector that reads the live service state at scrape time (it runs inside the
engine task, so a scrape is one consistent view). No global registry: several services in
one process (tests, the cluster's co-simulation) never clash.

Naming: the `topas_` prefix, not `topas:`. vLLM (`vllm:`) and SGLang (`sglang:`) use a
colon, but Prometheus reserves colons for recording rules ("exporters and direct
instrumentation should not use them", prometheus.io naming practices). Where vLLM/SGLang
have a metric with the same meaning we take their name after the prefix
(`num_requests_running`, `num_requests_waiting`, `kv_cache_usage_perc`,
`generation_tokens_total`); units are in the names (`_seconds`, `_tokens`), counters end in
`_total`. The full list is in docs/server.md ("Stats and metrics").
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector

from .stats import LOCATIONS, engine_stats_json, engine_view, jct_summary, prefixes_by_location

if TYPE_CHECKING:
    from .calls import CallRecord
    from .service import SimService

# `generate_latest` with its default (underscore) escaping writes text format 0.0.4 for our
# legacy-valid names, and prometheus_client's own HTTP handlers pair it with this header
# (`choose_encoder` sends CONTENT_TYPE_LATEST, version 1.0.0, only when the scraper's
# Accept asks for it). The cluster front re-serves the merged text under the same header.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
PREFIX = "topas_"
NAN = float("nan")

# (EngineStats field, metric name, help): counters every engine reports (0 when missing).
CORE_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("decisions", "decisions", "Scheduling decisions made"),
    ("preemptions", "preemptions", "Requests preempted"),
    ("prefix_swaps_in", "prefix_swaps_in", "Agent prefixes swapped in (host to GPU)"),
    ("prefix_swaps_out", "prefix_swaps_out", "Agent prefixes swapped out (GPU to host)"),
)
# Counters only the simulator reports: emitted when the engine's stats have the field.
EXTRA_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("prefix_recomputes", "prefix_recomputes", "Agent prefixes recomputed (prefilled again)"),
    ("tokens_generated", "generation_tokens", "Output tokens decoded"),
    ("prefill_tokens", "prefill_tokens", "Uncached tokens prefilled (prefix recomputes included)"),
    ("busy_s", "engine_busy_seconds", "Simulated GPU time spent in prefill or decode steps"),
)
JCT_QUANTILES: tuple[tuple[str, str], ...] = (("0.5", "p50_s"), ("0.9", "p90_s"), ("0.99", "p99_s"))
# vLLM's bucket bounds for the metrics of the same names, so dashboards carry over.
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                 240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


def _num(value: Any) -> float:
    """A sample value; None (no data yet) is NaN, as Prometheus summaries report it."""
    return NAN if value is None else float(value)


def _summary(name: str, help_: str, quantiles: Mapping[str, Any], sum_: float, count: float) -> Metric:
    """A summary family with quantile samples (SummaryMetricFamily has no quantiles)."""
    fam = Metric(PREFIX + name, help_, "summary")
    for q, value in quantiles.items():
        fam.add_sample(fam.name, {"quantile": q}, _num(value))
    fam.add_sample(fam.name + "_sum", {}, float(sum_))
    fam.add_sample(fam.name + "_count", {}, float(count))
    return fam


def _gauge(name: str, help_: str, value: Any) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, help_, value=_num(value))


def _counter(name: str, help_: str, value: Any) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, help_, value=_num(value))


@dataclass(slots=True)
class LatencyHistogram:
    """Cumulative histogram state, fed inside the engine task (no lock needed) and read by
    the collector; kept by hand so no `_created` series and no global switch are involved."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, the last one is +Inf
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: a value on a bound counts in it
        self.total += value

    def family(self, name: str, help_: str) -> HistogramMetricFamily:
        cumulative, running = [], 0
        for le, n in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += n
            cumulative.append((le, running))
        return HistogramMetricFamily(PREFIX + name, help_, buckets=cumulative, sum_value=self.total)


@dataclass(slots=True)
class CallLatency:
    """Per-call latency histograms in simulated seconds, observed as calls end ok."""

    e2e: LatencyHistogram = field(default_factory=lambda: LatencyHistogram(E2E_BUCKETS_S))
    ttft: LatencyHistogram = field(default_factory=lambda: LatencyHistogram(TTFT_BUCKETS_S))

    def observe(self, record: CallRecord) -> None:
        if record.finish_s is not None:
            self.e2e.observe(max(0.0, record.finish_s - record.arrival_s))
        if record.first_token_s is not None:
            self.ttft.observe(max(0.0, record.first_token_s - record.arrival_s))

    def families(self) -> Iterator[Metric]:
        yield self.e2e.family("e2e_request_latency_seconds",
                              "Call latency from arrival to finish (simulated seconds; calls that ended ok)")
        yield self.ttft.family("time_to_first_token_seconds",
                               "Call latency from arrival to the first token (simulated seconds; calls that ended ok)")


class ServiceCollector(Collector):
    """Everything /metrics says about one `SimService`, read when scraped."""

    def __init__(self, svc: SimService, latency: CallLatency | None = None) -> None:
        self.svc = svc
        self.latency = latency

    def describe(self) -> list[Metric]:
        return []  # names depend on the engine's stats: never pre-registered

    def collect(self) -> Iterator[Metric]:
        yield from self._server()
        yield from self._engine_state()
        yield from self._engine_counters()
        yield from self._tasks()
        if self.latency is not None:
            yield from self.latency.families()

    def _server(self) -> Iterator[Metric]:
        svc, cfg = self.svc, self.svc.config
        info = InfoMetricFamily(PREFIX + "server", "The server's configuration")
        info.add_metric([], {"engine": str(cfg.engine), "policy": str(cfg.policy), "profile": str(cfg.profile),
                             "responder": str(cfg.responder), "model": str(cfg.model_name)})
        yield info
        http = CounterMetricFamily(PREFIX + "http_requests", "HTTP responses by route and status code",
                                   labels=("endpoint", "status"))
        for (endpoint, status), n in sorted(svc.requests.items()):
            http.add_metric([endpoint, str(status)], n)
        yield http
        calls = CounterMetricFamily(PREFIX + "calls", "Ended LLM calls by outcome (ok, cancelled, failed)",
                                    labels=("status",))
        for status, n in sorted(svc.call_status.items()):
            calls.add_metric([status], n)
        yield calls
        yield _gauge("calls_in_flight", "LLM calls submitted and not yet ended", len(svc.calls))

    def _engine_state(self) -> Iterator[Metric]:
        view = engine_view(self.svc)
        yield _gauge("num_requests_running", "Requests in the running batch", view["queues"]["running"])
        yield _gauge("num_requests_waiting", "Requests queued in the engine", view["queues"]["waiting"])
        used, budget = view["kv"]["used"], view["kv"]["budget"]
        yield _gauge("kv_used_tokens", "KV tokens in use (prefixes on GPU or loading + running requests)", used)
        yield _gauge("kv_budget_tokens", "KV token budget", budget)
        yield _gauge("kv_cache_usage_perc", "KV usage as a fraction of the budget (1 means full)",
                     used / budget if budget else None)
        counts = GaugeMetricFamily(PREFIX + "prefixes", "Known agent prefixes by location "
                                   "(gpu and loading hold KV; none: known, cached nowhere)", labels=("location",))
        tokens = GaugeMetricFamily(PREFIX + "prefix_tokens", "Tokens of the known agent prefixes by location",
                                   labels=("location",))
        for loc, (n, toks) in prefixes_by_location(view["prefixes"]).items():
            counts.add_metric([loc], n)
            tokens.add_metric([loc], toks)
        yield counts
        yield tokens
        yield _gauge("sim_time_seconds", "The engine's simulated clock", view["now_s"])

    def _engine_counters(self) -> Iterator[Metric]:
        est = engine_stats_json(self.svc.engine.stats())
        for key, name, help_ in CORE_COUNTERS:
            yield _counter(name, help_, est.get(key) or 0)
        for key, name, help_ in EXTRA_COUNTERS:
            if isinstance(est.get(key), (int, float)):
                yield _counter(name, help_, est[key])
        decisions = est.get("decisions") or 0
        mean_ms, p99_ms = est.get("decision_ms_mean"), est.get("decision_ms_p99")
        yield _summary("decision_latency_seconds", "Policy decision latency (wall-clock seconds)",
                       {"0.99": p99_ms / 1e3 if decisions and p99_ms is not None else None},
                       (mean_ms or 0.0) / 1e3 * decisions, decisions)

    def _tasks(self) -> Iterator[Metric]:
        jct = jct_summary(self.svc)
        yield _summary("task_jct_seconds", "Task job completion time (simulated seconds; quantiles over the "
                       "recent finished tasks)", {q: jct[key] for q, key in JCT_QUANTILES}, jct["sum_s"],
                       jct["count"])
        yield _gauge("tasks_active", "Tasks not yet done", len(self.svc.tracker.active))


class ServiceMetrics:
    """A service's own registry (never the process-global REGISTRY): the scrape-time
    collector plus the latency histograms the service feeds (`observe_call`) as calls end."""

    def __init__(self, svc: SimService) -> None:
        self.latency = CallLatency()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ServiceCollector(svc, self.latency))

    def observe_call(self, record: CallRecord) -> None:
        self.latency.observe(record)

    def render(self) -> str:
        """The exposition text; call inside the engine task."""
        return generate_latest(self.registry).decode()


def render_metrics(svc: SimService) -> str:
    """The exposition text of `svc` (inside the engine task)."""
    return svc.metrics.render()


__all__ = ["CONTENT_TYPE", "LOCATIONS", "CallLatency", "ServiceCollector", "ServiceMetrics", "render_metrics"]
