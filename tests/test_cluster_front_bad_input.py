"""Bad input at the cluster front (server/cluster/front.py): each case answers a clear 4xx in
the replicas' words, or an honest 5xx when a replica did not answer, never a plain 500, a
false success or a false "not found". Fakes stand in for smg and the replicas (no processes)."""

from __future__ import annotations

import json

import httpx
import pytest
from starlette.testclient import TestClient

from topas_agents.errors import ConfigError
from topas_agents.server.api_errors import ApiError
from topas_agents.server.bodies import parse_json_body
from topas_agents.server.cluster import front as front_mod
from topas_agents.server.cluster.aggregate import (
    ReplicaAnswer,
    pick_owner_answer,
    pick_registration_answer,
    replica_up_metric,
)
from topas_agents.server.cluster.commands import smg_argv
from topas_agents.server.cluster.config import ROUTE_KEY_HEADER, SMG_FLAGS_SET_BY_LAUNCHER, ClusterConfig
from topas_agents.server.cluster.front import build_front
from topas_agents.server.cluster.requests import (
    MAX_CALL_BODY_BYTES,
    done_path,
    route_key,
    route_key_header,
)
from topas_agents.server.cluster.supervisor import Registration
from topas_agents.server.config import ServerConfig

MSG = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _front(handler):
    """A front whose smg and replicas are `handler` (an httpx MockTransport handler)."""
    app = build_front(ClusterConfig(replicas=2))
    app.state.front.client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return app


def _smg(seen: list[httpx.Request]):
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "sim"}]})
        request.read()
        seen.append(request)
        return httpx.Response(200, stream=httpx.ByteStream(b'{"ok": true}'),
                              headers={"date": "Mon, 01 Jan 2024 00:00:00 GMT", "server": "smg"})
    return handler


# ------------------------------------------------------------------ 1. bodies that are not JSON

@pytest.mark.parametrize("raw", [b"[" * 1000 + b"]" * 1000, b'{"max_tokens": ' + b"9" * 5000 + b"}",
                                 b"{not json", b"\xff\xfe"])
def test_a_body_that_is_not_json_is_the_replicas_400(raw):
    with pytest.raises(ApiError) as exc:
        parse_json_body(raw)
    assert exc.value.status == 400 and exc.value.message.startswith("request body is not valid JSON: ")
    seen: list[httpx.Request] = []
    with TestClient(_front(_smg(seen))) as client:
        r = client.post("/v1/chat/completions", content=raw)
    # before: deep nesting and a 5000-digit int were a plain-text 500 from the front
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("request body is not valid JSON")
    assert seen == []  # refused before smg


# ------------------------------------------------------------------ 2. the route key

@pytest.mark.parametrize("bad", ["\ud800", "t1 ", " t1", "t1\n", "t\x01x", "t\x7fx", "t\x85", "t" * 257])
def test_no_route_key_for_text_a_label_cannot_hold(bad):
    assert route_key({"task_id": bad, "agent": "a"}, "task") is None
    assert route_key({"task_id": "t", "agent": bad}, "agent") is None


def test_route_key_header_is_visible_ascii_and_ascii_keys_are_unchanged():
    printable = "".join(chr(c) for c in range(0x20, 0x7F))
    assert route_key_header(printable) == printable.encode("ascii")  # existing deployments route as before
    assert route_key_header("café") == b"caf%C3%A9"
    assert route_key_header("任务\u2028") == b"%E4%BB%BB%E5%8A%A1%E2%80%A8"
    for key in ("café", "x\u00a0y", "\U0001f600", "t\x80"):
        assert all(0x20 <= b <= 0x7E for b in route_key_header(key)), key


