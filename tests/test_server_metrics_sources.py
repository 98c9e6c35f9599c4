"""The /metrics sources on their own: histograms fed once per observation, decision times
caught up from the engine, JCT by registered workflow, prefix-cache labels that stay put."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topas_agents.server.metrics import (
    DECISION_BUCKETS_S,
    JCT_BUCKETS_S,
    DecisionLatency,
    LabelledHistogram,
    LatencyHistogram,
    PrefixCacheLabels,
    TaskJct,
)
from topas_agents.sim import PrefixCacheCount
from topas_agents.workflow import AgentSpec

VALUES = st.lists(st.one_of(st.floats(0.0, 1e5, allow_nan=False), st.sampled_from(JCT_BUCKETS_S)), max_size=60)


@pytest.mark.parametrize("bounds", [DECISION_BUCKETS_S, JCT_BUCKETS_S])
def test_bucket_bounds_are_increasing(bounds) -> None:
    assert list(bounds) == sorted(set(bounds)) and bounds[0] > 0 and math.isfinite(bounds[-1])


@given(VALUES)
def test_observe_many_is_observe_each(values) -> None:
    one, many = LatencyHistogram(JCT_BUCKETS_S), LatencyHistogram(JCT_BUCKETS_S)
    for v in values:
        one.observe(v)
    many.observe_many(values[: len(values) // 2])
    many.observe_many(values[len(values) // 2:])
    assert many.counts == one.counts and many.total == pytest.approx(one.total)
    cumulative = [n for _, n in many.buckets()]
    assert cumulative == sorted(cumulative) and cumulative[-1] == len(values)


def test_labelled_histogram_keeps_a_series_per_label() -> None:
    hist = LabelledHistogram((1.0, 10.0), ("workflow",))
    for wf, v in (("b", 0.5), ("a", 20.0), ("b", 10.0)):
        hist.observe((wf,), v)
    fam = hist.family("x_seconds", "h")
    counts = {s.labels["workflow"]: s.value for s in fam.samples if s.name.endswith("_count")}
    assert counts == {"a": 1, "b": 2}
    b = [(s.labels["le"], s.value) for s in fam.samples if s.name.endswith("_bucket") and s.labels["workflow"] == "b"]
    assert b == [("1.0", 1), ("10.0", 2), ("+Inf", 2)]


def test_task_jct_labels_registered_workflows_only() -> None:
    jct = TaskJct()
    wf = SimpleNamespace(name="key1/chain3")
    jct.observe(SimpleNamespace(workflow=wf, arrival_s=1.0, finish_s=31.0))
    jct.observe(SimpleNamespace(workflow=None, arrival_s=0.0, finish_s=2.0))  # unregistered or none: ""
    jct.observe(SimpleNamespace(workflow=wf, arrival_s=0.0, finish_s=None))  # not finished: ignored
    assert {k: (sum(h.counts), h.total) for k, h in jct.hist.series.items()} == {("key1/chain3",): (1, 30.0),
                                                                                 ("",): (1, 2.0)}


def test_decision_latency_observes_each_decision_once() -> None:
    times: list[float] = []
    engine = SimpleNamespace(decision_times_s=lambda start=0: times[start:])
    lat = DecisionLatency()
    times += [0.001, 0.002]
    assert lat.catch_up(engine) and lat.catch_up(engine)  # a second scrape adds nothing
    assert (sum(lat.hist.counts), lat.hist.total) == (2, pytest.approx(0.003))
    times.append(2.0)  # slower than the last bound: +Inf
    assert lat.catch_up(engine) and lat.hist.counts[-1] == 1 and sum(lat.hist.counts) == 3
    assert not DecisionLatency().catch_up(SimpleNamespace())  # an engine without per-decision times


def _svc(counts: dict[str, PrefixCacheCount], agents: list[str]) -> SimpleNamespace:
    wf = SimpleNamespace(agents=tuple(AgentSpec(a, 10) for a in agents))
    return SimpleNamespace(engine=SimpleNamespace(prefix_cache_counts=lambda: dict(counts)),
                           registry=SimpleNamespace(mapping={"w": wf}))


def _scrape(labels: PrefixCacheLabels, svc) -> dict[str, dict[str, float]]:
    return {f.name: {s.labels["agent"]: s.value for s in f.samples} for f in labels.families(svc)}


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "x", "y"]), st.integers(0, 500), st.booleans(),
                          st.booleans()), max_size=40))
def test_prefix_cache_series_never_decrease(steps) -> None:
    """Agents call (counters grow), get registered later, are scraped: every series only
    grows, and labels are registered names or ""."""
    counts: dict[str, PrefixCacheCount] = {}
    registered = ["a", "b"]
    labels, last = PrefixCacheLabels(), {}
    for agent, tokens, hit, register in steps:
        q, h = counts.get(agent, PrefixCacheCount(0, 0))
        counts[agent] = PrefixCacheCount(q + tokens + 1, h + (tokens if hit else 0))
        if register and agent not in registered:
            registered.append(agent)  # registered after its first calls: its label stays put
        now = _scrape(labels, _svc(counts, registered))
        for name, series in now.items():
            for label, v in last.get(name, {}).items():
                assert series[label] >= v, (name, label)
            assert set(series) <= {"", *registered}
        hits, queries = now["topas_prefix_cache_hits"], now["topas_prefix_cache_queries"]
        assert all(hits[k] <= queries[k] for k in queries)
        assert sum(queries.values()) == sum(c.queries for c in counts.values())
        last = now


def test_prefix_cache_unregistered_agents_share_one_series() -> None:
    counts = {"a": PrefixCacheCount(100, 40), "client-made-up-1": PrefixCacheCount(7, 0),
              "client-made-up-2": PrefixCacheCount(5, 5)}
    out = _scrape(PrefixCacheLabels(), _svc(counts, ["a", "b"]))
    assert out["topas_prefix_cache_queries"] == {"a": 100, "": 12}
    assert out["topas_prefix_cache_hits"] == {"a": 40, "": 5}
    assert list(PrefixCacheLabels().families(SimpleNamespace(engine=SimpleNamespace()))) == []
