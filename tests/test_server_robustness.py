"""Disconnects, load, shutdown and engine failure, against a server running in a thread."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest
from test_server_fake import fake_factory  # tests/ is on sys.path (pytest rootdir-relative import)

from topas_agents.server import ServerConfig, start_server_in_thread

LONG = {"task_id": "", "stage": "s1", "agent": "a", "workflow": "chain3"}  # 256 output tokens: ~8 s at 1x


def _long(task: str) -> dict:
    return {"topas": dict(LONG, task_id=task)}


def _stats(handle) -> dict:
    return httpx.get(f"{handle.base_url}/v1/topas/stats", timeout=10).json()


def _wait_for(pred, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def realtime():
    """Simulated time at wall speed (1x): calls last seconds, so clients can leave early."""
    handle = start_server_in_thread(ServerConfig(time_scale=1.0, workflows=("chain3",), policy="topas"))
    yield handle
    handle.stop()


def _assert_freed(handle, rid: str) -> None:
    def freed() -> bool:
        s = _stats(handle)
        rec = next(c for c in s["calls"] if c["rid"] == rid)
        return rec["status"] == "cancelled" and s["queues"]["running"] == 0 and s["queues"]["waiting"] == 0

    _wait_for(freed)
    s = _stats(handle)
    resident = sum(p["tokens"] for p in s["prefixes"] if p["location"] in ("gpu", "loading"))
    assert s["kv"]["used"] == resident  # only shared prefixes remain: the request's KV is freed
    assert s["requests"]["in_flight"] == 0


def test_disconnect_cancels_a_non_streaming_call(realtime) -> None:
    client = openai.OpenAI(base_url=realtime.url, api_key="x", max_retries=0, timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                       extra_body=_long("dc-1"))
    rid = next(c["rid"] for c in _stats(realtime)["calls"] if c["task_id"] == "dc-1")
    _assert_freed(realtime, rid)


def test_disconnect_cancels_a_streaming_call(realtime) -> None:
    client = openai.OpenAI(base_url=realtime.url, api_key="x", max_retries=0, timeout=30)
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True,
                                            extra_body=_long("dc-2"))
    first = next(iter(stream))
    stream.close()
    _assert_freed(realtime, first.id)


def test_streaming_is_smooth_at_wall_speed(realtime) -> None:
    client = openai.OpenAI(base_url=realtime.url, api_key="x", max_retries=0, timeout=30)
    t0 = time.monotonic()
    text_chunks, arrivals = [], []
    for c in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "y " * 300}],
                                            stream=True, max_tokens=40):
        if c.choices and c.choices[0].delta.content:
            text_chunks.append(c.choices[0].delta.content)
            arrivals.append(time.monotonic() - t0)
    assert "".join(text_chunks) == "Echo: " + "y " * 29 + "y ..."
    assert len(text_chunks) >= 10  # ~1.5 s of decoding delivered in many small pieces
    assert arrivals[-1] - arrivals[0] > 0.8  # paced by simulated time, not dumped at the end


def test_single_token_response() -> None:
    handle = start_server_in_thread(ServerConfig(time_scale=100.0, policy="fcfs"))
    try:
        client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=10)
        r = client.completions.create(model="m", prompt="tell me a story", max_tokens=1)
        assert r.choices[0].text == "Echo" and r.usage.completion_tokens == 1
    finally:
        handle.stop()


async def _load(url: str, n: int) -> list[tuple[int, str, str]]:
    client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=120)

    async def one(i: int) -> tuple[int, str, str]:
        extra = {"extra_body": {"topas": {"task_id": f"load-{i}", "stage": "s_a", "agent": "a",
                                          "workflow": "dag4"}}} if i % 2 else {}
        if i % 4 == 3:
            s = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"req {i}"}],
                                                     max_tokens=8, stream=True, **extra)
            text = "".join([c.choices[0].delta.content or "" async for c in s if c.choices])
            return i, text, "stream"
        r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"req {i}"}],
                                                 max_tokens=8, **extra)
        return i, r.choices[0].message.content, r.id

    try:
        return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), timeout=150)
    finally:
        await client.close()


@pytest.mark.slow  # ~10-20 s on 2 shared cores: client and server share one process
def test_a_thousand_concurrent_requests_complete_none_lost() -> None:
    n = 1000
    handle = start_server_in_thread(ServerConfig(time_scale=1000.0, workflows=("dag4",), policy="topas"))
    try:
        results = asyncio.run(_load(handle.url, n))
        assert sorted(i for i, _, _ in results) == list(range(n))
        assert all(text == f"Echo: req {i}" for i, text, _ in results)  # nothing mixed up
        s = _stats(handle)
        assert s["requests"]["calls_by_status"] == {"ok": n} and s["requests"]["in_flight"] == 0
        assert s["engine"]["requests_finished"] == n
        assert s["queues"] == {"waiting": 0, "running": 0}
        assert sum(1 for t in s["tasks"]["items"] if t["task_id"].startswith("load-")) == n // 2
    finally:
        handle.stop()


def test_graceful_shutdown_drains_then_fails_cleanly() -> None:
    handle = start_server_in_thread(ServerConfig(time_scale=1.0, workflows=("chain3",), drain_timeout_s=2.0))
    client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=30)
    outcome: dict[str, object] = {}

    def run(name: str, fn) -> None:
        try:
            outcome[name] = fn()
        except Exception as exc:  # recorded and asserted below
            outcome[name] = exc

    msgs = [{"role": "user", "content": "x"}]
    jobs = {
        "short": lambda: client.chat.completions.create(model="m", messages=msgs, max_tokens=8),
        "long": lambda: client.chat.completions.create(model="m", messages=msgs, extra_body=_long("sd-1")),
        "stream": lambda: "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="m", messages=msgs, stream=True, extra_body=_long("sd-2")) if c.choices),
    }
    threads = {k: threading.Thread(target=run, args=(k, f)) for k, f in jobs.items()}
    threads["long"].start()
    threads["stream"].start()
    _wait_for(lambda: _stats(handle)["requests"]["in_flight"] == 2)
    threads["short"].start()  # last, so that it is surely in flight when shutdown starts
    _wait_for(lambda: _stats(handle)["requests"]["in_flight"] == 3)
    stopper = threading.Thread(target=handle.stop)
    stopper.start()
    _wait_for(lambda: httpx.get(f"{handle.base_url}/health").json()["status"] == "draining")
    with pytest.raises(openai.InternalServerError) as info:  # new work is refused while draining
        client.chat.completions.create(model="m", messages=msgs, max_tokens=2)
    assert info.value.status_code == 503
    stopper.join(20)
    for t in threads.values():
        t.join(10)
    assert not stopper.is_alive()
    assert outcome["short"].choices[0].message.content == "Echo: x"  # finished during the drain
    assert isinstance(outcome["long"], openai.InternalServerError) and outcome["long"].status_code == 503
    assert isinstance(outcome["stream"], openai.APIError) and "shut down" in str(outcome["stream"])


def test_engine_failure_fails_calls_cleanly_and_health_reports_it() -> None:
    handle = start_server_in_thread(ServerConfig(time_scale=10.0), engine_factory=fake_factory(fail_at=0.0))
    client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=10)
    try:
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=500)
        assert "engine failed" in info.value.body["message"]
        health = httpx.get(f"{handle.base_url}/health")
        assert health.status_code == 503 and health.json()["status"] == "failed"
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=5)
    finally:
        handle.stop()


def test_an_engine_without_a_policy_attribute_shuts_down_cleanly() -> None:
    # the Engine protocol names no `policy`; the service's stop read `engine.policy` and raised
    from topas_agents.server.app import build_app

    app = build_app(ServerConfig(time_scale=10.0), engine_factory=fake_factory())

    async def serve_and_stop() -> None:
        svc = app.state.service
        assert not hasattr(svc.engine, "policy")
        async with app.router.lifespan_context(app):
            pass
        assert svc.loop.failure is None

    asyncio.run(serve_and_stop())


def test_a_crashed_engine_loop_fails_calls_instead_of_hanging(monkeypatch) -> None:
    """A bug in the loop itself (not in the engine, which `_advance` catches) ended its task:
    on Python 3.10 the idle sleep's timeout escaped it, and every later call waited forever."""
    from topas_agents.server.engine_loop import EngineLoop

    armed = threading.Event()
    real_sleep = EngineLoop._sleep

    async def sleep(self, seconds: float) -> None:
        if armed.is_set():
            raise RuntimeError("a bug in the loop")
        await real_sleep(self, seconds)

    monkeypatch.setattr(EngineLoop, "_sleep", sleep)
    handle = start_server_in_thread(ServerConfig(time_scale=10.0))
    client = openai.OpenAI(base_url=handle.url, api_key="x", max_retries=0, timeout=10)
    msgs = [{"role": "user", "content": "x"}]
    try:
        assert client.chat.completions.create(model="m", messages=msgs, max_tokens=2).choices[0].message.content
        armed.set()
        with pytest.raises(openai.InternalServerError) as info:  # in flight when the loop died
            client.chat.completions.create(model="m", messages=msgs, max_tokens=500)
        assert "engine failed" in info.value.body["message"] and "a bug in the loop" in info.value.body["message"]
        with pytest.raises(openai.InternalServerError) as later:  # refused at once, not queued forever
            client.chat.completions.create(model="m", messages=msgs, max_tokens=2)
        assert later.value.status_code == 503
        health = httpx.get(f"{handle.base_url}/health")
        assert health.status_code == 503 and health.json()["status"] == "failed"
    finally:
        handle.stop()