def test_a_label_with_a_control_character_reaches_the_replica_without_a_key():
    # before: a surrogate was a 500, a trailing newline a 502, \x01 smg's empty-body 400;
    # now the replica gets the call and answers its 400 naming topas.task_id
    seen: list[httpx.Request] = []
    with TestClient(_front(_smg(seen))) as client:
        for bad in ("\ud800", "t1\n", "t1 ", "t\x01", "t\x7f"):
            body = json.dumps({**MSG, "topas": {"task_id": bad, "stage": "s", "agent": "a"}})
            assert client.post("/v1/chat/completions", content=body).status_code == 200
        good = {**MSG, "topas": {"task_id": "t-1 x", "stage": "s", "agent": "a"}}
        assert client.post("/v1/chat/completions", json=good).status_code == 200
    assert [ROUTE_KEY_HEADER.lower() in r.headers for r in seen] == [False] * 5 + [True]
    assert seen[-1].headers[ROUTE_KEY_HEADER] == "t-1 x"
    assert json.loads(seen[0].content)["topas"]["task_id"] == "\ud800"  # the body as sent, for the replica


# ------------------------------------------------------------------ 3. URLs too long to forward

def _replicas(calls: list[str], status: int = 404, body=None):
    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.raw_path.decode())
        return httpx.Response(status, json=body if body is not None else {"error": {"message": "unknown task"}})
    return handler


def test_an_over_long_task_id_or_calls_value_is_answered_as_a_replica_would():
    # (the audit used 70000 characters; the test client itself refuses URLs past 65536)
    calls: list[str] = []
    with TestClient(_front(_replicas(calls))) as client:
        r = client.post("/v1/topas/tasks/" + "x" * 30000 + "/done")
        assert r.status_code == 404  # before: 500 (httpx.InvalidURL)
        err = r.json()["error"]
        assert err["message"] == f"unknown task '{'x' * 300}'" and err["param"] == "task_id"
        r = client.get("/v1/topas/stats", params={"calls": "9" * 30000})
        assert r.status_code == 400
        assert r.json()["error"] == {"message": "'calls' must be an integer in 0..999999999", "type": "invalid_request_error",
                                     "param": "calls", "code": None}
        # "!" is sent as is and escaped by the front (%21): 90000 characters, past httpx's limit
        r = client.post("/v1/topas/tasks/t1/stages/" + "!" * 30000 + "/done")
        assert r.status_code == 400 and "URL too long" in r.json()["error"]["message"]
    assert calls == []


# ------------------------------------------------------------------ 4. a split registration

def test_a_split_registration_is_a_409_naming_both_sides_and_is_not_recorded(monkeypatch):
    created = ReplicaAnswer("http://r2", 201, {"name": "wfb", "created": True})
    refused = ReplicaAnswer("http://r1", 409, {"error": {"message": "workflow 'wfb' is already registered with "
                                                         "a different definition", "type": "conflict_error",
                                                         "param": None, "code": None}})
    status, body = pick_registration_answer([refused, created])
    assert status == 409
    message = body["error"]["message"]
    assert "split" in message and "accepted by http://r2 (201)" in message and "refused by http://r1 (409)" in message
    assert "different definition" in message and "did not record" in message
    assert body["split"] == {"accepted": ["http://r2"], "refused": ["http://r1"]}
    assert body["error"]["type"] == "conflict_error"
    # every replica refused the same way: their answer as is, no split
    status, body = pick_registration_answer([refused, refused])
    assert status == 409 and "split" not in body and "split" not in body["error"]["message"]

    app = build_front(ClusterConfig(replicas=2))
    answers = {"split": [refused, created], "ok": [created, created]}
    mode = ["split"]

    async def fake_fan_out(request, method, path, content=None):
        return answers[mode[0]]

    monkeypatch.setattr(app.state.front, "fan_out", fake_fan_out)
    with TestClient(app) as client:
        assert client.post("/v1/topas/workflows", content=b"name: wfb").status_code == 409
        assert app.state.front.registrations() == []  # a split is not replayed on restart
        mode[0] = "ok"
        assert client.post("/v1/topas/workflows", content=b"name: wfb").status_code == 201
        assert len(app.state.front.registrations()) == 1
        # the same workflow sent again with other spacing or another (ignored) Authorization: the
        # replicas say "already registered"; the record is one per name, not one per body
        answers["ok"] = [ReplicaAnswer(u, 200, {"name": "wfb", "created": False}) for u in ("http://r1", "http://r2")]
        for i in range(5):
            r = client.post("/v1/topas/workflows", content=b"name:" + b" " * (i + 2) + b"wfb",
                            headers={"Authorization": f"Bearer any-{i}"})
            assert r.status_code == 200
        assert app.state.front.registrations() == [Registration(b"name: wfb", None)]


