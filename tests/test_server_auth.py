"""`--api-key`: Bearer authentication on every endpoint but /health, and one namespace per
key (tasks, agents, workflows, stats)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from topas_agents.cli import main
from topas_agents.errors import ConfigError
from topas_agents.server import ServerConfig, start_server_in_thread

A, B = "key-alpha-0123", "key-bravo-4567"
MSG = [{"role": "user", "content": "hello"}]
WF = {"name": "mine", "agents": [{"name": "a", "prefix_tokens": 100}],
      "stages": [{"name": "s1", "agent": "a", "input_tokens": 1, "output_tokens": 4},
                 {"name": "s2", "agent": "a", "after": ["s1"], "input_tokens": 1, "output_tokens": 4}]}


@pytest.fixture(scope="module")
def srv():
    handle = start_server_in_thread(ServerConfig(time_scale=1000.0, workflows=("chain3",), api_keys=(A, B)))
    yield handle
    handle.stop()


def _client(srv, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=srv.base_url, headers=headers, timeout=30)


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
    ("GET", "/v1/topas/stats"), ("GET", "/metrics"), ("GET", "/v1/topas/workflows"),
    ("POST", "/v1/topas/workflows"), ("POST", "/v1/topas/tasks/t/done"), ("POST", "/v1/topas/tasks/t/stages/s/done"),
    ("GET", "/no-such-route"),
])
@pytest.mark.parametrize("key", [None, "wrong", A + "x"])
def test_every_endpoint_but_health_needs_a_valid_key(srv, method, path, key):
    with _client(srv, key) as c:
        rsp = c.request(method, path, json={"messages": MSG})
        assert rsp.status_code == 401
        err = rsp.json()["error"]
        assert err["code"] == "invalid_api_key" and set(err) == {"message", "type", "param", "code"}
        assert c.get("/health").status_code == 200


def test_the_openai_client_works_with_a_key(srv):
    client = openai.OpenAI(base_url=srv.url, api_key=A, max_retries=0)
    r = client.chat.completions.create(model="m", messages=MSG, max_tokens=3)
    assert r.choices[0].message.content
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=srv.url, api_key="nope", max_retries=0).models.list()


def test_tenants_cannot_touch_each_others_tasks(srv):
    label = {"task_id": "shared-id", "stage": "s1", "agent": "a", "workflow": "chain3"}
    with _client(srv, A) as a, _client(srv, B) as b:
        ra = a.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 3, "topas": label})
        assert ra.status_code == 200 and ra.json()["topas"]["task_id"] == "shared-id"
        assert b.post("/v1/topas/tasks/shared-id/done").status_code == 404  # B cannot close A's task
        assert b.post("/v1/topas/tasks/shared-id/stages/s1/done").status_code == 404
        rb = b.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 3, "topas": label})
        assert rb.status_code == 200  # the same id is B's own, separate task
        done = a.post("/v1/topas/tasks/shared-id/done")
        assert done.status_code == 200 and done.json()["task_id"] == "shared-id"
        rb2 = b.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 3, "topas": label})
        assert rb2.status_code == 200  # A closing its task did not close B's
        sa, sb = a.get("/v1/topas/stats").json(), b.get("/v1/topas/stats").json()
        mine = [c["rid"] for c in sa["calls"] if c["task_id"] == "shared-id"]
        assert mine == [ra.json()["id"]]
        assert [c["rid"] for c in sb["calls"] if c["task_id"] == "shared-id"] == [rb.json()["id"], rb2.json()["id"]]
        assert {c["rid"] for c in sa["calls"]}.isdisjoint({c["rid"] for c in sb["calls"]})
        assert [t["task_id"] for t in sa["tasks"]["items"]].count("shared-id") == 1
        assert all("/" not in p["agent"] for p in sa["prefixes"] + sb["prefixes"])


def test_workflow_names_cannot_be_squatted_or_replaced(srv):
    with _client(srv, A) as a, _client(srv, B) as b:
        assert a.post("/v1/topas/workflows", content=json.dumps(WF)).status_code == 201
        bogus = dict(WF, stages=WF["stages"][:1])
        assert a.post("/v1/topas/workflows", content=json.dumps(bogus)).status_code == 409
        # B's own "mine" is its own: A's registration neither blocks nor replaces it
        assert b.post("/v1/topas/workflows", content=json.dumps(bogus)).status_code == 201
        assert "mine" in a.get("/v1/topas/workflows").json()["workflows"]
        label = {"task_id": "w1", "stage": "s2", "agent": "a", "workflow": "mine"}
        assert a.post("/v1/chat/completions", json={"messages": MSG, "topas": label}).status_code == 200
        err = b.post("/v1/chat/completions", json={"messages": MSG, "topas": label}).json()["error"]
        assert err["param"] == "topas.stage"  # strict checking against B's own definition
        # shared --workflow definitions cannot be replaced by a tenant
        chain = {"name": "chain3", "agents": [{"name": "a", "prefix_tokens": 1}],
                 "stages": [{"name": "s1", "agent": "a", "input_tokens": 1, "output_tokens": 1}]}
        assert b.post("/v1/topas/workflows", content=json.dumps(chain)).status_code == 409


def test_a_tenant_sees_only_its_own_workflows(srv):
    with _client(srv, A) as a, _client(srv, B) as b:
        a.post("/v1/topas/workflows", content=json.dumps(dict(WF, name="only-a")))
        assert "only-a" in a.get("/v1/topas/workflows").json()["workflows"]
        assert "only-a" not in b.get("/v1/topas/workflows").json()["workflows"]
        label = {"task_id": "x", "stage": "s1", "agent": "a", "workflow": "only-a"}
        err = b.post("/v1/chat/completions", json={"messages": MSG, "topas": label}).json()["error"]
        assert err["param"] == "topas.workflow" and "only-a" not in err["message"].split("registered:")[1]


def test_a_huge_workflow_name_is_rejected_not_echoed(srv):
    with _client(srv, A) as a:
        rsp = a.post("/v1/topas/workflows", content=json.dumps(dict(WF, name="n" * 100_000)))
        assert rsp.status_code == 400 and len(rsp.text) < 1000


def test_keys_must_be_printable():
    with pytest.raises(ConfigError):
        ServerConfig(api_keys=("bad key\n",))


def test_serve_reads_the_key_flag_and_env(monkeypatch):
    from topas_agents.cli import serve

    seen = {}
    monkeypatch.setattr("topas_agents.server.runner.run_server", lambda cfg: seen.setdefault("cfg", cfg) and 0)
    monkeypatch.setenv("TOPAS_API_KEY", "from-env")
    assert main(["serve", "--port", "0"]) == 0 and seen.pop("cfg").api_keys == ("from-env",)
    assert main(["serve", "--api-key", "k1", "--api-key", "k2"]) == 0 and seen.pop("cfg").api_keys == ("k1", "k2")
    monkeypatch.delenv("TOPAS_API_KEY")
    assert main(["serve"]) == 0 and seen.pop("cfg").api_keys == ()
    # set but empty (`TOPAS_API_KEY=$SECRET` with SECRET unset) served with no authentication
    for empty in ("", "  "):
        monkeypatch.setenv("TOPAS_API_KEY", empty)
        assert main(["serve"]) != 0 and "cfg" not in seen
        assert main(["serve", "--replicas", "2"]) != 0
    assert serve.add_parser  # the flag lives on `topas serve`


def test_errors_name_a_tenants_tasks_as_it_does(srv):
    label = {"task_id": "closed", "stage": "s1", "agent": "a", "workflow": "chain3"}
    with _client(srv, A) as a:
        assert a.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 3, "topas": label}).status_code == 200
        assert a.post("/v1/topas/tasks/closed/done").status_code == 200
        err = a.post("/v1/chat/completions", json={"messages": MSG, "topas": label}).json()["error"]
        assert err["param"] == "topas.task_id" and "'closed'" in err["message"] and "key1" not in err["message"]
        err = a.post("/v1/topas/tasks/nope/done").json()["error"]
        assert "'nope'" in err["message"] and "key1" not in err["message"]


def _task_of(srv, key: str, task_id: str) -> dict:
    with _client(srv, key) as c:
        return next(t for t in c.get("/v1/topas/stats").json()["tasks"]["items"] if t["task_id"] == task_id)


async def test_task_scopes_close_their_task_on_a_keyed_server(srv, caplog):
    # before: the done call of task(client=...) went without the client's key, the server
    # answered 401, and the task stayed open until the idle timeout (its JCT padded by minutes)
    from topas_agents import label
    from topas_agents.integrations.openai_client import labelled
    from topas_agents.integrations.task import task

    client = labelled(openai.OpenAI(base_url=srv.url, api_key=A, max_retries=0))
    with task("keyed-sync", client=client, workflow="chain3"), label(stage="s1", agent="a"):
        client.chat.completions.create(model="m", messages=MSG, max_tokens=3)
    assert _task_of(srv, A, "keyed-sync")["done_reason"] == "explicit"
    async with task("keyed-async", base_url=srv.url, api_key=B, workflow="chain3"):
        with label(stage="s1", agent="a"):
            labelled(openai.OpenAI(base_url=srv.url, api_key=B, max_retries=0)).chat.completions.create(
                model="m", messages=MSG, max_tokens=3)
    assert _task_of(srv, B, "keyed-async")["done_reason"] == "explicit"
    for dots in (".", ".."):  # before: httpx resolved the dot segment and the done call 404'd
        with task(dots, client=client, workflow="chain3"), label(stage="s1", agent="a"):
            client.chat.completions.create(model="m", messages=MSG, max_tokens=3)
        assert _task_of(srv, A, dots)["done_reason"] == "explicit"
    with task("keyed-nokey", base_url=srv.url, workflow="chain3"), label(stage="s1", agent="a"):
        client.chat.completions.create(model="m", messages=MSG, max_tokens=3)
    assert not _task_of(srv, A, "keyed-nokey")["done"]  # refused: said, not raised
    assert "refused the API key (HTTP 401)" in caplog.text and "task(api_key=...)" in caplog.text
    with pytest.raises(ConfigError, match="api_key"):
        task("t", base_url=srv.url, api_key="bad\nkey")


def test_per_stage_counts_are_each_keys_own(srv):
    # keyed by workflow name only: key B saw key A's calls of the shared built-in chain3, and
    # neither saw its own unlabelled or workflow-less calls
    def counts(c: httpx.Client) -> dict:
        return {(s["workflow"], s["stage"]): s["calls"] for s in c.get("/v1/topas/stats").json()["stages"]}

    with _client(srv, A) as a, _client(srv, B) as b:
        mine_before, theirs_before = counts(a), counts(b)
        for i in range(2):
            lab = {"task_id": f"stage-count-{i}", "stage": "s1", "agent": "a", "workflow": "chain3"}
            assert a.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2, "topas": lab}).status_code == 200
        free = {"task_id": "no-wf", "stage": "own-stage", "agent": "x"}
        assert a.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2, "topas": free}).status_code == 200
        mine, theirs = counts(a), counts(b)
    assert mine[("chain3", "s1")] == mine_before.get(("chain3", "s1"), 0) + 2 and mine[(None, "own-stage")] == 1
    assert theirs == theirs_before
