"""Pure parts of the cluster: config, command lines, label lifting, stats merging and
stream resumption (no processes)."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionChunk
from openai.types.completion import Completion
from openai.types.completion_choice import CompletionChoice

from topas_agents.cluster.stream_retry import AsyncResumingStream, ResumingStream, StreamCutError, transient
from topas_agents.errors import ConfigError
from topas_agents.server.cluster.aggregate import (
    ReplicaAnswer,
    aggregate_stats,
    client_error,
    merge_metrics,
    pick_owner_answer,
    pick_registration_answer,
)
from topas_agents.server.cluster.commands import replica_argv, replica_env, smg_argv
from topas_agents.server.cluster.config import ROUTE_KEY_HEADER, ClusterConfig
from topas_agents.server.cluster.requests import lift_label, route_key, route_key_header


def test_port_layout_and_validation():
    c = ClusterConfig(replicas=3, port=9000)
    assert c.replica_urls == ("http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003")
    assert (c.smg_port, c.smg_metrics_port, c.front_url) == (9004, 9005, "http://127.0.0.1:9000")
    for bad in ({"replicas": 0}, {"router_policy": "lpm"}, {"port": 65534}, {"gpu_ids": ("0",), "replicas": 2}):
        with pytest.raises(ConfigError):
            ClusterConfig(**bad)


def test_command_lines():
    c = ClusterConfig(replicas=2, port=9000, serve_args=("--workflow", "chain3"))
    argv = replica_argv(c, 2)
    assert argv[1:3] == ("-m", "topas_agents.server") and argv[argv.index("--port") + 1] == "9002"
    assert argv[-2:] == ("--workflow", "chain3") and replica_env(c, 2) == {}
    g = smg_argv(c)
    assert g[g.index("--policy") + 1] == "manual" and g[g.index("--routing-key-headers") + 1] == ROUTE_KEY_HEADER
    assert g[g.index("--host") + 1] == "127.0.0.1" and g[g.index("--prometheus-host") + 1] == "127.0.0.1"
    assert "--routing-key-headers" not in smg_argv(ClusterConfig(router_policy="cache_aware"))
    sg = ClusterConfig(replicas=2, engine="sglang", engine_args=("--mem-fraction-static", "0.8"))
    assert replica_env(sg, 2) == {"CUDA_VISIBLE_DEVICES": "1"}
    assert replica_argv(sg, 1)[-3:] == ("--", "--mem-fraction-static", "0.8")


def test_each_replica_gets_its_own_decision_log():
    c = ClusterConfig(replicas=2, engine="sglang", serve_args=("--decision-log", "run/d.jsonl", "--policy", "topas"))
    for i in (1, 2):
        argv = replica_argv(c, i)
        assert argv[argv.index("--decision-log") + 1] == f"run/d.replica-{i}.jsonl"
        assert argv[-2:] == ("--policy", "topas")
    one = replica_argv(ClusterConfig(replicas=1, serve_args=("--decision-log", "run/d.jsonl")), 1)
    assert one[-1] == "run/d.jsonl"  # a single server keeps the name it was given


def test_front_says_what_sglang_replicas_lack():
    from starlette.testclient import TestClient

    from topas_agents.server.cluster.front import build_front

    with TestClient(build_front(ClusterConfig(replicas=2, engine="sglang"))) as client:
        for method, path in (("GET", "/v1/topas/stats"), ("GET", "/v1/topas/workflows"),
                             ("POST", "/v1/topas/workflows"), ("POST", "/v1/topas/tasks/t1/done"),
                             ("POST", "/v1/topas/tasks/t1/stages/s1/done")):
            r = client.request(method, path, content=b"name: x")
            assert r.status_code == 501, (path, r.text)
            err = r.json()["error"]
            assert err["code"] == "not_implemented" and "decision log" in err["message"]
        layout = client.get("/v1/topas/cluster").json()  # answered by the front itself
        assert layout["engine"] == "sglang" and len(layout["replicas"]) == 2


def test_label_lifting_and_route_key():
    body = {"messages": []}
    lab = lift_label(body, {"x-topas-task-id": "t1", "X-Topas-Stage": "s", "X-Topas-Agent": "a"})
    assert body["topas"] == lab == {"task_id": "t1", "stage": "s", "agent": "a"}
    body2 = {"topas": {"task_id": "b"}}
    assert lift_label(body2, {"X-Topas-Task-Id": "h"}) == {"task_id": "b"}  # the body wins whole
    assert lift_label({}, {}) is None
    # ASGI reads header bytes as Latin-1; httpx sent UTF-8: the body gets the id the client meant
    as_read = "café".encode().decode("latin-1")
    assert lift_label({}, {"X-Topas-Task-Id": as_read}) == {"task_id": "café"}
    assert route_key({"task_id": "t", "agent": "a"}, "task") == "t"
    assert route_key({"task_id": "t", "agent": "a"}, "agent") == "a"
    assert route_key({"task_id": "t"}, "cache_aware") is None
    assert route_key("garbage", "task") is None


def _stats(tasks, ok=3, now=10.0):
    return {"now_s": now, "queues": {"waiting": 1, "running": 2}, "kv": {"used": 5, "budget": 10},
            "requests": {"in_flight": 1, "calls_by_status": {"ok": ok}},
            "jct": {}, "tasks": {"active": 0, "items": tasks}}


def test_aggregate_merges_split_tasks():
    a = _stats([{"task_id": "x", "arrival_s": 1.0, "finish_s": 2.0, "done": True, "stages": {"s1": {"calls": 1}}},
                {"task_id": "y", "arrival_s": 0.0, "finish_s": 4.0, "done": True, "stages": {}}])
    b = _stats([{"task_id": "x", "arrival_s": 1.5, "finish_s": 5.0, "done": True, "stages": {"s2": {"calls": 1}}}],
               now=11.0)
    view = aggregate_stats([ReplicaAnswer("u1", 200, a), ReplicaAnswer("u2", 200, b),
                            ReplicaAnswer("u3", None, None, "refused")])
    c = view["cluster"]
    assert c["replicas_up"] == 2 and c["calls_by_status"] == {"ok": 6} and c["queues"]["running"] == 4
    assert c["tasks"] == {"seen": 2, "done": 2, "failed": 0, "abandoned": 0, "split": 1, "split_ids": ["x"]}
    # replica 1's clock reads 1 s behind replica 2's at the same instant: its times move by
    # +1 s, so x runs from 1.5 (replica 2) to 5.0 (replica 2; replica 1's part ends at 3.0)
    assert c["jct"]["count"] == 2 and c["jct"]["mean_s"] == pytest.approx((3.5 + 4.0) / 2)
    assert c["clock_skew_s"] == pytest.approx(1.0)
    assert view["replicas"][2]["status"] is None
    # the per-task items, in a replica's shape: a split task runs from its first arrival to its
    # last finish and sums its stages; a task of one replica keeps that replica's fields
    items = {t["task_id"]: t for t in view["tasks"]["items"]}
    assert items["x"]["replicas"] == [1, 2] and items["x"]["jct_s"] == pytest.approx(3.5)
    assert items["x"]["stages"] == {"s1": {"calls": 1}, "s2": {"calls": 1}}
    assert items["y"]["replicas"] == [1] and items["y"]["jct_s"] == pytest.approx(4.0)


def test_a_restarted_replicas_clock_is_moved_onto_the_others():
    """A restarted replica's clock starts again at 0: merged on the raw clocks, a task re-homed
    to it ran from its early arrival there to its late finish elsewhere (849 s for a 2 s task)."""
    old = _stats([{"task_id": "x", "arrival_s": 790.0, "finish_s": 795.0, "done": True, "stages": {}},
                  {"task_id": "y", "arrival_s": 100.0, "finish_s": 160.0, "done": True, "stages": {}}], now=800.0)
    restarted = _stats([{"task_id": "x", "arrival_s": 2.0, "finish_s": 8.0, "done": True, "stages": {}}], now=10.0)
    view = aggregate_stats([ReplicaAnswer("u1", 200, old), ReplicaAnswer("u2", 200, restarted)])
    items = {t["task_id"]: t for t in view["tasks"]["items"]}
    # x: 790 -> 795 on replica 1, then 792 -> 798 on the common clock (2 + 790, 8 + 790)
    assert items["x"]["jct_s"] == pytest.approx(8.0) and items["x"]["arrival_s"] == pytest.approx(790.0)
    assert items["y"]["jct_s"] == pytest.approx(60.0)
    assert view["cluster"]["jct"]["mean_s"] == pytest.approx(34.0)


def test_aggregate_reads_the_replicas_as_one_server():
    server = {"engine": "sim", "policy": "topas", "profile": "p", "time_scale": 50.0, "responder": "echo",
              "model": "m", "status": "ok"}
    a = {**_stats([{"task_id": "x", "arrival_s": 0.0, "finish_s": None, "done": False, "in_flight": 1,
                    "done_reason": None, "stages": {"s1": {"calls": 2, "done": False}}}]),
         "server": server, "calls": [{"task_id": "x", "stage": "s1"}]}
    b = {**_stats([{"task_id": "x", "arrival_s": 1.0, "finish_s": 3.0, "done": True, "in_flight": 0,
                    "done_reason": "explicit", "stages": {"s1": {"calls": 1, "done": True}}}]),
         "server": {**server, "policy": "lpm"}, "calls": [{"task_id": "x", "stage": "s1"}]}
    view = aggregate_stats([ReplicaAnswer("u1", 200, a), ReplicaAnswer("u2", 200, b)])
    # fields the replicas disagree on are None: one replica's value would misreport the other
    assert view["server"] == {**{k: v for k, v in server.items() if k != "status"}, "policy": None}
    [x] = view["tasks"]["items"]
    assert (x["done"], x["done_reason"], x["jct_s"], x["in_flight"]) == (False, None, None, 1)
    a["tasks"]["items"][0].update(done=True, done_reason="idle", finish_s=2.0)  # both parts done: one JCT
    [x] = aggregate_stats([ReplicaAnswer("u1", 200, a), ReplicaAnswer("u2", 200, b)])["tasks"]["items"]
    assert x["done"] and x["done_reason"] == "idle" and x["jct_s"] == pytest.approx(3.0)
    assert x["stages"] == {"s1": {"calls": 3, "done": True}}
    assert len(view["calls"]) == 2
    # a part that failed fails the split task: no JCT, counted as failed and not as done
    b["tasks"]["items"][0]["done_reason"] = "failed"
    view = aggregate_stats([ReplicaAnswer("u1", 200, a), ReplicaAnswer("u2", 200, b)])
    [x] = view["tasks"]["items"]
    assert (x["done_reason"], x["jct_s"]) == ("failed", None)
    counts = view["cluster"]["tasks"]
    assert (counts["seen"], counts["done"], counts["failed"], counts["abandoned"]) == (1, 0, 1, 0)
    assert view["cluster"]["jct"]["count"] == 0


def test_fan_out_answers():
    ok = ReplicaAnswer("u1", 200, {"task_id": "t"})
    missing = ReplicaAnswer("u2", 404, {"error": {}})
    assert pick_owner_answer([missing, ok])[0] == 200
    assert pick_owner_answer([missing, missing])[0] == 404
    assert pick_owner_answer([ReplicaAnswer("u", None, None, "down")])[0] == 502
    assert pick_registration_answer([ReplicaAnswer("u", 201, {}), ReplicaAnswer("v", 200, {})])[0] == 201
    assert pick_registration_answer([ReplicaAnswer("u", 200, {}), ReplicaAnswer("v", 409, {})])[0] == 409


def test_client_error_only_when_every_answer_refused_the_request():
    bad = ReplicaAnswer("u1", 400, {"error": {"message": "calls must be >= 0"}})
    status, body = client_error([bad, ReplicaAnswer("u2", 400, {"error": {}})])
    assert status == 400 and body["error"]["message"] == "calls must be >= 0" and len(body["replicas"]) == 2
    assert client_error([bad, ReplicaAnswer("u2", 200, {})]) is None  # one replica served it
    assert client_error([bad, ReplicaAnswer("u2", 503, {})]) is None  # not the request's fault alone
    assert client_error([ReplicaAnswer("u", None, None, "down")]) is None  # nobody answered
    assert client_error([bad, ReplicaAnswer("u2", None, None, "down")])[0] == 400


def test_front_passes_a_refused_read_through_and_answers_unknown_routes_as_json(monkeypatch):
    from starlette.testclient import TestClient

    from topas_agents.server.cluster.front import build_front

    app = build_front(ClusterConfig(replicas=2))
    paths = []

    async def refuse(url, method, path, content=None, headers=None, parse=True):
        paths.append(path)
        return ReplicaAnswer(url, 400, {"error": {"message": "bad calls", "type": "invalid_request_error"}})

    monkeypatch.setattr(app.state.front, "one", refuse)
    with TestClient(app) as client:
        # before: 200 with replicas_up 0, an empty view that read as "every replica down"
        r = client.get("/v1/topas/stats", params={"calls": "-1&full=1"})
        assert r.status_code == 400 and r.json()["error"]["message"] == "bad calls"
        assert paths[-1] == "/v1/topas/stats?calls=-1%26full%3D1"  # the value stays one value
        for path in ("/metrics", "/v1/topas/workflows"):
            assert client.get(path).status_code == 400, path
        r = client.get("/no/such/route")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        r = client.delete("/v1/topas/workflows")
        assert r.status_code == 405 and "error" in r.json() and "GET" in r.headers["allow"]


def test_front_relays_non_ascii_labels_and_headers():
    # before: a task id "café" (body or X-Topas-* header) or any non-ASCII header was a 500:
    # the front re-encoded header text as ASCII
    import httpx
    from starlette.testclient import TestClient

    from topas_agents.server.cluster.front import build_front

    seen: list[tuple[httpx.Request, bytes]] = []

    def smg(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "sim"}]})
        seen.append((request, request.read()))
        return httpx.Response(200, stream=httpx.ByteStream(b'{"ok": true}'))  # the front streams it

    app = build_front(ClusterConfig(replicas=2))
    app.state.front.client = httpx.AsyncClient(transport=httpx.MockTransport(smg))
    msg = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", json={**msg, "topas": {"task_id": "café", "stage": "s", "agent": "a"}})
        assert r.status_code == 200
        r = client.post("/v1/chat/completions", json=msg, headers=[
            ("X-Topas-Task-Id", "naïve".encode()), ("X-Topas-Stage", "s"), ("X-Topas-Agent", "a"),
            ("X-Note", "ü".encode())])
        assert r.status_code == 200
    (body_call, _), (header_call, header_body) = seen
    assert body_call.headers[ROUTE_KEY_HEADER] == route_key_header("café").decode() == "caf%C3%A9"
    assert header_call.headers[ROUTE_KEY_HEADER] == "na%C3%AFve"
    assert dict(header_call.headers.raw)[b"x-note"] == "ü".encode()  # passed through as sent
    assert json.loads(header_body)["topas"]["task_id"] == "naïve"  # lifted into the body
    assert route_key_header("t-1 x") == b"t-1 x"  # ASCII keys as they are


def test_front_refuses_a_label_header_given_twice_with_two_values():
    import httpx
    from starlette.testclient import TestClient

    from topas_agents.server.cluster.front import build_front

    app = build_front(ClusterConfig(replicas=2))
    app.state.front.client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(500)))
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                        headers=[("X-Topas-Task-Id", "t1"), ("X-Topas-Task-Id", "t2"), ("X-Topas-Stage", "s"),
                                 ("X-Topas-Agent", "a")])
    assert r.status_code == 400 and r.json()["error"]["param"] == "topas.task_id"


def test_front_fans_out_a_non_ascii_authorization_as_sent():
    # before: a 500 (httpx encoded the header text as ASCII); now the replicas' 401
    import httpx
    from starlette.testclient import TestClient

    from topas_agents.server.cluster.front import build_front

    sent: list[bytes] = []

    def replica(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.raw[[k.lower() for k, _ in request.headers.raw].index(b"authorization")][1])
        return httpx.Response(401, json={"error": {"message": "invalid API key", "type": "invalid_request_error"}})

    app = build_front(ClusterConfig(replicas=2))
    app.state.front.client = httpx.AsyncClient(transport=httpx.MockTransport(replica))
    with TestClient(app) as client:
        r = client.get("/v1/topas/stats", headers=[("Authorization", "Bearer ü".encode())])
    assert r.status_code == 401 and r.json()["error"]["message"] == "invalid API key"
    assert sent == ["Bearer ü".encode()] * 2


def test_front_forwards_a_done_call_on_its_raw_path():
    # a task id holding "/" reaches the replicas still escaped, so they split it exactly
    import httpx
    from starlette.testclient import TestClient

    from topas_agents.server.cluster.front import build_front

    paths: list[bytes] = []

    def replica(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.raw_path)
        return httpx.Response(200, json={"task_id": "repo/7"})

    app = build_front(ClusterConfig(replicas=2))
    app.state.front.client = httpx.AsyncClient(transport=httpx.MockTransport(replica))
    with TestClient(app) as client:
        assert client.post("/v1/topas/tasks/repo%2F7/stages/s%2F1/done").status_code == 200
        assert client.post("/v1/topas/tasks/repo%2F7/done").status_code == 200
        # a failed task's outcome reaches the owner (the front dropped the query: a JCT)
        assert client.post("/v1/topas/tasks/repo%2F7/done?outcome=failed").status_code == 200
        r = client.post("/v1/topas/tasks/repo%2F7/done?outcome=maybe")
        assert r.status_code == 400 and r.json()["error"]["param"] == "outcome"
    assert paths == [b"/v1/topas/tasks/repo%2F7/stages/s%2F1/done"] * 2 + [b"/v1/topas/tasks/repo%2F7/done"] * 2 + \
        [b"/v1/topas/tasks/repo%2F7/done?outcome=failed"] * 2


def test_merge_metrics_groups_families():
    text = "# HELP m_total help\n# TYPE m_total counter\nm_total{a=\"1\"} 3\n# TYPE g gauge\ng 2\n"
    merged = merge_metrics([text, text])
    lines = merged.splitlines()
    assert lines.count("# TYPE m_total counter") == 1
    i = lines.index("# TYPE m_total counter")
    # written by prometheus_client: labels in name order, values as Go floats
    assert lines[i + 1:i + 3] == ['m_total{a="1",replica="1"} 3.0', 'm_total{a="1",replica="2"} 3.0']
    assert lines[-2:] == ['g{replica="1"} 2.0', 'g{replica="2"} 2.0']


# ---------------------------------------------------------------------- stream resumption

def _chunks(deltas: list[dict], cut: int | None, finish: str) -> list[ChatCompletionChunk]:
    """Chat chunks of `deltas`, cut after delta `cut` (no finish), else ended by `finish`."""
    out = []
    for n, delta in enumerate(deltas):
        out.append(ChatCompletionChunk.model_validate({
            "id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}))
        if cut is not None and n == cut:
            return out
    out.append(ChatCompletionChunk.model_validate({
        "id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
    return out


def _chat_chunks(text: str, cut: int | None, pieces: int = 3) -> list[ChatCompletionChunk]:
    step = max(1, len(text) // pieces)
    parts = [text[i:i + step] for i in range(0, len(text), step)]
    return _chunks([{"role": "assistant", "content": ""}, *({"content": p} for p in parts)], cut, "stop")


class _FakeStream:
    def __init__(self, chunks, error: BaseException | None = None) -> None:
        self.chunks = chunks
        self.error = error
        self.closed = False

    def __iter__(self):
        yield from self.chunks
        if self.error is not None:
            raise self.error

    async def __aiter__(self):
        for c in self.chunks:
            yield c
        if self.error is not None:
            raise self.error

    def close(self):
        self.closed = True


@given(text=st.text(min_size=1, max_size=40), cut=st.integers(0, 4), pieces=st.integers(1, 6))
def test_resumed_stream_delivers_each_character_once(text, cut, pieces):
    first_chunks = _chat_chunks(text, cut, pieces)
    was_cut = all(c.choices[0].finish_reason is None for c in first_chunks)
    first = _FakeStream(first_chunks)
    stream = ResumingStream(first, lambda: _FakeStream(_chat_chunks(text, None, pieces + 1)))
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert stream.resumed == int(was_cut)


def _tool_chunks(args: str, cut: int | None, pieces: int) -> list[ChatCompletionChunk]:
    """A streamed tool call: the role, the call's id and name, its arguments in pieces."""
    step = max(1, len(args) // pieces)
    deltas = [{"role": "assistant", "content": None},
              {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": "get_weather", "arguments": ""}}]},
              *({"tool_calls": [{"index": 0, "function": {"arguments": args[i:i + step]}}]}
                for i in range(0, len(args), step))]
    return _chunks(deltas, cut, "tool_calls")


@given(cut=st.integers(0, 6), pieces=st.integers(1, 5), again=st.integers(1, 6))
def test_a_resumed_tool_call_stream_delivers_the_call_whole_and_once(cut, pieces, again):
    """Only text was tracked on a replay: a cut tool call reached the caller with its arguments
    cut mid-JSON ('{"city": "Pa'), or not at all under finish_reason "tool_calls"."""
    args = '{"city": "Paris", "unit": "celsius"}'
    stream = ResumingStream(_FakeStream(_tool_chunks(args, cut, pieces)),
                            lambda: _FakeStream(_tool_chunks(args, None, again)))
    ids, names, got = [], [], ""
    for chunk in stream:
        for call in chunk.choices[0].delta.tool_calls or ():
            ids += [call.id] if call.id else []
            names += [call.function.name] if call.function.name else []
            got += call.function.arguments or ""
    assert (ids, names, got) == (["call_1"], ["get_weather"], args)
    assert json.loads(got) == {"city": "Paris", "unit": "celsius"}


def test_resume_once_then_give_up():
    import httpx

    broken = httpx.RemoteProtocolError("peer closed")
    stream = ResumingStream(_FakeStream(_chat_chunks("abcdef", 1), broken),
                            lambda: _FakeStream(_chat_chunks("abcdef", 2), broken))
    with pytest.raises(httpx.RemoteProtocolError):
        list(stream)
    assert stream.resumed == 1
    assert transient(broken) and not transient(ValueError())


def test_a_stream_cut_again_after_its_reissue_raises():
    # before: a clean end without finish_reason after the one re-issue ended the iteration,
    # handing the caller partial text as a success
    stream = ResumingStream(_FakeStream(_chat_chunks("abcdef", 1)), lambda: _FakeStream(_chat_chunks("abcdef", 2)))
    with pytest.raises(StreamCutError, match="without a finish_reason"):
        list(stream)
    assert stream.resumed == 1

    async def reopen():
        return _FakeStream(_chat_chunks("abcdef", 2))

    async def run():
        return [c async for c in AsyncResumingStream(_FakeStream(_chat_chunks("abcdef", 1)), reopen)]

    with pytest.raises(StreamCutError):
        asyncio.run(run())


def test_completion_stream_resumes_and_async_too():
    def comp(texts, finish):
        # as openai builds stream chunks: constructed, not validated (finish_reason None mid-stream)
        return [Completion.model_construct(id="c", object="text_completion", created=0, model="m", choices=[
            CompletionChoice.model_construct(index=0, text=t, logprobs=None,
                                             finish_reason=finish if k == len(texts) - 1 else None)])
                for k, t in enumerate(texts)]

    s = ResumingStream(_FakeStream(comp(["ab", "c"], None)), lambda: _FakeStream(comp(["a", "bcd", "e"], "stop")))
    assert "".join(c.choices[0].text for c in s) == "abcde"

    async def reopen():
        return _FakeStream(_chat_chunks("hello world", None))

    async def run():
        a = AsyncResumingStream(_FakeStream(_chat_chunks("hello world", 2)), reopen)
        return "".join([c.choices[0].delta.content or "" async for c in a]), a.resumed

    assert asyncio.run(run()) == ("hello world", 1)


def test_a_responses_label_moves_into_metadata_which_smg_forwards():
    from topas_agents.labels import label_from_metadata
    from topas_agents.server.cluster.requests import label_into_metadata

    lab = {"task_id": "t", "stage": "s1", "agent": "a", "workflow": "chain3", "prefix_tokens": 12}
    body = {"input": "x", "topas": dict(lab), "metadata": {"mine": "kept"}}
    label_into_metadata(body)
    assert "topas" not in body and body["metadata"]["mine"] == "kept"
    assert all(isinstance(v, str) for v in body["metadata"].values())  # Responses metadata: strings
    assert label_from_metadata(body["metadata"]).to_body() == lab
    for odd in ({"input": "x", "topas": "t1"}, {"input": "x", "topas": lab, "metadata": ["no"]}):
        before = {k: v for k, v in odd.items()}
        label_into_metadata(odd)  # left for the replica to refuse, with its own 400
        assert odd == before


def _response_events(text: str, cut: int | None, pieces: int, tool: bool = False) -> list:
    """A Responses API event stream for one message (or function call) of `text`, in
    `pieces` deltas; cut after `cut` events (None: whole)."""
    from types import SimpleNamespace as E

    size = max(1, -(-len(text) // pieces))
    parts = [text[i:i + size] for i in range(0, len(text), size)]
    delta = "response.function_call_arguments.delta" if tool else "response.output_text.delta"
    where = {"output_index": 0} if tool else {"output_index": 0, "content_index": 0}
    events = [E(type="response.created"), E(type="response.in_progress"),
              E(type="response.output_item.added", output_index=0)]
    if not tool:
        events.append(E(type="response.content_part.added", **where))
    events += [E(type=delta, delta=p, **where) for p in parts]
    events += [E(type="response.output_item.done", output_index=0), E(type="response.completed")]
    return events[:cut] if cut is not None else events


@given(text=st.text(min_size=1, max_size=40), cut=st.integers(0, 9), pieces=st.integers(1, 6), tool=st.booleans())
def test_a_cut_responses_stream_resumes_with_each_character_and_event_once(text, cut, pieces, tool):
    from topas_agents.cluster.stream_retry import ResponsesProgress

    first = _response_events(text, cut, pieces, tool)
    was_cut = first[-1].type != "response.completed" if first else True
    stream = ResumingStream(_FakeStream(first), lambda: _FakeStream(_response_events(text, None, pieces + 1, tool)),
                            progress=ResponsesProgress)
    events = list(stream)
    kinds = [e.type for e in events]
    assert "".join(e.delta for e in events if e.type.endswith(".delta")) == text
    for once in ("response.created", "response.in_progress", "response.output_item.added", "response.completed"):
        assert kinds.count(once) == 1, kinds
    assert kinds[-1] == "response.completed" and stream.resumed == int(was_cut)


async def test_a_responses_stream_cut_twice_raises():
    from topas_agents.cluster.stream_retry import ResponsesProgress

    async def reopen():
        return _FakeStream(_response_events("abcdef", 5, 2))

    stream = AsyncResumingStream(_FakeStream(_response_events("abcdef", 5, 2)), reopen, progress=ResponsesProgress)
    with pytest.raises(StreamCutError, match="final response event"):
        [e async for e in stream]


def test_a_label_that_would_pass_smgs_metadata_limit_is_a_clear_400() -> None:
    # smg answered "The object has 17 properties, but the maximum is 16": the caller sent 14
    from topas_agents.server.api_errors import ApiError
    from topas_agents.server.cluster.requests import SMG_METADATA_ENTRIES, label_into_metadata

    own = {f"k{i}": "v" for i in range(14)}
    body = {"metadata": dict(own), "topas": {"task_id": "t", "stage": "s", "agent": "a"}}
    with pytest.raises(ApiError, match="holds 14 entries and the topas label travels in 3 more.*at most 13") as exc:
        label_into_metadata(body)
    assert exc.value.status == 400 and body["metadata"] == own  # unchanged
    fits = {"metadata": {f"k{i}": "v" for i in range(13)}, "topas": {"task_id": "t", "stage": "s", "agent": "a"}}
    label_into_metadata(fits)
    assert len(fits["metadata"]) == SMG_METADATA_ENTRIES


def test_replica_restarts_are_a_counter_per_replica() -> None:
    from topas_agents.server.cluster.aggregate import replica_restarts_metric

    text = replica_restarts_metric([2, 2, 3], replicas=3)
    assert "# TYPE topas_replica_restarts_total counter" in text
    assert [line.split()[-1] for line in text.splitlines() if not line.startswith("#")] == ["0", "2", "1"]


def test_front_rewrites_a_big_body_off_the_event_loop(monkeypatch):
    # a 16 MiB body took about 0.25 s to parse and re-encode, on the loop every relay shares
    import threading

    import httpx
    from starlette.testclient import TestClient

    from topas_agents.server.cluster import front as front_module
    from topas_agents.server.cluster.front import build_front
    from topas_agents.server.cluster.requests import OFFLOAD_BYTES

    seen: list[bytes] = []

    def smg(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "sim"}]})
        seen.append(request.read())
        return httpx.Response(200, stream=httpx.ByteStream(b'{"ok": true}'))

    app = build_front(ClusterConfig(replicas=2))
    front = app.state.front
    front.client = httpx.AsyncClient(transport=httpx.MockTransport(smg))
    threads: list[str] = []
    rewrite = front_module.rewrite_call  # relay.py's, as the front calls it

    def recording(*args):
        threads.append(threading.current_thread().name)
        return rewrite(*args)

    monkeypatch.setattr(front_module, "rewrite_call", recording)
    big = "x" * (OFFLOAD_BYTES + 1)
    with TestClient(app) as client:
        for content in ("small", big):
            r = client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": content}]},
                            headers={"X-Topas-Task-Id": "t1", "X-Topas-Stage": "s", "X-Topas-Agent": "a"})
            assert r.status_code == 200
    loop_thread, worker = threads
    assert worker != loop_thread  # the big one in a worker thread, the small one where the loop runs
    for raw, content in zip(seen, ("small", big), strict=True):
        body = json.loads(raw)
        assert body["model"] == "sim" and body["topas"]["task_id"] == "t1"
        assert body["messages"][0]["content"] == content