# ------------------------------------------------------------------ 5. done with a silent owner

def test_done_with_a_silent_replica_is_unknown_not_404():
    missing = ReplicaAnswer("http://r1", 404, {"error": {"message": "unknown task 't'"}})
    silent = ReplicaAnswer("http://r2", None, None, "ReadTimeout: ")
    status, body = pick_owner_answer([missing, silent])
    assert status == 502  # before: 404, though the hung owner later closed the task
    assert "outcome unknown" in body["error"]["message"] and "http://r2" in body["error"]["message"]
    assert "http://r1" not in body["error"]["message"]
    assert pick_owner_answer([missing, missing])[0] == 404  # everyone answered: really unknown
    assert pick_owner_answer([silent, ReplicaAnswer("http://r1", 200, {"task_id": "t"})])[0] == 200
    closed = ReplicaAnswer("http://r1", 409, {"error": {"message": "task closed"}})
    assert pick_owner_answer([closed, silent])[0] == 409  # the owner answered


# ------------------------------------------------------------------ 6. partial fan-out reads

def _fan_out_fake(app, answers):
    async def fake_one(url, method, path, content=None, headers=None, parse=True):
        return answers[url]
    app.state.front.one = fake_one


def test_partial_and_empty_reads_say_so(monkeypatch):
    app = build_front(ClusterConfig(replicas=2))
    u1, u2 = app.state.front.config.replica_urls
    up = {"/metrics": "# TYPE m gauge\nm 1\n", "/v1/topas/workflows": {"workflows": ["chain3"]}}
    answers: dict[str, ReplicaAnswer] = {}

    async def fake_one(url, method, path, content=None, headers=None, parse=True):
        return answers[url] if url in answers else ReplicaAnswer(url, 200, up[path])

    monkeypatch.setattr(app.state.front, "one", fake_one)
    with TestClient(app) as client:
        answers[u2] = ReplicaAnswer(u2, None, None, "ConnectError: refused")
        r = client.get("/metrics")
        assert r.status_code == 200
        assert 'topas_replica_up{replica="1"} 1' in r.text and 'topas_replica_up{replica="2"} 0' in r.text
        assert 'm{replica="1"} 1' in r.text and 'replica="2"} 1' not in r.text
        r = client.get("/v1/topas/workflows")
        assert r.status_code == 200
        assert r.json()["workflows"] == ["chain3"] and r.json()["replicas_up"] == 1
        assert r.json()["replicas_missing"] == [u2]
        answers[u1] = ReplicaAnswer(u1, None, None, "ConnectError: refused")
        for path in ("/metrics", "/v1/topas/workflows", "/v1/topas/stats"):
            r = client.get(path)  # before: 200 with an empty answer
            assert r.status_code == 503, path
            assert "no replica answered" in r.json()["error"]["message"] and len(r.json()["replicas"]) == 2


def test_replica_up_metric():
    text = replica_up_metric(["x 1\n", None])
    assert text.splitlines()[1] == "# TYPE topas_replica_up gauge"
    assert text.splitlines()[2:] == ['topas_replica_up{replica="1"} 1', 'topas_replica_up{replica="2"} 0']


# ------------------------------------------------------------------ 7. dot segments in done paths

def test_done_path_accepts_only_the_two_shapes_and_escapes_dot_segments():
    assert done_path(b"/v1/topas/tasks/repo%2F7/done") == ("/v1/topas/tasks/repo%2F7/done", "repo/7", None)
    assert done_path(b"/v1/topas/tasks/a.b/stages/s%201/done?x=1") == ("/v1/topas/tasks/a.b/stages/s%201/done", "a.b", "s 1")
    assert done_path(b"/v1/topas/tasks/./done")[0] == "/v1/topas/tasks/%2E/done"
    assert done_path(b"/v1/topas/tasks/%2E%2E/stages/../done")[0] == "/v1/topas/tasks/%2E%2E/stages/%2E%2E/done"
    for bad in (b"/v1/topas/tasks/../../chat/completions", b"/v1/topas/tasks/t/finish", b"/v1/topas/tasks//done",
                b"/v1/topas/tasks/t/stages//done", b"/v1/topas/tasks/t/done/x", b"/v1/topas/tasks/t"):
        with pytest.raises(ApiError) as exc:
            done_path(bad)
        assert exc.value.status == 404, bad


