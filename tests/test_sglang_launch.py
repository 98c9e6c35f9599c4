"""Real SGLang serving with the Topas plugin: `topas serve --engine sglang --policy topas`.

One server per module (module-scoped fixture; a start takes ~30-80 s on 2 shared cores).
On a machine without CUDA it serves on CPU (`--device cpu`, SGLANG_USE_CPU_ENGINE=1, the
test-only `sgl_kernel` stand-in from tests/sglang_cpu); with CUDA the same tests run on the
GPU. Labelled chat calls go through the real HTTP server; what the scheduler did is read
from the plugin's JSONL decision log.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
pytest.importorskip("sglang")

import httpx  # noqa: E402
from sglang_cpu import serving  # noqa: E402

from topas_agents.realbench.client import run_tasks  # noqa: E402

KV_TOKENS = 3000  # small pool: three ~160-token prefixes plus a flood request fill it


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with serving.module_server(tmp_path_factory.mktemp("sglang-topas"), "topas", kv_tokens=KV_TOKENS) as srv:
        yield srv


def test_every_sglang_process_loads_the_plugin(server: Any) -> None:
    loaded = server.records("loaded")
    assert {r["policy"] for r in loaded} == {"topas"} and {r["hooks"] for r in loaded} == {13}
    processes = {r["process"] for r in loaded}
    assert "MainProcess" in processes and len(processes) >= 3, processes  # HTTP, scheduler, detokenizer
    text = server.text()
    assert "Failed to apply hooks" not in text and "topas plugin:" not in text


def test_concurrent_labelled_tasks_complete_through_the_policy(server: Any) -> None:
    plans = serving.plans(server.workflow, server.tokens, n_tasks=3, output_tokens=16, prefix="basic")
    results = asyncio.run(run_tasks(server.base_url, "model", server.workflow, plans, timeout_s=300))
    assert len(results) == 3
    for task in results:
        assert [c.stage for c in task.calls] == ["s1", "s2", "s3"]
        assert all(c.completion_tokens == c.expected_tokens == 16 for c in task.calls), task
    time.sleep(1.0)  # let the scheduler notice the last finish
    records = server.records()
    ran, _ = serving.check_decisions(records)
    assert ran >= 9
    ends = {(r["task"], r["stage"]): r for r in records if r["event"] == "end" and r["task"].startswith("basic")}
    assert len(ends) == 9 and all(r["ok"] and r["output_tokens"] == 16 for r in ends.values()), ends
    assert not server.records("error")


def test_pinned_prefixes_stay_in_the_radix_tree_and_evicted_ones_go(server: Any) -> None:
    plans = serving.plans(server.workflow, server.tokens, n_tasks=1, output_tokens=4, prefix="pin")
    asyncio.run(run_tasks(server.base_url, "model", server.workflow, plans, timeout_s=300))
    time.sleep(1.0)
    prefix = serving.prefix_len(server.tokens, "a")
    pinned, evicted, last = serving.pins_after_flood(server, server.tokens, KV_TOKENS, prefix)
    assert evicted, "the flood call did not make the policy evict a prefix"
    assert last["kv"]["pinned"] >= len(pinned) * (prefix - 8), last["kv"]
    for agent in sorted(pinned):  # topas may keep none: it chooses what to evict
        assert serving.probe_cached(server, agent) >= serving.prefix_len(server.tokens, agent) - 1, agent  # the pin held it on device
    for agent in sorted(evicted):
        assert serving.probe_cached(server, agent) < serving.prefix_len(server.tokens, agent) - 1, agent  # prefix_out, then evicted


def test_client_disconnect_frees_its_kv(server: Any) -> None:
    body = {"model": "model", "max_tokens": 1500, "ignore_eos": True, "stream": True,
            "messages": [{"role": "user", "content": "long answer please"}],
            "topas": {"task_id": "gone", "stage": "s1", "agent": "a", "workflow": "tiny3"}}
    with httpx.Client(timeout=120) as client, client.stream("POST", f"{server.base_url}/chat/completions",
                                                            json=body) as resp:
        assert resp.status_code == 200
        for n, _ in enumerate(resp.iter_lines(), 1):
            if n >= 5:
                break  # leaving the block closes the connection mid-generation
    deadline = time.monotonic() + 60
    end = None
    tick_tokens = 0
    while end is None and time.monotonic() < deadline:
        # the scheduler reports an ended request at its next step: give it one (a 1-token call,
        # which may itself still hold its KV when the end is recorded: its size is measured)
        tick = httpx.post(f"{server.base_url}/chat/completions", timeout=60,
                          json={"model": "model", "max_tokens": 1, "messages": [{"role": "user", "content": "tick"}]})
        usage = tick.json()["usage"]
        tick_tokens = usage["prompt_tokens"] + usage["completion_tokens"]
        end = next((r for r in server.records("end") if r["task"] == "gone"), None)
    assert end is not None, "the disconnected request never ended"
    assert not end["ok"] and end["reason"] == "FINISH_ABORT" and end["output_tokens"] < 1500, end
    kv = end["kv"]
    # Nothing is held by the disconnected request any more: free + evictable cache + locked
    # pins = the pool (pinned prefixes share their first tokens in the tree, so locked <=
    # pinned), except what the tick that drove this step may still hold (its own KV, outside
    # the tree or locked in it). The disconnected request held its prompt plus >= 5 tokens more.
    held = kv["pool"] - kv["available"] - kv["evictable"] - kv["protected"]
    locked_beyond_pins = max(0, kv["protected"] - kv["pinned"])
    assert held >= 0 and held + locked_beyond_pins <= tick_tokens, (kv, tick_tokens)


def _served_model(server: Any) -> str:
    """The Responses API checks the model name (chat completions take any)."""
    return httpx.get(f"{server.base_url}/models", timeout=30).json()["data"][0]["id"]


def _ended(server: Any, task: str, limit_s: float = 60.0) -> dict | None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        end = next((r for r in server.records("end") if r["task"] == task), None)
        if end is not None:
            return end
        time.sleep(0.5)
    return None


@pytest.mark.parametrize("how", ["body", "headers", "metadata", "stream"])
def test_responses_api_calls_reach_the_scheduler_labelled(server: Any, how: str) -> None:
    # before: /v1/responses built its engine request without the chat conversion the plugin
    # hooks, and its request model dropped the `topas` field: every call ran unlabelled
    label = {"task_id": f"resp-{how}", "stage": "s1", "agent": "a", "workflow": "tiny3"}
    body: dict[str, Any] = {"model": _served_model(server), "input": "say something", "max_output_tokens": 6}
    headers = {}
    if how == "headers":
        headers = {"X-Topas-Task-Id": label["task_id"], "X-Topas-Stage": "s1", "X-Topas-Agent": "a",
                   "X-Topas-Workflow": "tiny3"}
    elif how == "metadata":  # what the cluster front sends through smg (labels.METADATA_KEYS)
        body["metadata"] = {f"topas_{k}": v for k, v in label.items()}
    else:
        body["topas"] = label
    if how == "stream":
        body["stream"] = True
        with httpx.stream("POST", f"{server.base_url}/responses", json=body, timeout=120) as resp:
            assert resp.status_code == 200
            events = [line for line in resp.iter_lines() if line.startswith("event:")]
        assert events[-1] in ("event: response.completed", "event: response.incomplete"), events
    else:
        resp = httpx.post(f"{server.base_url}/responses", json=body, headers=headers, timeout=120)
        assert resp.status_code == 200, resp.text
        # "incomplete": max_output_tokens reached, as asked
        assert resp.json()["status"] in ("completed", "incomplete") and "topas" not in resp.json()
    end = _ended(server, label["task_id"])
    assert end is not None, "the scheduler never saw a request of the labelled task"
    assert end["ok"] and end["stage"] == "s1", end


def test_a_malformed_label_on_the_responses_api_is_a_400_naming_the_field(server: Any) -> None:
    body = {"model": _served_model(server), "input": "hi", "max_output_tokens": 2,
            "topas": {"task_id": "bad", "stage": "nope", "agent": "a", "workflow": "tiny3"}}
    resp = httpx.post(f"{server.base_url}/responses", json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    assert "topas label field 'stage'" in resp.text and "nope" in resp.text
