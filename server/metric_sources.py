"""What `/metrics` observes at the sources, kept cumulative for the service's life.

Histograms are kept by hand (not prometheus_client's `Histogram`) so no `_created` series
and no process-global switch are involved, exactly as for the per-call latencies; each is
fed inside the engine task (no lock needed) and read by the collector (server/metrics.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client.core import HistogramMetricFamily, Metric

if TYPE_CHECKING:
    from topas_agents.task_tracker import TaskState

    from .calls import CallRecord

PREFIX = "topas_"
# vLLM's bucket bounds for the metrics of the same names, so dashboards carry over.
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                 240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
# Policy decision latency is wall-clock time inside `decide()`: the paper reports 1.9 ms per
# Topas decision (MetaGPT-SOP), the simple baselines take microseconds, and a decision near
# 1 s stalls the engine. So 1-2.5-5 steps per decade from 10 us to 1 s (anything slower
# lands in +Inf, which is then the alert).
DECISION_BUCKETS_S = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                      0.05, 0.1, 0.25, 0.5, 1.0)
# Task JCT is in simulated seconds: a one-call task takes well under a second to seconds, a
# MetaGPT task minutes (mean ~550 s for metagpt-sop at 0.5 task/s on the default profile),
# and overloaded runs or long real tasks hours. So 1-2.5-5 steps from 0.5 s, then 30 min,
# 1 h, 2 h, 4 h and 8 h.
JCT_BUCKETS_S = (0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 1800.0, 3600.0, 7200.0,
                 14400.0, 28800.0)
UNREGISTERED = ""  # the label value of every name that is not registered (bounded cardinality)


@dataclass(slots=True)
class LatencyHistogram:
    """Cumulative bucket counts and sum of one unlabelled series."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, the last one is +Inf
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: a value on a bound counts in it
        self.total += value

    def observe_many(self, values: Sequence[float]) -> None:
        """`observe` each value (vectorised: a scrape may catch up on many decisions)."""
        if not len(values):
            return
        arr = np.asarray(values, dtype=float)
        where = np.bincount(np.searchsorted(self.bounds, arr, side="left"), minlength=len(self.counts))
        for i, n in enumerate(where.tolist()):  # side="left" is bisect_left: the same le rule
            self.counts[i] += n
        self.total += float(arr.sum())

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs ending with +Inf, as HistogramMetricFamily takes them."""
        cumulative, running = [], 0
        for le, n in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += n
            cumulative.append((le, running))
        return cumulative

    def family(self, name: str, help_: str) -> HistogramMetricFamily:
        return HistogramMetricFamily(PREFIX + name, help_, buckets=self.buckets(), sum_value=self.total)


@dataclass(slots=True)
class LabelledHistogram:
    """One `LatencyHistogram` per label-value tuple (series appear on first observation)."""

    bounds: tuple[float, ...]
    label_names: tuple[str, ...]
    series: dict[tuple[str, ...], LatencyHistogram] = field(default_factory=dict)

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        hist = self.series.get(labels)
        if hist is None:
            hist = self.series[labels] = LatencyHistogram(self.bounds)
        hist.observe(value)

    def family(self, name: str, help_: str) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(PREFIX + name, help_, labels=self.label_names)
        for labels, hist in sorted(self.series.items()):
            fam.add_metric(list(labels), hist.buckets(), hist.total)
        return fam


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



@dataclass(slots=True)
class TaskJct:
    """Task JCT by workflow, observed when the tracker concludes a task. A task reopened by a
    late call (concluded by inference or idleness, then called again) and concluded again is
    observed again: a histogram cannot take an observation back, so `_count` counts
    conclusions and `tasks_reopened_total` says how many of them were taken back
    (`_count - tasks_reopened_total` is the number of finished tasks /v1/topas/stats shows)."""

    hist: LabelledHistogram = field(default_factory=lambda: LabelledHistogram(JCT_BUCKETS_S, ("workflow",)))

    def observe(self, task: TaskState) -> None:
        if task.finish_s is None:
            return
        workflow = task.workflow.name if task.workflow is not None else UNREGISTERED  # registered only
        self.hist.observe((workflow,), max(0.0, task.finish_s - task.arrival_s))


@dataclass(slots=True)
class DecisionLatency:
    """Every policy decision's wall-clock time, caught up at scrape time from the engine's
    bounded list (`SimEngine.decision_times_s(start)`, `decision_count`): each decision is
    observed once."""

    hist: LatencyHistogram = field(default_factory=lambda: LatencyHistogram(DECISION_BUCKETS_S))
    seen: int = 0

    def catch_up(self, engine: Any) -> bool:
        """Observe the decisions made since the last call; False if the engine keeps no
        per-decision times (then there is no histogram to report)."""
        times = getattr(engine, "decision_times_s", None)
        if times is None:
            return False
        new = times(self.seen)
        self.hist.observe_many(new)
        # the engine keeps the latest times only: a reader that fell behind skips the dropped
        count = getattr(engine, "decision_count", None)
        self.seen = count if isinstance(count, int) else self.seen + len(new)
        return True


@dataclass(slots=True)
class MetricState:
    """What the service observes at the sources, read by the collector."""

    latency: CallLatency = field(default_factory=CallLatency)
    jct: TaskJct = field(default_factory=TaskJct)
    decisions: DecisionLatency = field(default_factory=DecisionLatency)
    # (workflow, finish reason) -> calls that ended ok (vLLM's request_success_total)
    success: dict[tuple[str, str], int] = field(default_factory=dict)
    jct_hooked: bool = False  # the tracker reports each conclusion to `jct`