def test_a_relay_whose_client_left_before_the_body_closes_the_upstream_response():
    # the stream task was cancelled before the body generator started, so its cleanup never ran:
    # the pooled connection to smg stayed taken and the replica's call ran on
    import asyncio
    import contextlib

    from starlette.requests import ClientDisconnect

    from topas_agents.server.cluster.relay import RelayResponse

    class Upstream:
        closed = False

        async def aclose(self) -> None:
            self.closed = True

    async def body():
        yield b"never sent"

    async def receive():
        return {"type": "http.disconnect"}

    async def send_raising(message):
        raise OSError("client gone")  # ASGI 2.4: a send after the client disconnected

    async def send_stuck(message):
        await asyncio.sleep(5)  # ASGI 2.3 (uvicorn's): Starlette's disconnect listener cancels this

    async def relay(spec: str) -> None:
        send = send_raising if spec == "2.4" else send_stuck
        with contextlib.suppress(ClientDisconnect):
            await response({"type": "http", "asgi": {"spec_version": spec}}, receive, send)

    for spec in ("2.4", "2.3"):  # 2.3: Starlette's disconnect listener cancels the stream task
        upstream = Upstream()
        response = RelayResponse(body(), upstream, status_code=200)
        asyncio.run(asyncio.wait_for(relay(spec), 10))
        assert upstream.closed, spec


