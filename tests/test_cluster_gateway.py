"""Three sim replicas behind smg and the Topas front, on loopback: labels survive the
gateway (chat, completions and responses, streaming or not, body or header labels), task affinity,
the control plane, and a clean stop."""

from __future__ import annotations

import collections
import importlib.util
import os

import httpx
import openai
import pytest

from topas_agents import label
from topas_agents.integrations.openai_client import labelled

pytestmark = pytest.mark.skipif(importlib.util.find_spec("smg") is None, reason="needs the [cluster] extra (smg)")

SERVE_ARGS = ("--workflow", "chain3", "--time-scale", "100", "--log-level", "warning")
STAGES = (("s1", "a"), ("s2", "b"), ("s3", "c"))


@pytest.fixture(scope="module")
def cluster():
    from topas_agents.server.cluster.launcher import free_base_port, run_replicas

    handle = run_replicas(3, port=free_base_port(6), serve_args=SERVE_ARGS, startup_timeout_s=60)
    try:
        yield handle
    finally:
        handle.stop()
    assert all(not child.alive() for child in handle.children)
    assert handle.temporary_logs and not handle.log_dir.exists()  # a clean stop removes its own folder


def _replica_calls(cluster) -> dict[str, list[tuple[int, dict]]]:
    """task id -> [(replica, call record)] from every replica's stats."""
    out: dict[str, list[tuple[int, dict]]] = collections.defaultdict(list)
    for i, url in enumerate(cluster.config.replica_urls, start=1):
        for rec in httpx.get(f"{url}/v1/topas/stats", params={"calls": 10_000}).json()["calls"]:
            out[rec["task_id"]].append((i, rec))
    return out


def _send(client: httpx.Client, base: str, task: str, stage: str, agent: str, *, endpoint: str,
          stream: bool, how: str) -> str:
    lab = {"task_id": task, "stage": stage, "agent": agent, "workflow": "chain3"}
    body: dict = {"model": "any-name", "max_tokens": 6, "stream": stream}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": f"hello from {task}"}]
    elif endpoint == "responses":  # smg refuses an unknown `topas` field there: the front moves it
        body = {"model": "any-name", "max_output_tokens": 6, "stream": stream, "input": f"hello from {task}",
                "metadata": {"mine": "kept"}}
    else:
        body["prompt"] = f"hello from {task}"
    headers = {}
    if how == "body":
        body["topas"] = lab
    else:
        headers = {"X-Topas-Task-Id": task, "X-Topas-Stage": stage, "X-Topas-Agent": agent,
                   "X-Topas-Workflow": "chain3"}
    path = {"chat": "/chat/completions", "responses": "/responses"}.get(endpoint, "/completions")
    r = client.post(base + path, json=body, headers=headers)
    assert r.status_code == 200, r.text
    if stream and endpoint == "responses":
        assert r.text.rstrip().rsplit("\n\n", 1)[-1].startswith(("event: response.completed", "event: response.incomplete"))
    elif stream:
        assert r.text.rstrip().endswith("data: [DONE]")
    elif endpoint == "responses":
        assert r.json()["metadata"]["mine"] == "kept"  # the caller's own metadata travels too
    return r.text


@pytest.mark.parametrize("how", ["body", "headers"])
@pytest.mark.parametrize("endpoint", ["chat", "completion", "responses"])
@pytest.mark.parametrize("stream", [False, True])
def test_labels_survive_and_tasks_stay_whole(cluster, how, endpoint, stream):
    prefix = f"lab-{how}-{endpoint}-{int(stream)}-"
    with httpx.Client(timeout=30) as client:
        for t in range(3):
            for stage, agent in STAGES:
                _send(client, cluster.url, f"{prefix}{t}", stage, agent, endpoint=endpoint, stream=stream, how=how)
    calls = {k: v for k, v in _replica_calls(cluster).items() if k.startswith(prefix)}
    assert sorted(calls) == [f"{prefix}{t}" for t in range(3)]
    for task, recs in calls.items():
        assert len({replica for replica, _ in recs}) == 1, f"{task} split across replicas"
        assert [r["stage"] for _, r in recs] == ["s1", "s2", "s3"]
        for _, rec in recs:
            assert rec["label"]["task_id"] == task and rec["workflow"] == "chain3"
            assert rec["label_source"] == "body"  # header labels are lifted into the body


def test_wrapper_client_routes_by_task(cluster):
    client = labelled(openai.OpenAI(base_url=cluster.url, api_key="unused"))
    for t in range(4):
        for stage, agent in STAGES:
            with label(task_id=f"wrap-{t}", stage=stage, agent=agent, workflow="chain3"):
                out = client.chat.completions.create(model="m", max_tokens=5,
                                                     messages=[{"role": "user", "content": "hi"}])
                assert out.choices[0].message.content
    calls = {k: v for k, v in _replica_calls(cluster).items() if k.startswith("wrap-")}
    assert len(calls) == 4
    assert all(len({i for i, _ in recs}) == 1 and len(recs) == 3 for recs in calls.values())


