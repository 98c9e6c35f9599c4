"""Issue 11 regressions: limits, linear workflow loading off the event loop, no 500 for any
input, and the OpenAI error shape everywhere (against a real uvicorn in a thread)."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest
import yaml

from topas_agents.server import ServerConfig, start_server_in_thread
from topas_agents.workflow import DEFAULT_LIMITS

LABEL = {"task_id": "t", "stage": "s1", "agent": "a", "workflow": "chain3"}
MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def srv():
    cfg = ServerConfig(time_scale=1000.0, workflows=("chain3",), max_body_bytes=2**20, max_workflow_bytes=2**21)
    handle = start_server_in_thread(cfg)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(base_url=srv.base_url, timeout=30) as client:
        yield client


def _openai_error(rsp: httpx.Response, status: int) -> dict:
    assert rsp.status_code == status, rsp.text[:300]
    err = rsp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str)
    return err


def _healthy(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    assert http.get("/v1/topas/stats").status_code == 200
    ok = http.post("/v1/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 4})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]


def _chain(n: int, name: str = "chain") -> dict:
    return {"name": name, "agents": [{"name": "a", "prefix_tokens": 10}],
            "stages": [{"name": f"s{i}", "agent": "a", "after": [f"s{i - 1}"] if i else [], "input_tokens": 1,
                        "output_tokens": 1} for i in range(n)]}


def _fan(n: int, name: str = "fan") -> dict:
    leaves = [{"name": f"w{i}", "agent": "a", "after": ["root"], "input_tokens": 1, "output_tokens": 1}
              for i in range(n - 2)]
    sink = {"name": "sink", "agent": "a", "after": [f"w{i}" for i in range(n - 2)], "input_tokens": 1,
            "output_tokens": 1}
    return {"name": name, "agents": [{"name": "a", "prefix_tokens": 10}],
            "stages": [{"name": "root", "agent": "a", "input_tokens": 1, "output_tokens": 1}, *leaves, sink]}


# ---------------------------------------------------------------- 1: big workflows, limits


@pytest.mark.parametrize("build", [_chain, _fan])
def test_a_10k_stage_workflow_loads_in_a_worker_thread(srv, http, monkeypatch, build):
    import topas_agents.server.app as app_module

    threads = []
    real = app_module.parse_upload

    def spy(text: str):
        threads.append(threading.current_thread())
        return real(text)

    monkeypatch.setattr(app_module, "parse_upload", spy)
    doc = build(DEFAULT_LIMITS.max_stages, name=f"big-{build.__name__}")
    rsp = http.post("/v1/topas/workflows", content=json.dumps(doc))
    assert rsp.status_code == 201, rsp.text[:300]
    assert len(rsp.json()["stages"]) == DEFAULT_LIMITS.max_stages
    assert threads and threads[0] is not threading.main_thread()
    assert all(t.name != f"topas-server-{srv.base_url.rsplit(':', 1)[1]}" for t in threads)  # not the loop
    _healthy(http)


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda d: d["stages"][0].update(requests=[1, 1_000_000]), "requests: need 1 <= lo <= hi <= 1000"),
    (lambda d: d["stages"][0].update(input_tokens=10**7), "input_tokens: need 1 <= lo <= hi"),
    (lambda d: d.update(name="n" * 10_000), "name: longer than 256 characters"),
    (lambda d: d["agents"][0].update(prefix_tokens=10**7), "prefix_tokens: expected an integer >= 0 and <="),
    (lambda d: d.update(loads=[0.5] * 100), "loads: expected a non-empty list"),
    (lambda d: d.update(rates=[0.1]), "rates: not read by any command"),
    (lambda d: d.update(loads=[0.3, 0.3]), "loads: 0.3 listed twice"),
    (lambda d: d["stages"][0].update(tool_wait_s=1e9), "tool_wait_s: expected a finite number"),
    (lambda d: d.update(stages=_chain(DEFAULT_LIMITS.max_stages + 1)["stages"]), "stages: more than 10000"),
])
def test_workflow_limits_are_400s_naming_the_field(http, mutate, needle):
    doc = _chain(3, name="limited")
    mutate(doc)
    err = _openai_error(http.post("/v1/topas/workflows", content=json.dumps(doc)), 400)
    assert needle in err["message"]
    assert len(err["message"]) < 400  # a huge name is rejected, not echoed


def test_bodies_over_the_limits_are_413(srv, http):
    big = "x" * (srv.config.max_body_bytes + 1)
    err = _openai_error(http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": big}]}),
                        413)
    assert "larger than" in err["message"]
    _openai_error(http.post("/v1/topas/workflows", content="#" * (srv.config.max_workflow_bytes + 1)), 413)
    _healthy(http)


def test_deep_yaml_is_a_400_not_a_crash(http):
    # libyaml's composer recursed without a guard and segfaulted the whole server
    for text in ("[" * 100_000 + "]" * 100_000, "- " * 100_000 + "x", "{a: " * 5000 + "1" + "}" * 5000):
        err = _openai_error(http.post("/v1/topas/workflows", content=text), 400)
        assert "nested deeper than" in err["message"]
    _healthy(http)


# ---------------------------------------------------------------- 2: lone surrogates


@pytest.mark.parametrize("body", [
    {"messages": MSG, "topas": dict(LABEL, stage="\ud800")},
    {"messages": [{"role": "user", "content": "a\udfffb"}]},
    {"model": "\ud800", "messages": MSG},
    {"prompt": "x\ud834"},
    {"messages": MSG, "\udc00": 1},
])
def test_lone_surrogates_are_400_and_stats_stay_200(http, body):
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    raw = json.dumps(body)  # ensure_ascii: the surrogate travels as a \\udxxx escape
    err = _openai_error(http.post(path, content=raw, headers={"content-type": "application/json"}), 400)
    assert "surrogate" in err["message"]
    _healthy(http)


def test_a_valid_surrogate_pair_is_fine(http):
    body = json.dumps({"messages": [{"role": "user", "content": "snake \U0001F40D"}], "max_tokens": 5})
    assert "\\ud83d\\udc0d" in body
    assert http.post("/v1/chat/completions", content=body).status_code == 200


def test_a_surrogate_in_a_workflow_name_is_a_400(http):
    err = _openai_error(http.post("/v1/topas/workflows", content=json.dumps(_chain(2, name="w\ud800"))), 400)
    assert "invalid Unicode" in err["message"]  # libyaml refuses the escape
    _healthy(http)
    from topas_agents.errors import WorkflowError
    from topas_agents.workflow import parse_workflow

    with pytest.raises(WorkflowError, match="surrogate"):  # a mapping built in Python
        parse_workflow(_chain(2, name="w\ud800"))


# ---------------------------------------------------------------- 3: other 500s, error shape


def test_huge_integers_are_400s(http):
    digits = "9" * 5000
    raw = '{"messages": [{"role": "user", "content": "x"}], "max_tokens": ' + digits + "}"
    _openai_error(http.post("/v1/chat/completions", content=raw), 400)
    err = _openai_error(http.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2**40}), 400)
    assert err["param"] == "max_tokens"
    headers = {"X-Topas-Task-Id": "h", "X-Topas-Stage": "s1", "X-Topas-Agent": "a", "X-Topas-Prefix-Tokens": digits}
    err = _openai_error(http.post("/v1/chat/completions", json={"messages": MSG}, headers=headers), 400)
    assert err["param"] == "topas.prefix_tokens" and digits not in err["message"]
    _healthy(http)


def test_a_huge_model_name_is_a_400_not_echoed(http):
    err = _openai_error(http.post("/v1/chat/completions", json={"model": "m" * 100_000, "messages": MSG}), 400)
    assert err["param"] == "model" and len(err["message"]) < 200


def test_deep_json_is_a_400(http):
    raw = '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
    _openai_error(http.post("/v1/chat/completions", content=raw), 400)
    _healthy(http)


@pytest.mark.parametrize("query", ["calls=abc", "calls=-1", "calls=" + "9" * 50, "calls=1.5"])
def test_stats_query_errors_have_the_openai_shape(http, query):
    err = _openai_error(http.get(f"/v1/topas/stats?{query}"), 400)
    assert err["param"] == "calls"


def test_method_and_route_errors_have_the_openai_shape(http):
    _openai_error(http.get("/v1/chat/completions"), 405)
    _openai_error(http.get("/nope"), 404)


def test_a_bug_is_one_500_and_the_keep_alive_connection_survives(srv, monkeypatch):
    """A handled 500 must not reach uvicorn (it logged it and could reset the connection)."""
    import topas_agents.server.app as app_module

    def boom(*a, **k):
        raise RuntimeError("injected bug")

    monkeypatch.setattr(app_module, "resolve_label", boom)
    host, port = srv.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        f = sock.makefile("rwb")
        body = json.dumps({"messages": MSG}).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        f.write(head + body)
        f.flush()
        status, text = _read_response(f)
        assert status == 500 and json.loads(text)["error"]["type"] == "server_error"
        f.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # same connection
        f.flush()
        status, text = _read_response(f)
        assert status == 200 and json.loads(text)["status"] == "ok"


def _read_response(f) -> tuple[int, str]:
    status = int(f.readline().split()[1])
    length = 0
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return status, f.read(length).decode()


def test_yaml_loader_limits_for_the_cli(tmp_path):
    from topas_agents.cli import main

    path = tmp_path / "w.yaml"
    doc = _chain(2)
    doc["stages"][0]["requests"] = [1, 1_000_000]
    path.write_text(yaml.safe_dump(doc))
    assert main(["bench", "--workload", str(path), "--tasks", "1"]) == 2  # one-line error, exit 2


def test_workflow_uploads_are_bounded_per_key_and_identical_ones_are_free(tmp_path):
    # every registered workflow stays for the server's lifetime: distinct uploads without a bound
    # grew its memory without end (a 4 MiB definition is about 17 MB parsed)
    keys = ("k-one", "k-two")
    cfg = ServerConfig(time_scale=1000.0, workflows=("chain3",), api_keys=keys, max_workflows=2,
                       max_workflow_total_bytes=600)
    handle = start_server_in_thread(cfg)
    try:
        with httpx.Client(base_url=handle.base_url, timeout=30) as http:
            one, two = ({"Authorization": f"Bearer {k}"} for k in keys)
            small = [json.dumps(_chain(2, f"w{i}")) for i in range(3)]
            for body in small[:2]:
                assert http.post("/v1/topas/workflows", content=body, headers=one).status_code == 201
            assert http.post("/v1/topas/workflows", content=small[0], headers=one).status_code == 200  # the same again
            err = _openai_error(http.post("/v1/topas/workflows", content=small[2], headers=one), 409)
            assert "already holds 2 workflows uploaded with this key" in err["message"] and err["param"] == "name"
            # another key has its own quota, in number and in bytes
            assert http.post("/v1/topas/workflows", content=small[2], headers=two).status_code == 201
            big = json.dumps(_chain(5, "big"))
            assert 600 - len(small[2]) < len(big) <= 600
            err = _openai_error(http.post("/v1/topas/workflows", content=big, headers=two), 409)
            assert "past 600 bytes" in err["message"]
            listed = http.get("/v1/topas/workflows", headers=two).json()["workflows"]
            assert listed == ["chain3", "w2"]  # the refused upload registered nothing
            ok = http.post("/v1/chat/completions", headers=one, json={
                "model": "m", "messages": MSG, "max_tokens": 2,
                "topas": {"task_id": "t1", "stage": "s1", "agent": "a", "workflow": "w1"}})
            assert ok.status_code == 200  # what was registered still serves
    finally:
        handle.stop()
    with pytest.raises(Exception, match="max_workflows must be >= 1"):
        ServerConfig(max_workflows=0)