def test_a_call_that_finds_smg_without_workers_waits_for_them():
    # a restarted smg listens before it has registered its workers and answers 404
    # model_not_found: calls arriving then got it (and the client wrapper does not retry a 404)
    import httpx
    from starlette.testclient import TestClient

    from topas_agents.server.cluster.front import build_front

    answers = [404, 404, 200]
    seen: list[int] = []

    def smg(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "sim"}]})
        status = answers.pop(0) if answers else 404
        seen.append(status)
        if status == 404:
            return httpx.Response(404, json={"error": {"code": "model_not_found", "message": "No worker available"}})
        return httpx.Response(200, stream=httpx.ByteStream(b'{"ok": true}'))

    app = build_front(ClusterConfig(replicas=2))
    app.state.front.client = httpx.AsyncClient(transport=httpx.MockTransport(smg))
    msg = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", json=msg)
        assert r.status_code == 200 and r.json() == {"ok": True} and seen == [404, 404, 200]
        # another 404 is relayed at once, body and all
        answers[:] = []
        app.state.front.client = httpx.AsyncClient(transport=httpx.MockTransport(
            lambda req: httpx.Response(200, json={"data": [{"id": "sim"}]}) if req.url.path == "/v1/models"
            else httpx.Response(404, json={"error": {"code": "not_found", "message": "no such route"}})))
        r = client.post("/v1/chat/completions", json=msg)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_no_call_waits_for_a_gateway_the_supervisor_gave_up_on():
    from topas_agents.server.cluster.front import Front
    from topas_agents.server.cluster.supervisor import GATEWAY, RestartEvent

    front = Front(ClusterConfig(replicas=2))
    assert front._gateway_wait_s() == 15.0
    front.restart_events = [RestartEvent(GATEWAY, None, 3, "gave_up", -9, 1, None, 0, "left down", 0.0)]
    assert front._gateway_wait_s() == 0.0  # every call waited 15 s for a 502
