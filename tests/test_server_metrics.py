"""`GET /metrics` on prometheus_client: parsed with its own parser, values checked against
the calls driven through the server and against /v1/topas/stats."""

from __future__ import annotations

import math
from types import SimpleNamespace

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from topas_agents.server import ServerConfig, start_server_in_thread
from topas_agents.server.cluster.aggregate import merge_metrics
from topas_agents.server.metrics import (
    CONTENT_TYPE,
    DECISION_BUCKETS_S,
    E2E_BUCKETS_S,
    JCT_BUCKETS_S,
    CallLatency,
    LatencyHistogram,
)
from topas_agents.server.stats import LOCATIONS, prefixes_by_location
from topas_agents.task_tracker import TaskTracker

LABEL = {"task_id": "m-1", "stage": "s1", "agent": "a", "workflow": "chain3"}
# The JCT histogram needs the tracker to report each conclusion (TaskTracker.on_conclude and
# reopens_total); without them /metrics has no JCT histogram, and these tests say why they skip.
needs_conclude_hook = pytest.mark.skipif(
    not hasattr(TaskTracker(0.0, 1), "on_conclude"),
    reason="TaskTracker lacks on_conclude/reopens_total (the metrics diff to topas_agents/task_tracker.py)")


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(fams: dict, family: str, sample: str | None = None, **labels: str) -> float:
    """The one sample of `family` named `sample` (default: the family name) with `labels`."""
    name = sample or family
    found = [s.value for s in fams[family].samples if s.name == name and s.labels == labels]
    assert len(found) == 1, (family, name, labels, fams[family].samples)
    return found[0]


def _scrape(base: str) -> tuple[dict, dict]:
    r = httpx.get(f"{base}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"] == CONTENT_TYPE
    stats = httpx.get(f"{base}/v1/topas/stats", timeout=10).json()
    return _families(r.text), stats


@pytest.fixture(scope="module")
def driven():
    """A server after 3 labelled calls (one streamed), one 400 and an explicit task end."""
    handle = start_server_in_thread(ServerConfig(time_scale=200.0, workflows=("chain3",), drain_timeout_s=2.0))
    client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=30)
    msgs = [{"role": "user", "content": "Write the PRD"}]
    for _ in range(2):
        client.chat.completions.create(model="m", messages=msgs, max_tokens=5, extra_body={"topas": LABEL})
    list(client.chat.completions.create(model="m", messages=msgs, max_tokens=5, stream=True,
                                        extra_body={"topas": LABEL}))
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[], max_tokens=5)
    assert httpx.post(f"{handle.base_url}/v1/topas/tasks/m-1/done").status_code == 200
    yield handle
    handle.stop()


def test_families_and_types(driven) -> None:
    fams, _ = _scrape(driven.base_url)
    kinds = {name: f.type for name, f in fams.items()}
    expected = {
        "topas_http_requests": "counter", "topas_calls": "counter", "topas_calls_in_flight": "gauge",
        "topas_num_requests_running": "gauge", "topas_num_requests_waiting": "gauge",
        "topas_kv_used_tokens": "gauge", "topas_kv_budget_tokens": "gauge", "topas_kv_cache_usage_perc": "gauge",
        "topas_prefixes": "gauge", "topas_prefix_tokens": "gauge", "topas_decisions": "counter",
        "topas_preemptions": "counter", "topas_prefix_swaps_in": "counter", "topas_prefix_swaps_out": "counter",
        "topas_decision_latency_seconds": "histogram",
        "topas_tasks_active": "gauge", "topas_sim_time_seconds": "gauge", "topas_server_info": "gauge",
        "topas_generation_tokens": "counter",
        "topas_prefix_cache_queries": "counter", "topas_prefix_cache_hits": "counter",
        "topas_request_success": "counter",
    }
    assert {k: kinds.get(k) for k in expected} == expected
    assert "topas_prefixes_resident" not in kinds  # the old name that counted location "none" as resident


