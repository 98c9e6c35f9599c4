"""The front's relay to smg (server/cluster/relay.py): one wait for a restarting smg shared by
POST calls and GET /v1/models, with what each may try again."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from topas_agents.server.cluster import relay

URL = "http://smg.test"
NO_WORKER = {"error": {"code": "model_not_found", "message": "No worker available"}}


class Smg:
    """A mock smg that answers from a script: "refused" (the connection), or a status."""

    def __init__(self, script: list[str | int]) -> None:
        self.script = script
        self.seen: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request.method)
        step = self.script.pop(0) if self.script else 200
        if step == "refused":
            raise httpx.ConnectError("connection refused", request=request)
        if step == 404:
            return httpx.Response(404, json=NO_WORKER)
        return httpx.Response(int(step), json={"ok": True})


def _call(method: str, smg: Smg, wait_s: float = 5.0, draining: bool = False) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.MockTransport(smg)) as http:
            if method == "POST":
                resp = await relay.post_to_gateway(http, URL + "/v1/chat/completions", b"{}", [], wait_s,
                                                   lambda: draining)
            else:
                resp = await relay.get_from_gateway(http, URL + "/v1/models/nope", wait_s, lambda: draining)
            await resp.aread()
            return resp

    return asyncio.run(asyncio.wait_for(go(), 10))


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    monkeypatch.setattr(relay, "GATEWAY_RETRY_S", 0.01)


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_a_refused_connection_is_tried_again_until_smg_answers(method):
    smg = Smg(["refused", "refused", 200])
    resp = _call(method, smg)
    assert resp.status_code == 200 and resp.json() == {"ok": True}
    assert smg.seen == [method] * 3


def test_a_post_waits_out_smgs_404_model_not_found_but_a_get_relays_it():
    # the front names the served model in a call's body: 404 model_not_found means no worker
    # yet; GET /v1/models/{id} carries the client's id, so the same 404 is the answer
    post = Smg([404, 404, 200])
    assert _call("POST", post).status_code == 200 and post.seen == ["POST"] * 3
    get = Smg([404, 200])
    resp = _call("GET", get)
    assert resp.status_code == 404 and resp.json() == NO_WORKER and get.seen == ["GET"]


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_no_wait_while_draining_or_past_the_wait(method):
    for kw in ({"draining": True}, {"wait_s": 0.0}):
        smg = Smg(["refused", 200])
        with pytest.raises(httpx.ConnectError):
            _call(method, smg, **kw)
        assert smg.seen == [method], kw


def test_the_last_404_is_relayed_with_its_body():
    smg = Smg([404] * 100)
    resp = _call("POST", smg, wait_s=0.05)
    assert resp.status_code == 404 and resp.json() == NO_WORKER
    assert 1 < len(smg.seen) < 100  # it waited, then gave the client smg's answer
