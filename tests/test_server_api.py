"""The embedded server over HTTP with the real `openai` client and the real simulator."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from topas_agents.server import ServerConfig, start_server_in_thread

SYS = {"role": "system", "content": "You are the product manager. Write careful PRDs."}


@pytest.fixture(scope="module")
def server():
    cfg = ServerConfig(time_scale=100.0, workflows=("chain3", "dag4"), policy="topas", drain_timeout_s=2.0)
    handle = start_server_in_thread(cfg)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30)


def _stats(server, **params) -> dict:
    return httpx.get(f"{server.base_url}/v1/topas/stats", params=params, timeout=10).json()


def _call(stats: dict, rid: str) -> dict:
    return next(c for c in stats["calls"] if c["rid"] == rid)


def test_labelled_chat_non_streaming(server, client) -> None:
    label = {"task_id": "chat-1", "stage": "s1", "agent": "a", "workflow": "chain3"}
    r = client.chat.completions.create(model="m", messages=[SYS, {"role": "user", "content": "Make a todo app"}],
                                       max_tokens=40, extra_body={"topas": label})
    assert r.choices[0].message.content.startswith("Echo: Make a todo app")
    assert r.choices[0].finish_reason == "stop"
    u = r.usage
    assert u.prompt_tokens == 4096 + _call(_stats(server), r.id)["input_tokens"]  # the workflow's prefix
    assert u.completion_tokens >= 1 and u.total_tokens == u.prompt_tokens + u.completion_tokens
    rec = _call(_stats(server), r.id)
    assert rec["label"] == label and rec["label_source"] == "body" and rec["status"] == "ok"
    assert rec["prefix_source"] == "workflow" and rec["max_new_tokens"] == 40


def test_labelled_chat_streaming_with_usage(server, client) -> None:
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Write code for a CLI ```python"}], stream=True,
        stream_options={"include_usage": True},
        extra_body={"topas": {"task_id": "chat-2", "stage": "plan", "agent": "pm", "prefix_tokens": 300}})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("```python\n") and text.rstrip().endswith("```")
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 2  # really streamed
    assert chunks[-2].choices[0].finish_reason == "stop"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.prompt_tokens > 300 and usage.completion_tokens > 10
    rec = _call(_stats(server), chunks[0].id)
    assert rec["prefix_source"] == "label" and rec["prefix_tokens"] == 300


def test_completions_streaming_and_not_with_header_labels(server, client) -> None:
    headers = {"X-Topas-Task-Id": "cmpl-1", "X-Topas-Stage": "s_a", "X-Topas-Agent": "a",
               "X-Topas-Workflow": "dag4"}
    r = client.completions.create(model="m", prompt="Once upon a time", max_tokens=3, extra_headers=headers)
    assert r.choices[0].text == "Echo: Once" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3
    stream = client.completions.create(model="m", prompt="hello there", stream=True,
                                       stream_options={"include_usage": True}, extra_headers=headers)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Echo: hello there"
    assert chunks[-1].usage.completion_tokens > 0
    rec = _call(_stats(server), r.id)
    assert rec["label_source"] == "headers" and rec["round"] == 0
    assert _call(_stats(server), chunks[0].id)["round"] == 1


def test_body_label_wins_over_headers(server, client) -> None:
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2,
        extra_body={"topas": {"task_id": "win-b", "stage": "s", "agent": "ag"}},
        extra_headers={"X-Topas-Task-Id": "win-h", "X-Topas-Stage": "s", "X-Topas-Agent": "ag"})
    rec = _call(_stats(server), r.id)
    assert rec["task_id"] == "win-b" and rec["label_source"] == "body"


def test_unlabelled_requests_are_served_as_single_stage_tasks(server, client) -> None:
    r = client.chat.completions.create(model="m", messages=[SYS, {"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "Echo: hi"
    stats = _stats(server)
    rec = _call(stats, r.id)
    assert rec["label"] is None and rec["agent"] == "default" and rec["prefix_tokens"] == 0
    task = next(t for t in stats["tasks"]["items"] if t["task_id"] == rec["task_id"])
    assert task["done_reason"] == "single" and task["jct_s"] > 0


@pytest.mark.parametrize(
    ("label", "param"),
    [
        ({"task_id": "", "stage": "s", "agent": "a"}, "topas.task_id"),
        ({"task_id": 7, "stage": "s", "agent": "a"}, "topas.task_id"),
        ({"task_id": "t", "agent": "a"}, "topas.stage"),
        ({"task_id": "t", "stage": "s", "agent": ""}, "topas.agent"),
        ({"task_id": "t", "stage": "s", "agent": "a", "prefix_tokens": -5}, "topas.prefix_tokens"),
        ({"task_id": "t", "stage": "s", "agent": "a", "priority": 1}, "topas.priority"),
        ({"task_id": "t", "stage": "s", "agent": "a", "workflow": "nope"}, "topas.workflow"),
        ({"task_id": "t", "stage": "zz", "agent": "a", "workflow": "chain3"}, "topas.stage"),
        ({"task_id": "t", "stage": "s1", "agent": "b", "workflow": "chain3"}, "topas.agent"),
        ("just-a-string", "topas"),
    ],
)
def test_malformed_labels_are_400_naming_the_field(server, client, label, param) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                       extra_body={"topas": label})
    err = info.value.body
    assert info.value.status_code == 400
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_malformed_header_label_is_400(client) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                       extra_headers={"X-Topas-Task-Id": "t", "X-Topas-Stage": "s",
                                                      "X-Topas-Agent": "a", "X-Topas-Prefix-Tokens": "many"})
    assert info.value.body["param"] == "topas.prefix_tokens"


def test_a_label_header_given_twice_with_two_values_is_400(server) -> None:
    """One of the two was taken silently: which task the call belonged to was a guess."""
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    base = [("X-Topas-Stage", "s"), ("X-Topas-Agent", "a")]
    r = httpx.post(f"{server.url}/chat/completions", json=body,
                   headers=[*base, ("X-Topas-Task-Id", "t1"), ("x-topas-task-id", "t2")])
    assert r.status_code == 400 and r.json()["error"]["param"] == "topas.task_id"
    assert "given twice" in r.json()["error"]["message"]
    same = httpx.post(f"{server.url}/chat/completions", json=body,
                      headers=[*base, ("X-Topas-Task-Id", "t1"), ("X-Topas-Task-Id", "t1")])
    assert same.status_code == 200  # a repeat of the same value is the same label


def test_malformed_bodies_and_over_budget_are_400(server, client) -> None:
    url = f"{server.url}/chat/completions"
    cases = [(b"{not json", None), (b"[1, 2]", None), (b'{"model": "m"}', "messages"),
             (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', "max_tokens")]
    for raw, param in cases:
        r = httpx.post(url, content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, raw
        assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match="KV budget"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=10_000_000)
    assert httpx.get(f"{server.base_url}/health").json()["status"] == "ok"  # nothing else affected


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": ""}, "prompt"),
    ({"prompt": [""]}, "prompt"),
    ({"prompt": [1, -1]}, "prompt"),
    ({"prompt": [1, 2**40]}, "prompt"),
    ({"prompt": "x", "max_tokens": 5, "max_completion_tokens": -3}, "max_completion_tokens"),
])
def test_completions_bodies_the_docs_refuse_are_400(server, body, param) -> None:
    """docs/server.md: an empty prompt is a 400, and so is any invalid length field, even
    beside a valid one (it was silently ignored)."""
    r = httpx.post(f"{server.url}/completions", json={"model": "m", **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert httpx.post(f"{server.url}/completions", json={"model": "m", "prompt": "x", "max_tokens": 2}).status_code == 200


def test_utf8_header_labels_name_the_same_task_as_the_body(server) -> None:
    """httpx (our wrappers) sends header values as UTF-8; the server reads them as the client
    meant, so a non-ASCII task id in a header and in the body is one task."""
    url = f"{server.url}/chat/completions"
    msg = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    label = {"task_id": "café-任务", "stage": "s", "agent": "a"}
    r_body = httpx.post(url, json={**msg, "topas": label})
    r_head = httpx.post(url, json=msg, headers={"X-Topas-Task-Id": label["task_id"].encode(), "X-Topas-Stage": "s",
                                                "X-Topas-Agent": "a"})
    assert r_body.status_code == r_head.status_code == 200
    calls = {c["rid"]: c for c in _stats(server, calls=1000)["calls"]}
    assert calls[r_body.json()["id"]]["label"]["task_id"] == calls[r_head.json()["id"]]["label"]["task_id"] == "café-任务"


def test_workflow_stage_output_profile_sets_the_length(server, client) -> None:
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                       extra_body={"topas": {"task_id": "prof-1", "stage": "s1", "agent": "a",
                                                             "workflow": "chain3"}})
    assert r.usage.completion_tokens == 256  # chain3 s1: output_tokens 256
    assert r.choices[0].message.content == "Echo: x"  # the text stays whole


WF_YAML = """
name: pair
agents: [{name: writer, prefix_tokens: 200}, {name: critic, prefix_tokens: 100}]
stages:
  - {name: draft, agent: writer, input_tokens: 50, output_tokens: 20, requests: [1, 3]}
  - {name: review, agent: critic, after: [draft], input_tokens: 50, output_tokens: 10}
