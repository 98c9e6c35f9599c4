"""The cluster front's drain on stop (server/cluster/drain.py): a real uvicorn front over a
stand-in smg (httpx.MockTransport), so the relays' timing is controlled; no processes."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from topas_agents.server.cluster.config import ClusterConfig
from topas_agents.server.cluster.drain import DrainingFront
from topas_agents.server.cluster.front import build_front

CHUNK = b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}],
        "topas": {"task_id": "t", "stage": "s", "agent": "a"}}


class _SlowAnswer:
    """A non-streaming call smg answers after `answer_s` (it sends nothing before); records
    whether the front gave up on it."""

    def __init__(self, answer_s: float) -> None:
        self.answer_s = answer_s
        self.cancelled = threading.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "sim"}]})
        try:
            await asyncio.sleep(self.answer_s)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return httpx.Response(200, json={"choices": []})


class _Smg:
    """Streams CHUNK, then waits `pause_s`, then ends with [DONE]."""

    def __init__(self, pause_s: float) -> None:
        self.pause_s = pause_s

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "sim"}]})

        async def body():
            yield CHUNK
            await asyncio.sleep(self.pause_s)
            yield CHUNK + b"data: [DONE]\n\n"

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _front(pause_s: float, drain_s: float, smg: object = None) -> tuple[DrainingFront, threading.Thread, str]:
    app = build_front(ClusterConfig(replicas=2))
    front = app.state.front
    front.client = httpx.AsyncClient(transport=httpx.MockTransport(smg or _Smg(pause_s)))
    port = _free_port()
    server = DrainingFront(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                                          timeout_graceful_shutdown=3), front.drain, drain_s)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the front did not start"
        time.sleep(0.01)
    return server, thread, f"http://127.0.0.1:{port}"


def _stream_then_stop(server: DrainingFront, url: str, force: bool = False) -> list[str]:
    lines: list[str] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=BODY, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line:
                continue
            lines.append(line)
            if len(lines) == 1:  # in flight: stop the front
                server.should_exit = True
                if force:
                    time.sleep(0.3)
                    server.force_exit = True
    return lines


def test_a_relay_that_ends_within_the_drain_is_delivered_whole(caplog):
    server, thread, url = _front(pause_s=1.0, drain_s=10.0)
    lines = _stream_then_stop(server, url)
    thread.join(10)
    assert not thread.is_alive()
    assert lines[-1] == "data: [DONE]" and len(lines) == 3 and "error" not in "".join(lines)


@pytest.mark.parametrize("force", [False, True])
def test_a_relay_left_after_the_drain_ends_with_an_error_event_not_a_cut(caplog, force):
    """Before: stopping a cluster stopped smg with the replicas, and a relay still streaming
    just stopped mid-body with its 200; on a second Ctrl-C uvicorn's teardown cancelled it
    ("Exception in ASGI application")."""
    caplog.set_level(logging.INFO)
    server, thread, url = _front(pause_s=60.0, drain_s=60.0 if force else 0.5)
    t0 = time.monotonic()
    lines = _stream_then_stop(server, url, force=force)
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - t0 < 10
    assert lines[0] == CHUNK.decode().strip() and lines[-1] == "data: [DONE]"
    assert "server shut down before the request finished" in lines[1]
    assert "Exception in ASGI application" not in caplog.text and "Traceback" not in caplog.text


def test_a_new_call_while_draining_is_a_503():
    server, thread, url = _front(pause_s=60.0, drain_s=1.0)
    done = threading.Event()

    def hold() -> None:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=BODY, timeout=30) as r:
            for _ in r.iter_lines():
                done.set()

    holder = threading.Thread(target=hold)
    holder.start()
    assert done.wait(10)
    server.should_exit = True
    time.sleep(0.3)  # draining: the socket still listens
    r = httpx.post(f"{url}/v1/chat/completions", json={**BODY, "stream": False}, timeout=10)
    assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
    health = httpx.get(f"{url}/health", timeout=10)  # said "ok" while every call got a 503
    assert health.status_code == 503 and health.json()["status"] == "draining"
    holder.join(10)
    thread.join(10)
    assert not thread.is_alive()


def test_a_client_gone_before_a_non_streaming_answer_cuts_the_relay():
    # smg answers a non-streaming call only when it is over, and the front waited for that:
    # a client that timed out left the replica's call running to its end, counted "ok"
    smg = _SlowAnswer(answer_s=30.0)
    server, thread, url = _front(pause_s=0.0, drain_s=1.0, smg=smg)
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/chat/completions", json={**BODY, "stream": False}, timeout=0.5)
        assert smg.cancelled.wait(5)
    finally:
        server.should_exit = True
        thread.join(10)
