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

Latencies are histograms (vLLM/SGLang style: `_bucket{le}`, `_sum`, `_count`, quantiles via
`histogram_quantile`), observed once each at their source and kept cumulative over the
service's life, so no series ever goes down: per-call latencies as calls end, task JCT as
the tracker concludes a task (`TaskTracker.on_conclude`), decision latency from the engine's
append-only list of decision times (read from where the last scrape stopped).

Label values are registered names only (workflows and their agents in the registry; with
API keys these are tenant-qualified, `key1/name`): a name a client merely sends in a label
(an unregistered workflow or agent) is folded into `""`, so cardinality is bounded by what
was registered, never by client input.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector

from .metric_sources import (
    DECISION_BUCKETS_S,
    E2E_BUCKETS_S,
    JCT_BUCKETS_S,
    PREFIX,
    TTFT_BUCKETS_S,
    UNREGISTERED,
    CallLatency,
    DecisionLatency,
    LabelledHistogram,
    LatencyHistogram,
    MetricState,
    TaskJct,
)
from .stats import LOCATIONS, engine_stats_json, engine_view, prefixes_by_location
from .tenancy import qualify

if TYPE_CHECKING:
    from .calls import CallRecord
    from .service import SimService

# `generate_latest` with its default (underscore) escaping writes text format 0.0.4 for our
# legacy-valid names, and prometheus_client's own HTTP handlers pair it with this header
# (`choose_encoder` sends CONTENT_TYPE_LATEST, version 1.0.0, only when the scraper's
# Accept asks for it). The cluster front re-serves the merged text under the same header.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
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


def _num(value: Any) -> float:
    """A sample value; None (no data yet, e.g. usage of a zero budget) is NaN."""
    return NAN if value is None else float(value)


def _gauge(name: str, help_: str, value: Any) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, help_, value=_num(value))


def _counter(name: str, help_: str, value: Any) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, help_, value=_num(value))


def registered_agents(svc: SimService) -> set[str]:
    """Agent names of the registered workflows, as the engine knows them (tenant-qualified)."""
    return {a.name for wf in svc.registry.mapping.values() for a in wf.agents}


@dataclass(slots=True)
class PrefixCacheLabels:
    """Per-agent prefix-cache counters folded onto bounded `agent` labels. The engine's
    counters are cumulative per agent; an agent's label is fixed the first time a scrape sees
    it (its name if registered then, else `""`), so no series ever loses counts to another."""

    labels: dict[str, str] = field(default_factory=dict)

    def families(self, svc: SimService) -> Iterator[Metric]:
        counts_fn = getattr(svc.engine, "prefix_cache_counts", None)
        if counts_fn is None:
            return  # an engine without prefix-cache accounting: no such series
        counts = counts_fn()
        if any(a not in self.labels for a in counts):
            known = registered_agents(svc)
            for a in counts:
                self.labels.setdefault(a, a if a in known else UNREGISTERED)
        totals: dict[str, list[int]] = {}
        for agent, c in counts.items():
            t = totals.setdefault(self.labels[agent], [0, 0])
            t[0] += c.queries
            t[1] += c.hits
        queries = CounterMetricFamily(PREFIX + "prefix_cache_queries", "Prompt tokens (agent prefix + input) "
                                      "of admitted requests, counted at each admission", labels=("agent",))
        hits = CounterMetricFamily(PREFIX + "prefix_cache_hits", "Of the queried tokens, agent-prefix tokens "
                                   "already materialised on GPU at admission", labels=("agent",))
        for label, (q, h) in sorted(totals.items()):
            queries.add_metric([label], q)
            hits.add_metric([label], h)
        yield queries
        yield hits


class ServiceCollector(Collector):
    """Everything /metrics says about one `SimService`, read when scraped."""

    def __init__(self, svc: SimService, state: MetricState | None = None) -> None:
        self.svc = svc
        self.state = state if state is not None else MetricState()
        self.prefix_cache = PrefixCacheLabels()

    def describe(self) -> list[Metric]:
        return []  # names depend on the engine's stats: never pre-registered

    def collect(self) -> Iterator[Metric]:
        yield from self._server()
        yield from self._engine_state()
        yield from self._engine_counters()
        yield from self.prefix_cache.families(self.svc)
        yield from self._tasks()
        yield from self.state.latency.families()

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
        success = CounterMetricFamily(PREFIX + "request_success", "LLM calls that ended ok, by registered "
                                      "workflow and finish reason", labels=("workflow", "finished_reason"))
        for (workflow, reason), n in sorted(self.state.success.items()):
            success.add_metric([workflow, reason], n)
        yield success
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
        if self.state.decisions.catch_up(self.svc.engine):
            yield self.state.decisions.hist.family("decision_latency_seconds",
                                                   "Policy decision latency (wall-clock seconds)")

    def _tasks(self) -> Iterator[Metric]:
        tracker = self.svc.tracker
        if self.state.jct_hooked:
            yield self.state.jct.hist.family("task_jct_seconds", "Task job completion time by registered "
                                             "workflow (simulated seconds; each conclusion, reopened tasks again)")
            yield _counter("tasks_reopened", "Concluded tasks whose JCT was taken back: reopened by a later call "
                           "(observed again when they end) or marked failed after they concluded",
                           tracker.reopens_total)
        yield _gauge("tasks_active", "Tasks not yet done", len(tracker.active))


class ServiceMetrics:
    """A service's own registry (never the process-global REGISTRY): the scrape-time
    collector plus what the service observes at the sources: `observe_call` as calls end,
    and task conclusions through the tracker's `on_conclude` hook (set here)."""

    def __init__(self, svc: SimService) -> None:
        self.svc = svc
        self.state = MetricState()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ServiceCollector(svc, self.state))
        # A tracker without the hook (and its reopen count) cannot feed a cumulative JCT
        # histogram: then /metrics has none rather than one that silently stays empty.
        if hasattr(svc.tracker, "on_conclude") and hasattr(svc.tracker, "reopens_total"):
            svc.tracker.on_conclude = self.state.jct.observe
            self.state.jct_hooked = True

    @property
    def latency(self) -> CallLatency:
        return self.state.latency

    def observe_call(self, record: CallRecord) -> None:
        """A call ended ok."""
        self.state.latency.observe(record)
        name = qualify(record.tenant, record.workflow) if record.workflow else None
        workflow = name if name is not None and name in self.svc.registry.mapping else UNREGISTERED
        key = (workflow, record.finish_reason or "stop")
        self.state.success[key] = self.state.success.get(key, 0) + 1

    def render(self) -> str:
        """The exposition text; call inside the engine task."""
        return generate_latest(self.registry).decode()


def render_metrics(svc: SimService) -> str:
    """The exposition text of `svc` (inside the engine task)."""
    return svc.metrics.render()


__all__ = ["CONTENT_TYPE", "DECISION_BUCKETS_S", "E2E_BUCKETS_S", "JCT_BUCKETS_S", "LOCATIONS", "TTFT_BUCKETS_S",
           "CallLatency", "DecisionLatency", "LabelledHistogram", "LatencyHistogram", "MetricState",
           "PrefixCacheLabels", "ServiceCollector", "ServiceMetrics", "TaskJct", "render_metrics"]