"""


def test_workflow_registration_and_stage_inference(server, client) -> None:
    base = f"{server.base_url}/v1/topas/workflows"
    r = httpx.post(base, content=WF_YAML)
    assert r.status_code == 201 and r.json()["stages"] == ["draft", "review"]
    assert httpx.post(base, content=WF_YAML).status_code == 200  # identical: idempotent
    assert httpx.post(base, content=WF_YAML.replace("200", "201")).status_code == 409
    bad = httpx.post(base, json={"name": "x", "agents": [{"name": "a", "prefix_tokens": 1}],
                                 "stages": [{"name": "s", "agent": "ghost", "input_tokens": 1, "output_tokens": 1}]})
    assert bad.status_code == 400 and "unknown agent 'ghost'" in bad.json()["error"]["message"]
    assert httpx.post(base, content="a: [b").status_code == 400
    # a built-in by name, derived ones too (before: "expected a mapping, got str" for those,
    # and for an unknown name)
    assert httpx.post(base, content="metagpt-sop-noqa").json()["name"] == "metagpt-sop-noqa"
    unknown = httpx.post(base, content="nosuchthing")
    assert unknown.status_code == 400 and "unknown built-in workflow 'nosuchthing'" in unknown.text
    assert "metagpt-sop-noqa" in unknown.text
    # an agent that another registered workflow declares with another prefix size: said (one of
    # the two is modelled with the wrong prefix; it was taken without a word)
    reuse = {"name": "reuses-writer", "agents": [{"name": "writer", "prefix_tokens": 150}],
             "stages": [{"name": "s", "agent": "writer", "input_tokens": 8, "output_tokens": 4}]}
    r = httpx.post(base, json=reuse)
    assert r.status_code == 201 and r.json()["warnings"] == [
        "agent 'writer' has a 200-token prefix in workflow 'pair' and 150 here: an agent is one prefix on this "
        "server, which keeps the size it met first; give the agents distinct names"]
    same = httpx.post(base, json={**reuse, "name": "same-writer", "agents": [{"name": "writer", "prefix_tokens": 200}]})
    assert [w.split(" here")[0] for w in same.json()["warnings"]] == [  # pair's 200 agrees; the one above not
        "agent 'writer' has a 150-token prefix in workflow 'reuses-writer' and 200"]
    listed = httpx.post(base, content="[1]").json()["error"]["message"]
    assert listed == "request body: workflow: expected a mapping, got list"
    assert "pair" in httpx.get(base).json()["workflows"]

    def call(stage: str, agent: str) -> None:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}],
                                       extra_body={"topas": {"task_id": "wf-1", "stage": stage, "agent": agent,
                                                             "workflow": "pair"}})

    call("draft", "writer")
    call("draft", "writer")
    task = next(t for t in _stats(server)["tasks"]["items"] if t["task_id"] == "wf-1")
    assert task["stages"]["draft"] == {"calls": 2, "finished": 2, "in_flight": 0, "done": False}
    call("review", "critic")  # implies draft done; review (requests: 1) done when it ends -> task done
    stats = _stats(server)
    task = next(t for t in stats["tasks"]["items"] if t["task_id"] == "wf-1")
    assert task["stages"]["draft"]["done"] and task["stages"]["review"]["done"]
    assert task["done_reason"] == "workflow" and task["jct_s"] > 0
    assert {"workflow": "pair", "stage": "draft", "calls": 2, "tasks": 1} in stats["stages"]
    assert any(p["agent"] == "writer" and p["tokens"] == 200 for p in stats["prefixes"])


def test_explicit_stage_and_task_done(server, client) -> None:
    lab = {"task_id": "ex-1", "stage": "think", "agent": "solo"}
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                   extra_body={"topas": lab})
    base = f"{server.base_url}/v1/topas/tasks"
    r = httpx.post(f"{base}/ex-1/stages/think/done")
    assert r.status_code == 200 and r.json()["stages"]["think"]["done"] and not r.json()["done"]
    r = httpx.post(f"{base}/ex-1/done")
    assert r.json()["done_reason"] == "explicit" and r.json()["jct_s"] >= 0
    assert httpx.post(f"{base}/nope/done").status_code == 404
    with pytest.raises(openai.ConflictError):  # the client said it is done
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       extra_body={"topas": lab})


def test_a_task_the_client_says_failed_ends_without_a_jct(server, client) -> None:
    from topas_agents import task

    base = f"{server.base_url}/v1/topas/tasks"
    before = httpx.get(f"{server.base_url}/v1/topas/stats").json()
    # a `task()` block left by an exception sends ?outcome=failed (it sent a plain done: a JCT)
    with pytest.raises(RuntimeError), task("fail-1", base_url=server.url):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       extra_body={"topas": {"task_id": "fail-1", "stage": "think", "agent": "solo"}})
        raise RuntimeError("the agent crashed")
    stats = httpx.get(f"{server.base_url}/v1/topas/stats").json()
    item = next(t for t in stats["tasks"]["items"] if t["task_id"] == "fail-1")
    assert (item["done_reason"], item["jct_s"]) == ("failed", None)
    assert stats["tasks"]["failed"] == before["tasks"]["failed"] + 1
    assert stats["jct"]["count"] == before["jct"]["count"]
    # a clean block still sends a plain done
    with task("fine-1", base_url=server.url):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       extra_body={"topas": {"task_id": "fine-1", "stage": "think", "agent": "solo"}})
    assert httpx.post(f"{base}/fine-1/done").json()["done_reason"] == "explicit"
    r = httpx.post(f"{base}/fine-1/done", params={"outcome": "maybe"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "outcome"
    for outcome in ("failed", "ok"):
        r = httpx.post(f"{base}/fine-1/stages/think/done", params={"outcome": outcome})
        assert r.status_code == 400 and "not to a stage" in r.json()["error"]["message"]
    r = httpx.post(f"{base}/fine-1/done?outcome=failed&outcome=ok")  # the last one won, silently
    assert r.status_code == 400 and "2 times" in r.json()["error"]["message"]


_SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? '
                     r'(NaN|[+-]Inf|-?[0-9.]+(e[+-]?[0-9]+)?)$')


def test_metrics_are_valid_prometheus_text(server, client) -> None:
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    r = httpx.get(f"{server.base_url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families: dict[str, str] = {}
    for line in r.text.splitlines():
        if line.startswith("# TYPE"):
            _, _, name, kind = line.split()
            families[name] = kind
        elif not line.startswith("# HELP"):
            assert _SAMPLE.match(line), line
    for name in ("topas_http_requests_total", "topas_num_requests_waiting", "topas_num_requests_running",
                 "topas_kv_used_tokens", "topas_kv_budget_tokens", "topas_decisions_total",
                 "topas_decision_latency_seconds", "topas_prefix_cache_queries_total", "topas_prefix_cache_hits_total"):
        assert name in families, name
    assert families["topas_decision_latency_seconds"] == "histogram"  # task JCT too: tests/test_server_metrics.py
    assert re.search(r'topas_http_requests_total\{endpoint="/v1/chat/completions",status="200"\} [1-9]', r.text)
    assert re.search(r"^topas_decisions_total [1-9]", r.text, re.M)


def test_health_models_stats_and_unknown_routes(server) -> None:
    assert httpx.get(f"{server.base_url}/health").json()["status"] == "ok"
    models = openai.OpenAI(base_url=server.url, api_key="x").models.list()
    assert [m.id for m in models.data] == ["topas-sim"]
    stats = _stats(server, calls=1)
    assert len(stats["calls"]) == 1
    for key in ("engine", "kv", "queues", "batch_size", "prefixes", "tasks", "stages", "jct", "workflows"):
        assert key in stats
    assert stats["engine"]["decisions"] > 0 and stats["kv"]["budget"] > 0
    r = httpx.get(f"{server.base_url}/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_models_retrieve_answers_the_served_model_and_404s_another(server) -> None:
    # before: GET /v1/models/{id} was 404 for every id, so openai's models.retrieve (which
    # SGLang serves, and some frameworks call to check a model) failed against the sim server
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
    card = client.models.retrieve("topas-sim")
    assert (card.id, card.object, card.owned_by) == ("topas-sim", "model", "topas-agents")
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4o")
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"
    assert "'gpt-4o'" in err.value.body["message"]
    assert httpx.get(f"{server.base_url}/v1/models/org/model%2Fx").status_code == 404  # a path is a name too


def test_a_task_served_without_a_dag_stays_so_when_a_workflow_is_uploaded() -> None:
    # on a server with no workflows any workflow name is served without a DAG; another
    # client's upload made the task's next call a 400 ("unknown workflow")
    handle = start_server_in_thread(ServerConfig(time_scale=100.0, drain_timeout_s=2.0))
    try:
        c = openai.OpenAI(base_url=handle.url, api_key="unused", max_retries=0, timeout=30)

        def call(task_id: str) -> None:
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                      extra_body={"topas": {"task_id": task_id, "stage": "s", "agent": "a",
                                                            "workflow": "typo-wf"}})

        call("ST1")
        wf = {"name": "good", "agents": [{"name": "w", "prefix_tokens": 10}],
              "stages": [{"name": "s", "agent": "w", "input_tokens": 8, "output_tokens": 4}]}
        assert httpx.post(f"{handle.base_url}/v1/topas/workflows", json=wf, timeout=10).status_code == 201
        call("ST1")  # the task as it started
        with pytest.raises(openai.BadRequestError, match="unknown workflow 'typo-wf'"):
            call("ST2")  # a new task is checked against what is registered now
        task = next(t for t in _stats(handle)["tasks"]["items"] if t["task_id"] == "ST1")
        assert task["stages"]["s"]["calls"] == 2 and not task["workflow_registered"]
    finally:
        handle.stop()


def test_stats_rows_encoded_once_are_the_rows_a_full_build_gives(server, client) -> None:
    # /v1/topas/stats joins cached JSON of rows that no longer change; after a task is reopened
    # (a late call) and calls finish, the text must still be the full build's
    import json as _json

    from topas_agents.server.stats import build_stats, build_stats_json

    lab = {"task_id": "rows-1", "stage": "s1", "agent": "a", "workflow": "chain3"}
    for stage in ("s1", "s2", "s3"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                       extra_body={"topas": dict(lab, stage=stage, agent={"s1": "a", "s2": "b", "s3": "c"}[stage])})
    first = _stats(server)
    assert next(t for t in first["tasks"]["items"] if t["task_id"] == "rows-1")["done"]
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                   extra_body={"topas": dict(lab, stage="s3", agent="c")})  # reopens it
    svc = server.service
    assert _json.loads(build_stats_json(svc)) == _json.loads(_json.dumps(build_stats(svc)))
    again = next(t for t in _stats(server)["tasks"]["items"] if t["task_id"] == "rows-1")
    assert again["reopened"] == 1 and again["stages"]["s3"]["calls"] == 2 and again["done_reason"] == "workflow"
    httpx.post(f"{server.base_url}/v1/topas/tasks/rows-1/done", timeout=10)  # changes only its done_reason
    closed = next(t for t in _stats(server)["tasks"]["items"] if t["task_id"] == "rows-1")
    assert closed["done_reason"] == "explicit"


def test_stop_sequences_end_the_text(client) -> None:
    # checked, then ignored: "Echo: Thought: go Observation: fake" came back whole, which a
    # ReAct parser reads as the model's own observation
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Thought: go Observation: fake"}],
                                       stop=["Observation:", "never"], max_tokens=50)
    text = r.choices[0].message.content
    assert "Observation" not in text and text.startswith("Echo: Thought: go") and r.choices[0].finish_reason == "stop"
    c = client.completions.create(model="m", prompt="alpha beta gamma", stop="beta", max_tokens=50)
    assert "beta" not in c.choices[0].text and "alpha" in c.choices[0].text
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "one two three"}],
                                            stop="two", stream=True)
    assert "two" not in "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)


def test_max_tokens_is_read_as_sglang_reads_an_integer(server) -> None:
    url = f"{server.base_url}/v1/chat/completions"
    for value in (3.0, "3"):
        r = httpx.post(url, json={"messages": [{"role": "user", "content": "a b c d e f g"}], "max_tokens": value}, timeout=10)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3, r.text
    for value in (3.5, "x", True, 0):
        r = httpx.post(url, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": value}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
