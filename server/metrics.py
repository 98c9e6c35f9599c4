"""`GET /metrics`: Prometheus text exposition format (v0.0.4), written by hand.

Built inside the engine task. Every metric is prefixed `topas_`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .stats import engine_stats_json, engine_view, jct_summary

if TYPE_CHECKING:
    from .service import SimService

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _fmt(value: Any) -> str:
    if value is None:
        return "NaN"
    v = float(value)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(int(v)) if v.is_integer() and abs(v) < 2**53 else repr(v)


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_: str, samples: list[tuple[dict[str, str], Any]],
               suffix_samples: list[tuple[str, dict[str, str], Any]] = ()) -> None:
        self.lines.append(f"# HELP topas_{name} {help_}")
        self.lines.append(f"# TYPE topas_{name} {kind}")
        for labels, value in samples:
            self.lines.append(f"topas_{name}{self._labels(labels)} {_fmt(value)}")
        for suffix, labels, value in suffix_samples:
            self.lines.append(f"topas_{name}{suffix}{self._labels(labels)} {_fmt(value)}")

    @staticmethod
    def _labels(labels: dict[str, str]) -> str:
        if not labels:
            return ""
        return "{" + ",".join(f'{k}="{_esc(str(v))}"' for k, v in labels.items()) + "}"


def render_metrics(svc: SimService) -> str:
    w = _Writer()
    view = engine_view(svc)
    est = engine_stats_json(svc.engine.stats())
    w.metric("requests_total", "counter", "HTTP requests by endpoint and status code",
             [({"endpoint": e, "status": str(s)}, n) for (e, s), n in sorted(svc.requests.items())])
    w.metric("calls_total", "counter", "Completed LLM calls by outcome",
             [({"status": s}, n) for s, n in sorted(svc.call_status.items())])
    w.metric("requests_waiting", "gauge", "Requests queued in the engine", [({}, view["queues"]["waiting"])])
    w.metric("requests_running", "gauge", "Requests in the running batch", [({}, view["queues"]["running"])])
    w.metric("calls_in_flight", "gauge", "HTTP calls waiting for their response", [({}, len(svc.calls))])
    w.metric("kv_used_tokens", "gauge", "KV tokens in use (prefixes on GPU + running requests)",
             [({}, view["kv"]["used"])])
    w.metric("kv_budget_tokens", "gauge", "KV token budget", [({}, view["kv"]["budget"])])
    w.metric("prefixes_resident", "gauge", "Agent prefixes by location",
             [({"location": loc}, sum(1 for p in view["prefixes"] if p["location"] == loc))
              for loc in ("gpu", "loading", "cpu", "none")])
    for key, help_ in (("decisions", "Scheduling decisions made"), ("preemptions", "Requests preempted"),
                       ("prefix_swaps_in", "Prefixes swapped in"), ("prefix_swaps_out", "Prefixes swapped out")):
        w.metric(f"{key}_total", "counter", help_, [({}, est.get(key, 0))])
    decisions = est.get("decisions", 0) or 0
    mean = est.get("decision_ms_mean")
    w.metric("decision_latency_ms", "summary", "Policy decision latency (milliseconds)",
             [({"quantile": "0.99"}, est.get("decision_ms_p99"))],
             [("_sum", {}, (mean or 0.0) * decisions), ("_count", {}, decisions)])
    jct = jct_summary(svc)
    w.metric("task_jct_seconds", "summary", "Task job completion time (simulated seconds)",
             [({"quantile": q}, jct[key]) for q, key in (("0.5", "p50_s"), ("0.9", "p90_s"), ("0.99", "p99_s"))],
             [("_sum", {}, jct["sum_s"]), ("_count", {}, jct["count"])])
    w.metric("tasks_active", "gauge", "Tasks not yet done", [({}, len(svc.tracker.active))])
    w.metric("sim_time_seconds", "gauge", "The engine's simulated clock", [({}, view["now_s"])])
    return "\n".join(w.lines) + "\n"
