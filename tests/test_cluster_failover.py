"""Failover with smg and three sim replicas on loopback: a replica is SIGKILLed while its
tasks are streaming (chat completions, or the Responses API); every call still completes at
the client with its whole text once, the tasks re-home to live replicas and finish there,
rebuilt from their labels."""

from __future__ import annotations

import importlib.util
import threading

import httpx
import openai
import pytest

from topas_agents import label
from topas_agents.cluster.stream_retry import ResponsesProgress, ResumingStream
from topas_agents.integrations.openai_client import labelled

pytestmark = pytest.mark.skipif(importlib.util.find_spec("smg") is None, reason="needs the [cluster] extra (smg)")

TASKS = 6
STAGES = (("s1", "a"), ("s2", "b"), ("s3", "c"))
# time scale 5: a chain3 stage (256 sampled output tokens) streams for about 2 s, so the kill
# lands while the victim is still generating (at 20 its bytes could all be buffered already)
SERVE_ARGS = ("--workflow", "chain3", "--time-scale", "5", "--log-level", "warning")


def _prompt(task: str, stage: str) -> list[dict]:
    return [{"role": "user", "content": f"task {task} stage {stage} please answer"}]


def _in_flight_by_replica(urls) -> list[int]:
    return [httpx.get(f"{u}/v1/topas/stats").json()["requests"]["in_flight"] for u in urls]


class _Api:
    """One OpenAI endpoint as the test drives it: chat completions or the Responses API."""

    def __init__(self, name: str) -> None:
        self.name = name

    def call(self, client: openai.OpenAI, task: str, stage: str, **kwargs):
        if self.name == "chat":
            return client.chat.completions.create(model="m", messages=_prompt(task, stage), **kwargs)
        return client.responses.create(model="m", input=_prompt(task, stage), **kwargs)

    def short(self) -> dict:
        """A 4-token cap on the reply."""
        return {"max_tokens": 4} if self.name == "chat" else {"max_output_tokens": 4}

    def text(self, reply) -> str:
        return reply.choices[0].message.content if self.name == "chat" else reply.output_text

    def pieces(self, chunk) -> list[str]:
        """The text a stream chunk (chat) or event (Responses) delivers."""
        if self.name == "chat":
            return [c.delta.content or "" for c in chunk.choices]
        return [chunk.delta] if chunk.type == "response.output_text.delta" else []

    def progress(self):
        return None if self.name == "chat" else ResponsesProgress


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_replica_death_loses_no_call(api):
    from topas_agents.server.cluster.config import RestartPolicy
    from topas_agents.server.cluster.launcher import free_base_port, run_replicas

    if api == "responses" and not hasattr(openai.OpenAI(api_key="x"), "responses"):
        pytest.skip(f"openai {openai.__version__} has no Responses API")
    ep = _Api(api)
    # no restart here: this test is about the two live replicas taking over (restarts are
    # tested in test_cluster_restart.py)
    with run_replicas(3, port=free_base_port(6), serve_args=SERVE_ARGS,
                      restart=RestartPolicy(enabled=False)) as cluster:
        urls = cluster.config.replica_urls
        client = labelled(openai.OpenAI(base_url=cluster.url, api_key="unused", timeout=30))
        bare = openai.OpenAI(base_url=cluster.url, api_key="unused", timeout=30, max_retries=0)
        # the echo responder's text depends on the prompt alone: the reference for each call
        expected = {(f"fo-{t}", s): ep.text(ep.call(client.raw, f"fo-{t}", s)) for t in range(TASKS) for s, _ in STAGES}
        started = threading.Barrier(TASKS + 1)
        resume = threading.Event()
        got: dict[tuple[str, str], str] = {}
        resumed: list[int] = []
        errors: list[BaseException] = []

        def consume(stream: ResumingStream, task: str, stage: str, pause: bool) -> None:
            parts: list[str] = []
            for chunk in stream:
                parts.extend(ep.pieces(chunk))
                if pause and len([p for p in parts if p]) == 2:  # mid-stream: wait for the kill
                    pause = False
                    started.wait(30)
                    resume.wait(30)
            got[(task, stage)] = "".join(parts)
            resumed.append(stream.resumed)

        def run_task(task: str) -> None:
            try:
                for k, (stage, agent) in enumerate(STAGES):
                    if k == 0:  # the wrapper itself resumes a stream cut by the kill
                        with label(task_id=task, stage=stage, agent=agent, workflow="chain3"):
                            stream = ep.call(client, task, stage, stream=True)
                            assert isinstance(stream, ResumingStream)
                            consume(stream, task, stage, pause=True)
                    else:  # later stages: no client retry at all; the gateway must re-home them
                        lab = {"task_id": task, "stage": stage, "agent": agent, "workflow": "chain3"}
                        raw = ep.call(bare, task, stage, stream=True, extra_body={"topas": lab})
                        consume(ResumingStream(raw, lambda: None, attempts=0, progress=ep.progress()),
                                task, stage, pause=False)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=run_task, args=(f"fo-{t}",)) for t in range(TASKS)]
        for th in threads:
            th.start()
        try:
            started.wait(30)
        except threading.BrokenBarrierError:
            raise AssertionError(f"tasks did not all start: {errors}") from None
        busy = _in_flight_by_replica(urls)
        victim = max(range(3), key=lambda i: busy[i])
        assert busy[victim] > 0
        cluster.replicas[victim].kill()
        resume.set()
        for th in threads:
            th.join(60)

        assert not errors, errors
        assert got == expected  # every call whole, no text twice
        assert sum(resumed) >= busy[victim]  # the killed streams were re-opened
        view = httpx.get(cluster.base_url + "/v1/topas/stats").json()
        assert view["cluster"]["replicas_up"] == 2
        live = [u for i, u in enumerate(urls) if i != victim]
        finished = {}
        for u in live:
            for item in httpx.get(f"{u}/v1/topas/stats").json()["tasks"]["items"]:
                if item["task_id"].startswith("fo-") and item["done"]:
                    finished[item["task_id"]] = item
        assert sorted(finished) == [f"fo-{t}" for t in range(TASKS)]
        for item in finished.values():  # rebuilt from labels: the DAG, every stage done
            assert item["workflow"] == "chain3" and item["workflow_registered"]
            assert all(st["done"] for st in item["stages"].values())
        # new tasks after the death, without client retries: none is lost to the dead replica
        for t in range(6):
            lab = {"task_id": f"after-{t}", "stage": "s1", "agent": "a", "workflow": "chain3"}
            assert ep.text(ep.call(bare, "x", "s1", extra_body={"topas": lab}, **ep.short()))
    assert all(not child.alive() for child in cluster.children)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may be slow to reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_killed_launcher_leaves_no_orphans(tmp_path):
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from topas_agents.server.cluster.launcher import free_base_port

    script = ("import json, sys, time\n"
              "from topas_agents.server.cluster.launcher import run_replicas\n"
              f"c = run_replicas(2, port={free_base_port(5)}, serve_args=('--log-level', 'warning'))\n"
              "print(json.dumps([ch.pid for ch in c.children]), flush=True)\n"
              "time.sleep(120)\n")
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(launcher.stdout.readline())
        assert len(pids) == 3 and all(_running(p) for p in pids)
    finally:
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(10)
    deadline = time.monotonic() + 20
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if _running(p)]
    for p in left:  # never leave them behind, even when the assertion fails
        os.kill(p, signal.SIGKILL)
    assert not left