def test_a_task_named_dot_dot_reaches_the_replicas_escaped():
    # (a raw `tasks/../../chat/completions` request line is refused by `done_path`, above;
    # httpx, the test client, resolves ".." before sending, so it cannot send one)
    calls: list[str] = []
    with TestClient(_front(_replicas(calls, 200, {"task_id": ".."}))) as client:
        r = client.post("/v1/topas/tasks/%2E%2E/done")
    assert r.status_code == 200 and r.json()["task_id"] == ".."
    assert calls == ["/v1/topas/tasks/%2E%2E/done"] * 2


# ------------------------------------------------------------------ 8. lower: limits and flags

def test_the_front_refuses_bodies_over_the_replicas_limit(monkeypatch):
    assert MAX_CALL_BODY_BYTES == ServerConfig().max_body_bytes == 16 * 2**20
    monkeypatch.setattr(front_mod, "MAX_CALL_BODY_BYTES", 1000)
    seen: list[httpx.Request] = []
    with TestClient(_front(_smg(seen))) as client:
        big = json.dumps({**MSG, "pad": "x" * 2000}).encode()
        r = client.post("/v1/chat/completions", content=big)  # Content-Length says it
        assert r.status_code == 413 and r.json()["error"]["message"] == "request body larger than 1000 bytes"
        r = client.post("/v1/chat/completions", content=iter([big[:600], big[600:]]))  # chunked: no length
        assert r.status_code == 413
        assert client.post("/v1/chat/completions", json=MSG).status_code == 200
    assert len(seen) == 1


def test_relayed_responses_carry_one_date_and_server_header():
    with TestClient(_front(_smg([]))) as client:
        r = client.post("/v1/chat/completions", json=MSG)
    names = [k.lower() for k, _ in r.headers.raw]
    assert r.status_code == 200 and names.count(b"date") <= 1 and names.count(b"server") <= 1
    assert r.headers.get("server") != "smg"


def test_the_timeline_is_a_clear_501():
    with TestClient(build_front(ClusterConfig(replicas=2, port=18650))) as client:
        r = client.get("/v1/topas/timeline")
    assert r.status_code == 501
    err = r.json()["error"]
    assert err["code"] == "not_implemented" and "http://127.0.0.1:18651" in err["message"]


@pytest.mark.parametrize("arg", ["--port=18599", "--port", "--host=0.0.0.0", "--worker-urls", "--policy=random",
                                 "--prometheus-port=9", "--routing-key-headers=X", "--por=1"])
def test_smg_args_that_the_launcher_sets_are_refused(arg):
    with pytest.raises(ConfigError, match="which the launcher sets"):
        ClusterConfig(extra_smg_args=(arg,))


def test_refused_smg_flags_are_the_launchers_and_tunables_still_pass(monkeypatch):
    monkeypatch.delenv("TOPAS_API_KEY", raising=False)
    argv = smg_argv(ClusterConfig(router_policy="task", api_key="k"))  # with a key
    # --api-key: added in smg's process from its environment (not on a command line)
    assert all(flag in argv for flag in SMG_FLAGS_SET_BY_LAUNCHER if flag != "--api-key")
    assert "--api-key" in argv[argv.index("-c") + 1]
    ok = ClusterConfig(extra_smg_args=("--log-level=info", "--retry-max-retries", "5", "-v"))
    assert smg_argv(ok)[-4:] == ("--log-level=info", "--retry-max-retries", "5", "-v")


@pytest.mark.parametrize("ids", [("", ""), ("0", " ")])
def test_empty_gpu_ids_are_refused(ids):
    with pytest.raises(ConfigError, match="empty"):
        ClusterConfig(replicas=2, engine="sglang", gpu_ids=ids)
