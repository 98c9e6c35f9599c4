"""The engine loop's worker thread: a policy decision runs off the event loop, so a slow one
delays the calls it admits and nothing else; a hung one reads `stuck` on /health and does not
keep the process alive; the engine is never touched from two threads at once."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from topas_agents.engine import EngineRequest
from topas_agents.server import ServerConfig, start_server_in_thread


def test_a_slow_advance_is_logged_once(caplog) -> None:
    # a slow policy delays every call: it used to do so silently
    import logging

    from test_server_fake import FakeEngine

    from topas_agents.server import engine_loop

    class Slow(FakeEngine):
        def next_event_time(self) -> float:
            return self.now  # always something due: every advance goes to the worker thread

        def advance(self, until: float) -> None:
            time.sleep(0.6)
            super().advance(until)

    async def run() -> None:
        loop = engine_loop.EngineLoop(Slow(), 1.0)
        for _ in range(3):
            await loop._advance()

    with caplog.at_level(logging.WARNING, logger="topas.server"):
        asyncio.run(run())
    slow = [r for r in caplog.records if "took" in r.getMessage() and "to advance" in r.getMessage()]
    assert len(slow) == 1 and "topas_decision_latency_seconds" in slow[0].getMessage()


def _think(seconds: float, busy: bool) -> None:
    """A decision's long think: asleep (the GIL released), or computing in Python (holding it,
    as a real policy does, so the loop gets the interpreter only at switch intervals)."""
    if not busy:
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(1000))


@pytest.mark.parametrize("busy", [False, True], ids=["sleeping decision", "CPU-bound decision"])
def test_a_slow_policy_decision_does_not_hold_the_event_loop(busy: bool) -> None:
    """Decisions run in the engine loop's worker thread: while one takes 3 s, /health and the
    models list answer well before it ends (they waited for the whole decision), and the call it
    was deciding about still completes."""
    from test_server_fake import FakeEngine

    decided = threading.Event()

    class SlowDecisions(FakeEngine):
        def advance(self, until: float) -> None:
            if self.waiting:  # a decision to make: admit after a long think
                decided.set()
                _think(3.0, busy)
            super().advance(until)

    def factory(config, workflows):
        return SlowDecisions(), EngineRequest

    handle = start_server_in_thread(ServerConfig(time_scale=1.0), engine_factory=factory)
    try:
        with httpx.Client(base_url=handle.base_url, timeout=30) as client, ThreadPoolExecutor(1) as pool:
            call = pool.submit(client.post, "/v1/chat/completions", json=_hi())
            assert decided.wait(10)
            started = time.perf_counter()
            assert client.get("/health").status_code == 200
            assert client.get("/v1/models").status_code == 200
            answered_s = time.perf_counter() - started
            assert call.result().status_code == 200
        # a third of the decision: generous for shared CI cores, far from "after it"
        assert answered_s < 1.0, f"/health and /v1/models took {answered_s:.2f} s during a 3 s decision"
    finally:
        handle.stop()


def _hi() -> dict:
    return {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def test_a_hung_decision_reads_stuck_on_health_and_the_process_still_exits(tmp_path) -> None:
    """/health answers during a decision (off the event loop), so a hung one must say so: 503
    `stuck` past `stuck_advance_s`. And the advance thread is a daemon: a process whose policy
    never returns exits once its script is done (the interpreter joined a pool's worker)."""
    script = tmp_path / "hung.py"
    script.write_text(f'''
import sys, threading, time
sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
import httpx
from test_server_fake import FakeEngine
from topas_agents.engine import EngineRequest
from topas_agents.server import ServerConfig, start_server_in_thread

deciding = threading.Event()

class Hung(FakeEngine):
    def advance(self, until):
        if self.waiting:
            deciding.set()
            time.sleep(600)
        super().advance(until)

handle = start_server_in_thread(ServerConfig(time_scale=1.0, drain_timeout_s=0.5, stuck_advance_s=0.5),
                                engine_factory=lambda c, w: (Hung(), EngineRequest))
threading.Thread(target=lambda: httpx.post(handle.base_url + "/v1/chat/completions", timeout=600,
                                           json={_hi()!r}), daemon=True).start()
assert deciding.wait(10)
time.sleep(1.0)
r = httpx.get(handle.base_url + "/health", timeout=5)
print(r.status_code, r.json()["status"], r.json()["advancing_s"] >= 0.5, flush=True)
handle.stop(timeout_s=1.0)
''')
    import subprocess
    import sys

    started = time.monotonic()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["503", "stuck", "True"]
    assert time.monotonic() - started < 60  # not the decision's 600 s


def test_a_call_finished_in_an_advance_that_then_fails_keeps_its_answer() -> None:
    from test_server_fake import FakeEngine

    class FinishThenFail(FakeEngine):
        def advance(self, until: float) -> None:
            finished: list[str] = []
            report = self.on_finish
            self.on_finish = lambda rid, t: (finished.append(rid), report(rid, t))
            try:
                super().advance(until)
            finally:
                self.on_finish = report
            if finished:
                raise RuntimeError("policy bug right after a finish")

    handle = start_server_in_thread(ServerConfig(time_scale=100.0),
                                    engine_factory=lambda c, w: (FinishThenFail(), EngineRequest))
    try:
        r = httpx.post(handle.base_url + "/v1/chat/completions", timeout=30, json=_hi())
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
        assert httpx.get(handle.base_url + "/health", timeout=5).json()["status"] == "failed"
    finally:
        handle.stop()


def test_a_tenants_first_call_to_a_shared_workflow_does_not_race_a_decision() -> None:
    """A key's first call to a `--workflow` makes its copy of it; made in the HTTP handler while a
    policy iterated the engine's workflows (in the advance thread), it failed the engine for good
    ('dictionary changed size during iteration')."""
    from topas_agents.server.engine_factory import sim_engine_factory

    iterating = threading.Event()

    class SlowOverWorkflows:
        def __init__(self, inner) -> None:
            self.inner = inner

        def __getattr__(self, name: str):
            return getattr(self.inner, name)

        def decide(self, snap):
            for _ in snap.workflows.values():
                iterating.set()
                time.sleep(0.3)
            return self.inner.decide(snap)

    def factory(config, workflows):
        engine, request = sim_engine_factory(config, workflows)
        engine.policy = SlowOverWorkflows(engine.policy)
        return engine, request

    handle = start_server_in_thread(ServerConfig(time_scale=100.0, workflows=("chain3",), api_keys=("k1", "k2")),
                                    engine_factory=factory)

    def call(key: str, task: str) -> int:
        body = {**_hi(), "topas": {"task_id": task, "stage": "s1", "agent": "a", "workflow": "chain3"}}
        return httpx.post(handle.base_url + "/v1/chat/completions", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {key}"}).status_code

    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(call, "k1", "t1")
            assert iterating.wait(10)
            second = pool.submit(call, "k2", "t2")
            assert (first.result(), second.result()) == (200, 200)
        assert httpx.get(handle.base_url + "/health", timeout=5).json()["status"] == "ok"
    finally:
        handle.stop()
