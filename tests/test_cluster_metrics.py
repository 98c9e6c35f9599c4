"""The front's merge of the replicas' `/metrics` (aggregate.merge_metrics), parsed back with
prometheus_client's own parser: every replica's samples, labelled, under the names and
HELP/TYPE lines the replicas wrote."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from topas_agents.server import ServerConfig, start_server_in_thread
from topas_agents.server.cluster.aggregate import merge_metrics

SampleKey = tuple[str, tuple[tuple[str, str], ...], str]  # name, sorted labels, value as written


def _samples(text: str, **only: str) -> list[SampleKey]:
    """Every sample of `text`, in order, with the labels in `only` matched and dropped."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if all(s.labels.get(k) == v for k, v in only.items()):
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in only))
                out.append((s.name, labels, floatToGoString(s.value)))  # NaN compares as text
    return out


def _meta(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#")]


@pytest.fixture(scope="module")
def server_text() -> str:
    """A real server's /metrics after labelled calls, a refused one and a concluded task: its
    counters, gauges and histograms (the task JCT one included) all have samples."""
    handle = start_server_in_thread(ServerConfig(time_scale=200.0, workflows=("chain3",), drain_timeout_s=2.0))
    try:
        client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=30)
        label = {"task_id": "mm-1", "stage": "s1", "agent": "a", "workflow": "chain3"}
        for _ in range(2):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                           extra_body={"topas": label})
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="m", messages=[], max_tokens=5)
        assert httpx.post(f"{handle.base_url}/v1/topas/tasks/mm-1/done", timeout=10).status_code == 200
        return httpx.get(f"{handle.base_url}/metrics", timeout=10).text
    finally:
        handle.stop()


def test_a_real_servers_metrics_keep_their_names_and_samples_per_replica(server_text: str) -> None:
    source = _samples(server_text)
    kinds = {f.name: f.type for f in text_string_to_metric_families(server_text)}
    assert {"counter", "gauge", "histogram"} <= set(kinds.values())
    assert any(name == "topas_task_jct_seconds_count" for name, _, _ in source)
    merged = merge_metrics([server_text, None, server_text])
    # the same HELP/TYPE lines, each once, in the same order: the names the replicas wrote
    assert _meta(merged) == _meta(server_text)
    assert {f.name: f.type for f in text_string_to_metric_families(merged)} == kinds
    for replica in ("1", "3"):  # every sample of each replica, in order, under its label
        assert _samples(merged, replica=replica) == source, replica
    assert _samples(merged, replica="2") == []  # replica 2 sent nothing
    assert len(_samples(merged)) == 2 * len(source)  # and no sample went unlabelled


def test_counters_and_histograms_keep_every_sample_created_included() -> None:
    # prometheus_client's own Counter and Histogram (as SGLang's metrics are) write _created
    # gauges beside _total, _bucket, _sum and _count
    registry = CollectorRegistry()
    Counter("work_total", "Work done", ["kind"], registry=registry).labels(kind="a").inc(2)
    Histogram("lat_seconds", "Latency", buckets=(0.1, 1.0), registry=registry).observe(0.5)
    Gauge("depth", "Queue depth", ["replica"], registry=registry).labels(replica="x").set(7)
    text = generate_latest(registry).decode()
    names = {name for name, _, _ in _samples(text)}
    assert {"work_total", "work_created", "lat_seconds_bucket", "lat_seconds_sum", "lat_seconds_count",
            "lat_seconds_created"} <= names
    merged = merge_metrics([text, text])
    assert _meta(merged) == _meta(text)
    for replica in ("1", "2"):
        got = _samples(merged, replica=replica)
        # the replica's own `replica` label kept as exported_replica, as Prometheus keeps it
        assert got == [(n, tuple(sorted(("exported_replica" if k == "replica" else k, v) for k, v in labels)), value)
                       for n, labels, value in _samples(text)]
        assert ("depth", (("exported_replica", "x"),), "7.0") in got
    assert merged.count("# TYPE lat_seconds histogram") == 1 and merged.count("# TYPE work_created gauge") == 1


def test_a_text_that_is_not_metrics_adds_nothing() -> None:
    good = "# HELP m Things\n# TYPE m gauge\nm 1\n"
    merged = merge_metrics(["<html>502 Bad Gateway</html>", good, ""])
    assert _samples(merged) == [("m", (("replica", "2"),), "1.0")]
    assert merge_metrics([None, "not metrics"]) == ""


def test_the_page_says_a_replica_whose_text_does_not_parse_is_not_up() -> None:
    from topas_agents.server.cluster.aggregate import metrics_page

    good = "# HELP m Things\n# TYPE m gauge\nm 1\n"
    page = metrics_page([good, "<html>502 Bad Gateway</html>", None], restarted=[2, 2])
    assert _samples(page, replica="1") == [("topas_replica_up", (), "1.0"),
                                           ("topas_replica_restarts_total", (), "0.0"), ("m", (), "1.0")]
    for replica, restarts in (("2", "2.0"), ("3", "0.0")):  # no metrics of theirs in the page
        assert _samples(page, replica=replica) == [("topas_replica_up", (), "0.0"),
                                                   ("topas_replica_restarts_total", (), restarts)]


def test_a_family_typed_otherwise_by_another_replica_keeps_the_first_type() -> None:
    """Replicas of two versions: `m` a gauge on one and a histogram on the other. The histogram's
    samples under the gauge's TYPE line (`m_bucket` after `# TYPE m gauge`) made a page that
    Prometheus rejects whole."""
    gauge = "# HELP m Things\n# TYPE m gauge\nm 1\n"
    histogram = ('# HELP m Things\n# TYPE m histogram\nm_bucket{le="1.0"} 1\nm_bucket{le="+Inf"} 1\n'
                 "m_count 1\nm_sum 0.5\n")
    merged = merge_metrics([gauge, histogram])
    assert [(f.name, f.type) for f in text_string_to_metric_families(merged)] == [("m", "gauge")]
    assert _samples(merged) == [("m", (("replica", "1"),), "1.0")]