def test_request_and_call_counts(driven) -> None:
    fams, stats = _scrape(driven.base_url)
    chat = "/v1/chat/completions"
    assert _value(fams, "topas_http_requests", "topas_http_requests_total", endpoint=chat, status="200") == 3
    assert _value(fams, "topas_http_requests", "topas_http_requests_total", endpoint=chat, status="400") == 1
    assert _value(fams, "topas_calls", "topas_calls_total", status="ok") == 3
    assert stats["requests"]["calls_by_status"] == {"ok": 3}
    for name in ("topas_calls_in_flight", "topas_num_requests_running", "topas_num_requests_waiting",
                 "topas_tasks_active"):
        assert _value(fams, name) == 0, name
    assert _value(fams, "topas_generation_tokens", "topas_generation_tokens_total") == 15  # 3 calls x 5
    info = fams["topas_server_info"].samples[0]  # an info family is a gauge of 1 in text 0.0.4
    assert info.labels["engine"] == "sim" and info.labels["responder"] == "echo" and info.value == 1


def test_kv_prefixes_and_engine_counters_match_stats(driven) -> None:
    fams, stats = _scrape(driven.base_url)
    used, budget = stats["kv"]["used"], stats["kv"]["budget"]
    assert (_value(fams, "topas_kv_used_tokens"), _value(fams, "topas_kv_budget_tokens")) == (used, budget)
    assert used > 0 and _value(fams, "topas_kv_cache_usage_perc") == pytest.approx(used / budget)
    for loc in LOCATIONS:
        here = [p for p in stats["prefixes"] if p["location"] == loc]
        assert _value(fams, "topas_prefixes", location=loc) == len(here), loc
        assert _value(fams, "topas_prefix_tokens", location=loc) == sum(p["tokens"] for p in here), loc
    # chain3 has three agents and only 'a' ran: the other two are known but cached nowhere
    assert _value(fams, "topas_prefixes", location="none") == 2
    eng = stats["engine"]
    assert _value(fams, "topas_decisions", "topas_decisions_total") == eng["decisions"] > 0
    assert _value(fams, "topas_preemptions", "topas_preemptions_total") == eng["preemptions"]
    assert _value(fams, "topas_sim_time_seconds") >= stats["calls"][-1]["finish_s"] > 0


def _buckets(fams: dict, family: str, **labels: str) -> list[tuple[float, float]]:
    """(le, cumulative count) of one histogram series, in bound order, checked well formed."""
    out = sorted((float(s.labels["le"]), s.value) for s in fams[family].samples
                 if s.name == family + "_bucket" and {k: v for k, v in s.labels.items() if k != "le"} == labels)
    assert out and out[-1][0] == math.inf, (family, labels)
    counts = [n for _, n in out]
    assert counts == sorted(counts), (family, out)  # cumulative: never decreasing with le
    assert counts[-1] == _value(fams, family, family + "_count", **labels)
    return out


def test_decision_latency_histogram_counts_every_decision(driven) -> None:
    fams, stats = _scrape(driven.base_url)
    eng, name = stats["engine"], "topas_decision_latency_seconds"
    assert fams[name].type == "histogram"
    buckets = _buckets(fams, name)
    assert [le for le, _ in buckets] == [*DECISION_BUCKETS_S, math.inf]
    assert _value(fams, name, name + "_count") == eng["decisions"] == _value(fams, "topas_decisions",
                                                                               "topas_decisions_total")
    total_s = _value(fams, name, name + "_sum")
    assert total_s == pytest.approx(eng["decision_ms_mean"] * eng["decisions"] / 1e3, rel=1e-9)
    again, _ = _scrape(driven.base_url)  # each decision is observed once, however often scraped
    assert _value(again, name, name + "_count") == _value(again, "topas_decisions", "topas_decisions_total")