def test_bad_header_label_is_the_replicas_400(cluster):
    r = httpx.post(cluster.url + "/chat/completions", headers={"X-Topas-Task-Id": "x", "X-Topas-Stage": "s1"},
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "topas.agent"


def test_workflow_registration_reaches_every_replica(cluster):
    yaml_text = ("name: pair\nagents:\n  - {name: p, prefix_tokens: 100}\n  - {name: q, prefix_tokens: 100}\n"
                 "stages:\n  - {name: one, agent: p, after: [], input_tokens: 10, output_tokens: 10}\n"
                 "  - {name: two, agent: q, after: [one], input_tokens: 10, output_tokens: 10}\n")
    r = httpx.post(cluster.base_url + "/v1/topas/workflows", content=yaml_text)
    assert r.status_code == 201, r.text
    assert [x["status"] for x in r.json()["replicas"]] == [201, 201, 201]
    again = httpx.post(cluster.base_url + "/v1/topas/workflows", content=yaml_text)
    assert again.status_code == 200 and again.json()["created"] is False
    for url in cluster.config.replica_urls:
        assert "pair" in httpx.get(url + "/v1/topas/workflows").json()["workflows"]
    listed = httpx.get(cluster.base_url + "/v1/topas/workflows").json()
    assert {"chain3", "pair"} <= set(listed["workflows"])
    bad = httpx.post(cluster.base_url + "/v1/topas/workflows", content="name: [")
    assert bad.status_code == 400


def test_task_done_reaches_the_owner(cluster):
    with httpx.Client(timeout=30) as client:
        _send(client, cluster.url, "own-1", "s1", "a", endpoint="chat", stream=False, how="body")
    owner = {i for i, _ in _replica_calls(cluster)["own-1"]}
    r = httpx.post(cluster.base_url + "/v1/topas/tasks/own-1/done")
    assert r.status_code == 200, r.text
    assert r.json()["task_id"] == "own-1"
    statuses = [x["status"] for x in r.json()["replicas"]]
    assert [i + 1 for i, s in enumerate(statuses) if s == 200] == sorted(owner)
    assert httpx.post(cluster.base_url + "/v1/topas/tasks/nobody/done").status_code == 404
    late = httpx.post(cluster.url + "/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}],
        "topas": {"task_id": "own-1", "stage": "s2", "agent": "b", "workflow": "chain3"}})
    assert late.status_code == 409  # the owner saw the done


def test_stats_and_metrics_are_one_view(cluster):
    with httpx.Client(timeout=30) as client:
        for stage, agent in STAGES:
            _send(client, cluster.url, "view-1", stage, agent, endpoint="chat", stream=False, how="body")
    view = httpx.get(cluster.base_url + "/v1/topas/stats").json()
    c = view["cluster"]
    assert c["replicas"] == 3 and c["replicas_up"] == 3
    per_replica_ok = sum((r["calls_by_status"] or {}).get("ok", 0) for r in view["replicas"])
    assert c["calls_by_status"]["ok"] == per_replica_ok >= 3
    assert c["tasks"]["split"] == 0
    assert c["jct"]["count"] >= 1 and c["jct"]["mean_s"] > 0
    metrics = httpx.get(cluster.base_url + "/metrics").text
    assert 'replica="1"' in metrics and 'replica="3"' in metrics
    assert metrics.count("# TYPE topas_calls_total") == 1
    assert httpx.get(cluster.base_url + "/health").json()["replicas_up"] == 3


def test_a_client_reads_the_cluster_as_one_server(cluster):
    # `topas run/eval --server FRONT` read the engine, clock and per-task JCT as from one server:
    # without these keys they reported JCT null in "wall seconds" against a simulated cluster
    from topas_agents.integrations.metagpt.server_api import fetch_stats, server_info

    with httpx.Client(timeout=30) as client:
        for stage, agent in STAGES:
            _send(client, cluster.url, "one-view-1", stage, agent, endpoint="chat", stream=False, how="body")
    info = server_info(cluster.url)
    assert (info.engine, info.time_scale, info.jct_unit) == ("sim", 100.0, "simulated seconds")
    stats = fetch_stats(cluster.url)
    [item] = [t for t in stats["tasks"]["items"] if t["task_id"] == "one-view-1"]
    assert item["done"] and len(item["replicas"]) == 1
    assert item["jct_s"] == pytest.approx(item["finish_s"] - item["arrival_s"]) and item["jct_s"] > 0
    assert {name: st["calls"] for name, st in item["stages"].items()} == {"s1": 1, "s2": 1, "s3": 1}
    assert sorted(c["stage"] for c in stats["calls"] if c["task_id"] == "one-view-1") == ["s1", "s2", "s3"]


def test_children_are_own_process_groups(cluster):
    for child in cluster.children:
        assert os.getpgid(child.pid) == child.pid
