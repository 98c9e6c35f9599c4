"""The httpx-level label hook and the `task()` scope against the embedded simulator server,
with plain httpx clients and with `openai` clients built the way LangChain, AutoGen and
LiteLLM/CrewAI build theirs (`http_client=` an httpx client we made)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from topas_agents import label
from topas_agents.errors import ConfigError
from topas_agents.integrations import httpx_labels as hl
from topas_agents.integrations.openai_client import labelled
from topas_agents.integrations.task import close_task, done_url, fields_in_force, task
from topas_agents.server import ServerConfig, start_server_in_thread
from topas_agents.server.api_errors import ApiError

MSG = [{"role": "system", "content": "You are the planner."}, {"role": "user", "content": "plan a todo app"}]


@pytest.fixture(scope="module")
def server():
    # idle timeout off: a task without a workflow only ends by an explicit done call
    handle = start_server_in_thread(ServerConfig(time_scale=200.0, policy="topas", task_idle_timeout_s=0.0))
    yield handle
    handle.stop()


def _stats(server) -> dict:
    return httpx.get(f"{server.base_url}/v1/topas/stats", timeout=10).json()


def _calls(server, task_id: str) -> list[dict]:
    return [c for c in _stats(server)["calls"] if c["task_id"] == task_id]


def _task(server, task_id: str) -> dict:
    return next(t for t in _stats(server)["tasks"]["items"] if t["task_id"] == task_id)


def test_transport_adds_body_and_headers_to_openai_http_client(server):
    # LangChain: ChatOpenAI(http_client=...) passes it to openai.OpenAI(http_client=...)
    client = openai.OpenAI(base_url=server.url, api_key="x", http_client=hl.labelled_http_client(timeout=30))
    with label(task_id="lc-1", stage="plan", agent="planner"):
        client.chat.completions.create(model="m", messages=MSG, max_tokens=8)
    [call] = _calls(server, "lc-1")
    assert (call["stage"], call["agent"], call["label_source"]) == ("plan", "planner", "body")


def test_unlabelled_request_is_sent_unchanged(server):
    seen: list[httpx.Request] = []
    http = hl.labelled_http_client(timeout=30, event_hooks={"request": [seen.append]})
    client = openai.OpenAI(base_url=server.url, api_key="x", http_client=http)
    client.chat.completions.create(model="m", messages=MSG, max_tokens=8)
    assert not any(k.lower().startswith("x-topas") for k in seen[-1].headers)
    rid = _stats(server)["calls"][-1]
    assert rid["label_source"] == "none"


def test_event_hook_adds_headers_only(server):
    http = httpx.Client(event_hooks={"request": [hl.add_label_headers]}, timeout=30)
    with label(task_id="hook-1", stage="code", agent="coder"):
        rsp = http.post(f"{server.url}/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 8})
    assert rsp.status_code == 200
    [call] = _calls(server, "hook-1")
    assert (call["stage"], call["agent"], call["label_source"]) == ("code", "coder", "headers")


def test_non_ascii_labels_reach_the_server_by_transport_and_by_hook(server):
    # before: httpx encoded the added headers as ASCII, so "café" raised UnicodeEncodeError
    # (reported by the openai client as a connection error)
    client = openai.OpenAI(base_url=server.url, api_key="x", http_client=hl.labelled_http_client(timeout=30),
                           max_retries=0)
    with label(task_id="café-1", stage="plan", agent="planner"):
        client.chat.completions.create(model="m", messages=MSG, max_tokens=8)
    [call] = _calls(server, "café-1")
    assert call["label_source"] == "body"
    http = httpx.Client(event_hooks={"request": [hl.add_label_headers]}, timeout=30)
    with label(task_id="naïve-2", stage="code", agent="coder"):
        rsp = http.post(f"{server.url}/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 8})
    assert rsp.status_code == 200
    [call] = _calls(server, "naïve-2")  # UTF-8 in the header, decoded back by the server
    assert (call["stage"], call["label_source"]) == ("code", "headers")


def test_explicit_label_on_the_request_wins(server):
    http = hl.labelled_http_client(timeout=30)
    body = {"model": "m", "messages": MSG, "max_tokens": 8,
            "topas": {"task_id": "mine-1", "stage": "s", "agent": "a"}}
    with label(task_id="ctx-1", stage="plan", agent="planner"):
        assert http.post(f"{server.url}/chat/completions", json=body).status_code == 200
    assert _calls(server, "mine-1") and not _calls(server, "ctx-1")


def test_explicit_header_label_wins_over_the_label_in_force(server):
    # before: the transport added the context label to the body, which the server reads
    # first, so the caller's own X-Topas-* headers were thrown away
    http = hl.labelled_http_client(timeout=30)
    headers = {"x-topas-task-id": "hdr-1", "X-Topas-Stage": "s", "X-TOPAS-AGENT": "a"}
    with label(task_id="ctx-2", stage="plan", agent="planner"):
        rsp = http.post(f"{server.url}/chat/completions", headers=headers,
                        json={"model": "m", "messages": MSG, "max_tokens": 8})
    assert rsp.status_code == 200
    [call] = _calls(server, "hdr-1")
    assert call["label_source"] == "headers" and not _calls(server, "ctx-2")


def test_hook_adds_nothing_to_a_labelled_request():
    lab = hl.Label("ctx", "s", "a")
    with label(task_id="ctx", stage="s", agent="a"):
        body_labelled = httpx.Request("POST", "http://x/v1/chat/completions",
                                      json={"topas": {"task_id": "mine", "stage": "s", "agent": "a"}})
        hl.add_label_headers(body_labelled)
        header_labelled = httpx.Request("POST", "http://x/v1/chat/completions", json={},
                                        headers={"X-Topas-Task-Id": "mine"})
        hl.add_label_headers(header_labelled)
    assert not any(k.lower().startswith("x-topas") for k in body_labelled.headers)
    assert header_labelled.headers.get_list("x-topas-task-id") == ["mine"]
    assert "x-topas-stage" not in header_labelled.headers
    assert hl.label_request(header_labelled, lab) is header_labelled


def test_composes_with_labelled_wrapper_without_conflict(server):
    http = hl.labelled_http_client(timeout=30)
    client = labelled(openai.OpenAI(base_url=server.url, api_key="x", http_client=http))
    with label(task_id="both-1", stage="plan", agent="planner"):
        client.chat.completions.create(model="m", messages=MSG, max_tokens=8)
    assert len(_calls(server, "both-1")) == 1


def test_non_json_and_get_requests_pass_through():
    lab = hl.Label("t", "s", "a")
    req = httpx.Request("POST", "http://x/v1/files", content=b"raw bytes", headers={"content-type": "text/plain"})
    out = hl.label_request(req, lab)
    assert out.content == b"raw bytes" and out.headers["x-topas-task-id"] == "t"
    get = hl.label_request(httpx.Request("GET", "http://x/v1/models"), lab)
    assert get.headers["x-topas-stage"] == "s"
    array = httpx.Request("POST", "http://x", json=[1, 2])
    assert hl.label_request(array, lab).content == array.content


def test_transport_options_reach_the_inner_transport():
    http = hl.labelled_http_client(verify=False, limits=httpx.Limits(max_connections=3))
    inner = http._transport._inner  # noqa: SLF001 - the wrapped default transport
    assert isinstance(http._transport, hl.LabelTransport) and isinstance(inner, httpx.HTTPTransport)
    assert inner._pool._max_connections == 3  # noqa: SLF001


def test_defaults_are_openais_and_the_environments_proxy_applies(server, monkeypatch):
    """The labelled clients replace openai's own: they had httpx's 100 connections (the 101st
    concurrent call waited in the client), no redirects, and went past HTTP_PROXY."""
    for make in (hl.labelled_http_client, hl.labelled_async_http_client):
        client = make()
        assert client._transport._inner._pool._max_connections == 1000  # noqa: SLF001
        assert client.follow_redirects is True
    url = f"{server.base_url}/health"
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens: a dead proxy
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with pytest.raises(httpx.TransportError), hl.labelled_http_client() as via_proxy:
        via_proxy.get(url)
    with hl.labelled_http_client(trust_env=False) as direct:
        assert direct.get(url).status_code == 200
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with hl.labelled_http_client() as exempt:
        assert exempt.get(url).status_code == 200


async def test_async_transport_isolates_concurrent_labels(server):
    # AutoGen / LiteLLM async paths: openai.AsyncOpenAI(http_client=httpx.AsyncClient(...))
    client = openai.AsyncOpenAI(base_url=server.url, api_key="x",
                                http_client=hl.labelled_async_http_client(timeout=30))

    async def one(i: int) -> None:
        with label(task_id=f"async-{i}", stage=f"s{i}", agent=f"a{i % 2}"):
            await asyncio.sleep(0.001 * (4 - i))
            await client.chat.completions.create(model="m", messages=MSG, max_tokens=8)

    await asyncio.gather(*(one(i) for i in range(4)))
    for i in range(4):
        [call] = _calls(server, f"async-{i}")
        assert (call["stage"], call["agent"], call["label_source"]) == (f"s{i}", f"a{i % 2}", "body")


async def test_a_client_per_agent_labels_each_agents_calls_under_the_callers_task(server):
    # Frameworks where each agent holds its own client (OpenAI Agents SDK models, LangGraph
    # nodes with their own ChatOpenAI): stage and agent fixed per client, the task from the caller
    def client(stage: str, agent: str) -> openai.AsyncOpenAI:
        http = hl.labelled_async_http_client(stage=stage, agent=agent, timeout=30)
        return openai.AsyncOpenAI(base_url=server.url, api_key="x", http_client=http)

    planner, coder = client("plan", "planner"), client("code", "coder")
    async with task(task_id="per-agent-1", base_url=server.url):
        await planner.chat.completions.create(model="m", messages=MSG, max_tokens=8)
        await coder.chat.completions.create(model="m", messages=MSG, max_tokens=8)
        with label(stage="review"):  # the client's own fields win over the caller's
            await coder.chat.completions.create(model="m", messages=MSG, max_tokens=8)
    seen = sorted(_calls(server, "per-agent-1"), key=lambda c: c["arrival_s"])
    assert [(c["stage"], c["agent"], c["label_source"]) for c in seen] == [
        ("plan", "planner", "body"), ("code", "coder", "body"), ("code", "coder", "body")]
    assert _task(server, "per-agent-1")["done_reason"] == "explicit"
    await planner.chat.completions.create(model="m", messages=MSG, max_tokens=8)  # no task: unlabelled
    assert _stats(server)["calls"][-1]["label_source"] == "none"


def test_a_clients_own_label_fields_are_checked_when_it_is_built():
    with pytest.raises(ConfigError, match="stage"):
        hl.labelled_http_client(stage="bad\nstage")
    with pytest.raises(ConfigError, match="prefix_tokens"):
        hl.labelled_async_http_client(prefix_tokens=-1)
    with pytest.raises(ConfigError, match="unknown label field"):
        hl.LabelTransport(fields={"stag": "x"})


async def test_async_event_hook(server):
    http = httpx.AsyncClient(event_hooks={"request": [hl.aadd_label_headers]}, timeout=30)
    with label(task_id="ahook-1", stage="plan", agent="planner"):
        await http.post(f"{server.url}/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 8})
    assert _calls(server, "ahook-1")[0]["label_source"] == "headers"


# ------------------------------------------------------------------------------- task()

def test_done_url_quotes_the_task_id():
    assert done_url("http://h:1/v1/", "a b/c") == "http://h:1/v1/topas/tasks/a%20b%2Fc/done"
    # dot segments are resolved by httpx and curl: the done call for ".." reached /v1/topas/done
    assert done_url("http://h:1/v1", "..") == "http://h:1/v1/topas/tasks/%2E%2E/done"
    assert done_url("http://h:1/v1", ".") == "http://h:1/v1/topas/tasks/%2E/done"
    assert done_url("http://h:1/v1", "a.b") == "http://h:1/v1/topas/tasks/a.b/done"


def test_task_scope_labels_calls_and_closes_the_task(server):
    client = labelled(openai.OpenAI(base_url=server.url, api_key="x"))
    with task(task_id="scope-1", client=client) as handle:
        assert fields_in_force() == {"task_id": "scope-1"}
        for stage, agent in (("plan", "planner"), ("code", "coder")):
            with label(stage=stage, agent=agent):
                client.chat.completions.create(model="m", messages=MSG, max_tokens=8)
        assert not _task(server, "scope-1")["done"]  # no workflow, no idle timeout: still open
    assert handle.task_id == "scope-1" and fields_in_force() == {}
    info = _task(server, "scope-1")
    assert info["done"] and info["done_reason"] == "explicit"
    assert [c["stage"] for c in _calls(server, "scope-1")] == ["plan", "code"]


@pytest.mark.parametrize("task_id", ["repo/issue-7", "x/stages/y", "café 2", "%41"])
def test_task_ids_with_slashes_and_escapes_close(server, task_id):
    # before: the done route was /tasks/{task_id}/done, and a %2F in the id is decoded before
    # routing, so a task named "repo/issue-7" could never be closed (404)
    client = labelled(openai.OpenAI(base_url=server.url, api_key="x"))
    with task(task_id=task_id, client=client), label(stage="plan", agent="planner"):
        client.chat.completions.create(model="m", messages=MSG, max_tokens=8)
    assert _task(server, task_id)["done"]


async def test_metagpt_runner_closes_a_task_whose_id_holds_a_slash(server):
    # `topas run --task-id-prefix repo/x` ids: the runner's done call built the URL unescaped
    from topas_agents.integrations.task import aclose_task

    client = labelled(openai.AsyncOpenAI(base_url=server.url, api_key="x"))
    with label(task_id="repo/x b#1-0", stage="plan", agent="planner"):
        await client.chat.completions.create(model="m", messages=MSG, max_tokens=8)
    assert await aclose_task(server.url, "repo/x b#1-0", missing_ok=True)
    assert _task(server, "repo/x b#1-0")["done"]


def test_done_paths_are_split_exactly():
    from topas_agents.server.app import done_target

    assert done_target(b"/v1/topas/tasks/a%2Fb/done", "") == ("a/b", None)
    assert done_target(b"/v1/topas/tasks/a%2Fb/stages/s%2F1/done?x=1", "") == ("a/b", "s/1")
    assert done_target(b"/v1/topas/tasks/caf%C3%A9/done", "") == ("café", None)
    assert done_target(None, "t/done") == ("t", None)
    for bad in (b"/v1/topas/tasks/a/b/done", b"/v1/topas/tasks//done", b"/v1/topas/tasks/a/stages//done",
                b"/v1/topas/tasks/a/finish"):
        with pytest.raises(ApiError):
            done_target(bad, "")


async def test_async_task_scope_with_fresh_id(server):
    client = openai.AsyncOpenAI(base_url=server.url, api_key="x",
                                http_client=hl.labelled_async_http_client(timeout=30))
    async with task(base_url=server.url) as handle:
        with label(stage="plan", agent="planner"):
            await client.chat.completions.create(model="m", messages=MSG, max_tokens=8)
    assert handle.task_id.startswith("task-")
    assert _task(server, handle.task_id)["done_reason"] == "explicit"


def test_task_closes_even_when_the_block_raises(server):
    client = labelled(openai.OpenAI(base_url=server.url, api_key="x"))
    with pytest.raises(RuntimeError), task(task_id="boom-1", base_url=server.url):
        with label(stage="plan", agent="planner"):
            client.chat.completions.create(model="m", messages=MSG, max_tokens=8)
        raise RuntimeError("agent failed")
    assert _task(server, "boom-1")["done"]


def test_calls_outside_a_stage_go_unlabelled_inside_a_task(server):
    client = labelled(openai.OpenAI(base_url=server.url, api_key="x"))
    with task(task_id="partial-1", close=False):
        client.chat.completions.create(model="m", messages=MSG, max_tokens=8)
    assert not _calls(server, "partial-1")


def test_task_done_on_an_unreachable_server_only_warns(caplog):
    assert close_task("http://127.0.0.1:9/v1", "t") is False
    assert "task-done for t failed" in caplog.text


def test_task_needs_one_place_to_send_done():
    with pytest.raises(ConfigError):
        task(base_url="http://h/v1", client=openai.OpenAI(base_url="http://h/v1", api_key="x"))


def test_task_refuses_an_empty_id_and_a_non_string_url():
    # before: task(task_id="") made up a random id, and base_url=5 entered fine and then
    # raised AttributeError from __exit__, masking the block's own outcome
    from topas_agents.errors import LabelError
    with pytest.raises(LabelError, match="must not be empty"), task(task_id=""):
        pass
    with pytest.raises(ConfigError, match="base_url must be a string"):
        task("t", base_url=5)
    assert task().handle.task_id.startswith("task-")  # None still means a fresh id


def test_the_callers_mounts_are_labelled_too():
    # before: labelled_http_client(mounts=...) passed the caller's transports to httpx bare, so
    # every call routed through one went out unlabelled without a word
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    # a None mount (httpx: no proxy for that pattern) stays None
    sync = hl.labelled_http_client(mounts={"http://127.0.0.1": httpx.MockTransport(answer), "http://skip": None})
    with label(task_id="m1", stage="s", agent="a"):
        sync.post("http://127.0.0.1:9/v1/chat/completions", json={"model": "m"})

    async def run() -> None:
        client = hl.labelled_async_http_client(mounts={"all://": httpx.MockTransport(answer)})
        with label(task_id="m2", stage="s", agent="a"):
            await client.post("http://127.0.0.1:9/v1/chat/completions", json={"model": "m"})

    asyncio.run(run())
    assert [(r.headers["x-topas-task-id"], json.loads(r.content)["topas"]["task_id"]) for r in seen] == \
        [("m1", "m1"), ("m2", "m2")]