def test_a_client_gone_during_its_body_upload_is_no_server_error() -> None:
    # starlette's ClientDisconnect escaped read_body: an "unhandled error" traceback and a 500
    import socket

    handle = start_server_in_thread(ServerConfig(time_scale=100.0, workflows=("chain3",)))
    try:
        host, port = handle.base_url.removeprefix("http://").split(":")
        for path in ("/v1/chat/completions", "/v1/responses", "/v1/topas/workflows"):
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n".encode()
                          + b'{"messages":')
        def gone_counted() -> bool:
            return sum(h["count"] for h in _stats(handle)["requests"]["http"] if h["status"] == 499) == 3

        _wait_for(gone_counted)  # the server sees each disconnect when it next reads the socket
        http = _stats(handle)["requests"]["http"]
        assert [h for h in http if h["status"] >= 500] == []
        assert 'status="500"' not in httpx.get(f"{handle.base_url}/metrics", timeout=10).text
    finally:
        handle.stop()


def test_a_task_whose_only_call_was_cancelled_has_no_jct() -> None:
    # a client that gave up after 0.5 s made an unlabelled "single" task with a 0.5 s JCT,
    # and a labelled task that ended "idle" with its cancelled call's span: timeouts under
    # overload read as short tasks
    realtime = start_server_in_thread(ServerConfig(time_scale=1.0, workflows=("chain3",), policy="topas"))
    try:
        _only_cancelled_calls(realtime)
    finally:
        realtime.stop()


