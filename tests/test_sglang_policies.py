"""Every paper baseline as the scheduler of a real SGLang server (CPU here, GPU where present).

One server per policy (module-scoped, parametrized fixture: pytest runs all tests of one
policy before starting the next). Each policy drives three concurrent labelled workflow
tasks through the real HTTP server. Two checks need particular settings and run on one
policy each: LRU pinning under eviction pressure (`fcfs`, a greedy LRU evictor, so which
prefix goes is predictable) and retraction under real KV pressure (`spf` planning for ten
times the pool, so SGLang runs out of KV during decode and retracts).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
pytest.importorskip("sglang")

from sglang_cpu import serving  # noqa: E402

from topas_agents.realbench.client import run_tasks  # noqa: E402

KV_TOKENS = 3000
# spf plans for 10x the pool, and SGLang's own admission estimate is made optimistic
# (`--schedule-conservativeness`: running requests reserve 3.5% of their remaining output), so
# both admit three 500-token s1 calls at once: ~3 x 575 tokens + up to ~455 pinned prefix
# tokens against a 1400-token pool, so decode runs out of KV for real. (SGLang checks a new
# request's full output against the pool: 1400 is the size at which all three get in.)
PRESSURE = {"kv_tokens": 1400, "kv_budget": 10_000, "extra_args": ["--schedule-conservativeness", "0.05"]}
PRESSURE_OUTPUT = 500
POLICIES = ("fcfs", "lpm", "parrot", "las", "spf")


@pytest.fixture(scope="module", params=POLICIES)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    policy = request.param
    sizes = PRESSURE if policy == "spf" else {"kv_tokens": KV_TOKENS}
    with serving.module_server(tmp_path_factory.mktemp(f"sglang-{policy}"), policy, **sizes) as srv:
        srv.policy, srv.kv_tokens = policy, sizes["kv_tokens"]
        yield srv


def test_policy_serves_concurrent_workflow_tasks(server: Any) -> None:
    plans = serving.plans(server.workflow, server.tokens, n_tasks=3, output_tokens=8, prefix="basic")
    results = asyncio.run(run_tasks(server.base_url, "model", server.workflow, plans, timeout_s=300))
    for task in results:
        assert [c.stage for c in task.calls] == ["s1", "s2", "s3"]
        assert all(c.completion_tokens == c.expected_tokens == 8 for c in task.calls), task
    time.sleep(1.0)
    records = server.records()
    assert {r["policy"] for r in server.records("loaded")} == {server.policy}
    ran, _ = serving.check_decisions(records)
    assert ran >= 9
    ends = [r for r in records if r["event"] == "end" and str(r["task"]).startswith("basic")]
    assert len(ends) == 9 and all(r["ok"] and r["output_tokens"] == 8 for r in ends)
    assert not server.records("error")


@pytest.mark.parametrize("server", ["fcfs"], indirect=True)
def test_lru_pins_hold_prefixes_and_evicted_ones_leave_the_tree(server: Any) -> None:
    plans = serving.plans(server.workflow, server.tokens, n_tasks=1, output_tokens=4, prefix="pin")
    asyncio.run(run_tasks(server.base_url, "model", server.workflow, plans, timeout_s=300))
    time.sleep(1.0)
    prefix = serving.prefix_len(server.tokens, "a")
    pinned, evicted, last = serving.pins_after_flood(server, server.tokens, server.kv_tokens, prefix)
    assert evicted and pinned, last  # LRU: the oldest prefix (a) goes, the others stay pinned
    assert "a" in evicted, last
    for agent in sorted(pinned):
        assert serving.probe_cached(server, agent) >= serving.prefix_len(server.tokens, agent) - 1, agent
    for agent in sorted(evicted):
        assert serving.probe_cached(server, agent) < serving.prefix_len(server.tokens, agent) - 1, agent


@pytest.mark.parametrize("server", ["spf"], indirect=True)
def test_kv_pressure_retracts_through_sglang_and_requests_still_complete(server: Any) -> None:
    warm = serving.plans(server.workflow, server.tokens, n_tasks=1, output_tokens=4, prefix="warm")
    asyncio.run(run_tasks(server.base_url, "model", server.workflow, warm, timeout_s=300))  # pins a, b, c
    # min_tokens, not ignore_eos: with ignore_eos SGLang reserves every output token up front
    plans = serving.plans(server.workflow, server.tokens, n_tasks=3, output_tokens={"s1": PRESSURE_OUTPUT},
                          prefix="press",
                          ignore_eos=False)
    results = asyncio.run(run_tasks(server.base_url, "model", server.workflow, plans, timeout_s=400))
    for task in results:  # every call answered with exactly its fixed output length
        assert all(c.completion_tokens == c.expected_tokens for c in task.calls), task
    time.sleep(1.0)
    retracted = {r["rid"] for r in server.records("retracted") if r["by"] == "sglang"}
    assert retracted, "no retraction: the pool was not under pressure"
    assert "KV cache pool is full. Retract requests." in server.text()
    ends = {r["rid"]: r for r in server.records("end")}
    for rid in retracted:  # recomputed after the retraction, and finished in full
        assert ends[rid]["ok"] and ends[rid]["retractions"] >= 1 and ends[rid]["output_tokens"] == PRESSURE_OUTPUT, ends[rid]
    serving.check_decisions(server.records())
    assert not server.records("error")