@needs_conclude_hook
def test_task_jct_histogram_by_workflow(driven) -> None:
    fams, stats = _scrape(driven.base_url)
    jct, name = stats["jct"], "topas_task_jct_seconds"
    assert jct["count"] == 1 and fams[name].type == "histogram"
    assert fams["topas_tasks_reopened"].type == "counter"
    assert {s.labels.get("workflow") for s in fams[name].samples} == {"chain3"}
    buckets = _buckets(fams, name, workflow="chain3")
    assert [le for le, _ in buckets] == [*JCT_BUCKETS_S, math.inf]
    assert _value(fams, name, name + "_count", workflow="chain3") == jct["count"] == 1
    assert _value(fams, name, name + "_sum", workflow="chain3") == pytest.approx(jct["sum_s"])
    first_in = next(le for le, n in buckets if n == 1)  # the bucket that holds the one JCT
    assert first_in >= jct["sum_s"] and all(le < jct["sum_s"] for le, n in buckets if n == 0)
    assert _value(fams, "topas_tasks_reopened", "topas_tasks_reopened_total") == 0
    text = httpx.get(f"{driven.base_url}/metrics", timeout=10).text
    merged = _families(merge_metrics([text, None, text]))  # the cluster front's merge keeps the labels
    counts = [s for s in merged[name].samples if s.name == name + "_count"]
    assert sorted((s.labels["replica"], s.labels["workflow"], s.value) for s in counts) == [("1", "chain3", 1),
                                                                                          ("3", "chain3", 1)]


@needs_conclude_hook
def test_jct_counters_never_decrease_across_a_reopen() -> None:
    """A task concluded by inference, reopened by a late call and concluded again: the
    histogram observes both conclusions, the reopen is counted, nothing goes down."""
    handle = start_server_in_thread(ServerConfig(time_scale=200.0, workflows=("chain3",), drain_timeout_s=2.0))
    client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=30)
    label = {"task_id": "r-1", "stage": "s3", "agent": "c", "workflow": "chain3"}
    name, reopened = "topas_task_jct_seconds", ("topas_tasks_reopened", "topas_tasks_reopened_total")
    seen = []
    try:
        for _ in range(2):  # s3 implies s1, s2 done; its one request ends it: the task concludes
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=3,
                                           extra_body={"topas": label})
            fams, stats = _scrape(handle.base_url)
            count = _value(fams, name, name + "_count", workflow="chain3")
            seen.append((count, _value(fams, name, name + "_sum", workflow="chain3"), _value(fams, *reopened),
                         [n for _, n in _buckets(fams, name, workflow="chain3")]))
            assert stats["jct"]["count"] == count - _value(fams, *reopened) == 1  # one finished task
    finally:
        handle.stop()
    (c1, s1, r1, b1), (c2, s2, r2, b2) = seen
    assert (c1, r1, c2, r2) == (1, 0, 2, 1)
    assert s2 > s1 > 0 and all(y >= x for x, y in zip(b1, b2, strict=True))


def test_prefix_cache_counters_by_agent(driven) -> None:
    """Three calls of agent 'a': the first computes its prefix, the next two reuse it."""
    fams, stats = _scrape(driven.base_url)
    q, h = "topas_prefix_cache_queries", "topas_prefix_cache_hits"
    calls = [c for c in stats["calls"] if c["status"] == "ok"]
    assert len(calls) == 3 and {c["agent"] for c in calls} == {"a"}
    assert _value(fams, q, q + "_total", agent="a") == sum(c["prefix_tokens"] + c["input_tokens"] for c in calls)
    assert _value(fams, h, h + "_total", agent="a") == 2 * calls[0]["prefix_tokens"] > 0
    cache = stats["prefix_cache"]  # /v1/topas/stats says the same
    assert cache["agents"]["a"] == {"queries": _value(fams, q, q + "_total", agent="a"),
                                    "hits": _value(fams, h, h + "_total", agent="a")}
    assert cache["hit_rate"] == pytest.approx(cache["hits"] / cache["queries"]) and 0 < cache["hit_rate"] < 1
    for agent in ("b", "c"):  # registered but never called: present, zero
        assert _value(fams, q, q + "_total", agent=agent) == _value(fams, h, h + "_total", agent=agent) == 0
    ok = {(s.labels["workflow"], s.labels["finished_reason"]): s.value
          for s in fams["topas_request_success"].samples if s.name == "topas_request_success_total"}
    assert ok == {("chain3", c["finish_reason"]): 3 for c in calls}  # one reason for the three same calls