def _only_cancelled_calls(realtime) -> None:
    before = _stats(realtime)
    client = openai.OpenAI(base_url=realtime.url, api_key="x", max_retries=0, timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                       extra_body=_long("gone-1"))
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x " * 4000}], max_tokens=4000)
    httpx.post(f"{realtime.base_url}/v1/topas/tasks/gone-1/done", timeout=10)

    def both_ended() -> bool:
        s = _stats(realtime)
        return s["tasks"]["abandoned"] == before["tasks"]["abandoned"] + 2 and s["requests"]["in_flight"] == 0

    _wait_for(both_ended)
    after = _stats(realtime)
    assert after["jct"]["count"] == before["jct"]["count"]
    task = next(t for t in after["tasks"]["items"] if t["task_id"] == "gone-1")
    assert task["done_reason"] == "abandoned"
    metrics = httpx.get(f"{realtime.base_url}/metrics", timeout=10).text
    count = sum(float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("topas_task_jct_seconds_count"))
    assert count == after["jct"]["count"]


def test_an_idle_keep_alive_connection_outlives_the_clients_own_expiry() -> None:
    # at uvicorn's 5 s the server closed idle connections as httpx's pool (5 s) reused them:
    # a call sent on a connection being closed failed (1 in 1000 under load)
    import http.client
    from urllib.parse import urlsplit

    handle = start_server_in_thread(ServerConfig(time_scale=50.0))
    url = urlsplit(handle.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        conn.request("GET", "/health")
        assert conn.getresponse().read() and conn.sock is not None
        sock = conn.sock
        time.sleep(6.0)  # past httpx's and openai's 5 s pool expiry
        conn.request("GET", "/health")  # on the same connection (http.client never reopens one itself)
        response = conn.getresponse()
        assert response.status == 200 and response.read() and conn.sock is sock
    finally:
        conn.close()
        handle.stop()