def test_services_have_their_own_registries(driven) -> None:
    """A second server in the same process starts from zero; nothing lands in the global REGISTRY."""
    other = start_server_in_thread(ServerConfig(time_scale=200.0, drain_timeout_s=2.0))
    try:
        fams, _ = _scrape(other.base_url)
        assert fams["topas_calls"].samples == [] and _value(fams, "topas_decisions", "topas_decisions_total") == 0
        again, _ = _scrape(driven.base_url)
        assert _value(again, "topas_calls", "topas_calls_total", status="ok") == 3
    finally:
        other.stop()
    assert not [n for n in REGISTRY._names_to_collectors if n.startswith("topas")]


def test_cluster_merge_of_two_replicas_parses(driven) -> None:
    text = httpx.get(f"{driven.base_url}/metrics", timeout=10).text
    merged = _families(merge_metrics([text, None, text]))
    ok = [s for s in merged["topas_calls"].samples if s.labels.get("status") == "ok"]
    assert sorted(s.labels["replica"] for s in ok) == ["1", "3"] and all(s.value == 3 for s in ok)
    assert merged["topas_decision_latency_seconds"].type == "histogram"
    assert merge_metrics([text, text]).count("# TYPE topas_calls_total") == 1


@given(st.lists(st.tuples(st.sampled_from(LOCATIONS), st.integers(0, 10**6)), max_size=30))
def test_prefixes_by_location_counts_every_prefix_once(items) -> None:
    out = prefixes_by_location({"location": loc, "tokens": t} for loc, t in items)
    assert set(out) == set(LOCATIONS)
    assert sum(n for n, _ in out.values()) == len(items)
    for loc in LOCATIONS:
        assert out[loc] == (sum(1 for x, _ in items if x == loc), sum(t for x, t in items if x == loc))


def test_latency_histogram_buckets_are_cumulative_and_le() -> None:
    hist = LatencyHistogram((1.0, 2.0))
    for x in (0.5, 1.0, 1.5, 9.0):
        hist.observe(x)
    fams = _families(_exposition(hist.family("x_seconds", "h")))
    buckets = {s.labels["le"]: s.value for s in fams["topas_x_seconds"].samples if s.name.endswith("_bucket")}
    assert buckets == {"1.0": 2, "2.0": 3, "+Inf": 4}  # a value on a bound counts in that bucket
    assert _value(fams, "topas_x_seconds", "topas_x_seconds_count") == 4
    assert _value(fams, "topas_x_seconds", "topas_x_seconds_sum") == 12.0


def test_call_latency_observes_arrival_to_first_token_and_finish() -> None:
    lat = CallLatency()
    lat.observe(SimpleNamespace(arrival_s=1.0, first_token_s=1.25, finish_s=4.0))
    lat.observe(SimpleNamespace(arrival_s=2.0, first_token_s=None, finish_s=None))  # counts in neither
    assert (lat.e2e.total, sum(lat.e2e.counts), lat.ttft.total, sum(lat.ttft.counts)) == (3.0, 1, 0.25, 1)
    assert lat.e2e.counts[E2E_BUCKETS_S.index(5.0)] == 1


def _exposition(*families) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    class _Fixed:
        def collect(self):
            return list(families)

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Fixed())
    return generate_latest(reg).decode()


def test_served_latency_histograms_match_the_call_records(driven) -> None:
    fams, stats = _scrape(driven.base_url)
    ok = [c for c in stats["calls"] if c["status"] == "ok"]
    e2e, ttft = "topas_e2e_request_latency_seconds", "topas_time_to_first_token_seconds"
    assert fams[e2e].type == fams[ttft].type == "histogram"
    assert _value(fams, e2e, e2e + "_count") == len(ok) == 3
    assert _value(fams, e2e, e2e + "_sum") == pytest.approx(sum(c["finish_s"] - c["arrival_s"] for c in ok))
    assert _value(fams, ttft, ttft + "_sum") == pytest.approx(sum(c["first_token_s"] - c["arrival_s"] for c in ok))
    assert _value(fams, e2e, e2e + "_bucket", le="+Inf") == 3
