"""KVFlow peer: steps-to-execution, eviction order, prefetch, load-skipping, and whole runs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topas_agents.costmodel import load_profile
from topas_agents.policies import PEERS, make_policy
from topas_agents.policies.kvflow import KVFlow, steps_to_execution, task_stage_steps
from topas_agents.sim import make_trace, simulate
from topas_agents.snapshot import PrefixView, RequestView, Snapshot, TaskView, check_decision
from topas_agents.workflow import load_workflow

PROFILE = load_profile()
CHAIN = load_workflow("chain3")  # s1 (a) -> s2 (b) -> s3 (c)
DAG4 = load_workflow("dag4")  # s_a (a) -> {s_b (b), s_c (c)} -> s_d (d)


def rv(rid: str, agent: str, *, arrival: float = 0.0, inp: int = 100, max_new: int = 100, prefix: int = 1000,
       workflow: str | None = None, stage: str = "s", task: str = "t") -> RequestView:
    return RequestView(rid, task, workflow, stage, agent, prefix, inp, max_new, 0, arrival, 0.0)


def pv(agent: str, tokens: int = 1000, location: str = "gpu", last_used: float = 0.0, running: int = 0) -> PrefixView:
    return PrefixView(agent, tokens, location, last_used, running)  # type: ignore[arg-type]


def task(tid: str, wf: str, done: tuple[str, ...] = (), active: tuple[str, ...] = ()) -> TaskView:
    return TaskView(tid, wf, 0.0, frozenset(done), tuple((s, 0.0) for s in active), 0.0)


def snap(waiting=(), running=(), prefixes=(), tasks=(), budget: int = 10_000, workflows=None) -> Snapshot:
    return Snapshot(now=50.0, kv_budget=budget, waiting=tuple(waiting), running=tuple(running),
                    prefixes=tuple(prefixes), tasks=tuple(tasks), profile=PROFILE,
                    workflows=workflows if workflows is not None else {"chain3": CHAIN})


def test_kvflow_is_a_registered_peer() -> None:
    assert "kvflow" in PEERS and isinstance(make_policy("kvflow"), KVFlow)
    assert make_policy("kvflow").decide(snap(workflows={})).empty


# ---------------------------------------------------------------------------- steps-to-execution


def test_stage_steps_wait_for_the_slowest_predecessor() -> None:
    fresh = task_stage_steps(DAG4, task("t", "dag4"))
    assert fresh == {"s_a": 0, "s_b": 1, "s_c": 1, "s_d": 2}
    one_branch_done = task_stage_steps(DAG4, task("t", "dag4", done=("s_a", "s_b"), active=("s_c",)))
    assert one_branch_done == {"s_c": 0, "s_d": 1}


def test_agent_steps_take_the_minimum_over_tasks_and_future_arrivals() -> None:
    s = snap(tasks=[task("t1", "chain3", done=("s1",), active=("s2",))], prefixes=[pv("x", location="cpu")])
    steps = steps_to_execution(s)
    # a: only future tasks (root, 1 step); b: active in t1; c: next in t1; x: nobody.
    assert steps == {"a": 1, "b": 0, "c": 1}
    assert math.isinf(steps.get("x", math.inf))
    waiting = snap(waiting=[rv("w", "c")], tasks=[task("t1", "chain3", done=("s1",), active=("s2",))])
    assert steps_to_execution(waiting)["c"] == 0  # a waiting request makes its agent 0 steps away


# ---------------------------------------------------------------------------- eviction order


def eviction_case(policy_name: str) -> tuple[str, ...]:
    # c is next in the live task (1 step), "far" is used by no task (infinitely far) but was
    # used more recently, so LRU would evict c. The request needs one eviction.
    prefixes = [pv("c", 3000, last_used=1.0), pv("far", 3000, last_used=9.0), pv("b", 3000, running=1, last_used=0.0),
                pv("w", 1000, "none")]
    s = snap(waiting=[rv("r", "w", prefix=1000, inp=1500, max_new=1500)],
             running=[rv("run", "b", inp=500, max_new=500, workflow="chain3", stage="s2", task="t1")],
             prefixes=prefixes, tasks=[task("t1", "chain3", done=("s1",), active=("s2",))], budget=13_000)
    d = make_policy(policy_name).decide(s)
    check_decision(s, d)
    assert d.admit == ("r",)
    return d.prefix_out


def test_eviction_takes_the_farthest_agent_not_the_least_recent() -> None:
    assert eviction_case("lpm") == ("c",)  # LRU
    assert eviction_case("kvflow") == ("far",)  # steps-to-execution


def test_agents_with_waiting_requests_are_evicted_last() -> None:
    # hot's prefix is loading for its waiting request h (skipped until it lands, so not
    # pinned by an admission); starting the load of host's prefix for x needs 1000 tokens.
    # LRU would drop hot (least recent); KVFlow drops idle (no task will use it).
    prefixes = [pv("hot", 4000, "loading", last_used=0.0), pv("idle", 4000, last_used=9.0), pv("host", 2000, "cpu")]
    s = snap(waiting=[rv("h", "hot", prefix=4000), rv("x", "host", prefix=2000, arrival=1.0)],
             prefixes=prefixes, budget=9_000, workflows={})
    d = KVFlow().decide(s)
    check_decision(s, d)
    assert (d.admit, d.prefix_in, d.prefix_out) == ((), ("host",), ("idle",))


# ---------------------------------------------------------------------------- prefetch and skipping


def test_next_step_prefix_in_the_host_tier_is_prefetched_into_free_kv() -> None:
    s = snap(running=[rv("run", "b", workflow="chain3", stage="s2", task="t1")],
             prefixes=[pv("b", 1000, running=1), pv("c", 2000, "cpu"), pv("a", 2000, "cpu")],
             tasks=[task("t1", "chain3", done=("s1",), active=("s2",))], budget=10_000)
    d = KVFlow().decide(s)
    check_decision(s, d)
    # c is next for t1 (1 step) and a is the root of future tasks (1 step): both fit.
    assert d.prefix_in == ("a", "c") and d.admit == ()


def test_no_prefetch_without_a_host_copy_or_without_room() -> None:
    base = dict(running=[rv("run", "b", workflow="chain3", stage="s2", task="t1")],
                tasks=[task("t1", "chain3", done=("s1",), active=("s2",))])
    dropped = snap(prefixes=[pv("b", 1000, running=1), pv("c", 2000, "none")], budget=10_000, **base)
    assert KVFlow().decide(dropped).empty  # no host tier: KVFlow never recomputes ahead of time
    full = snap(prefixes=[pv("b", 1000, running=1), pv("c", 2000, "cpu")], budget=2_900, **base)
    assert KVFlow().decide(full).empty  # 1700 free < 2000
    # A blocked admission walk keeps the free KV for the queue: no prefetch.
    blocked = snap(waiting=[rv("big", "b", inp=4000, max_new=4000)],
                   prefixes=[pv("b", 1000, running=1), pv("c", 2000, "cpu")], budget=8_000, **base)
    assert KVFlow().decide(blocked).empty


def test_requests_whose_prefix_is_loading_are_skipped_and_host_copies_loaded_first() -> None:
    s = snap(waiting=[rv("l", "load", arrival=0.0), rv("h", "host", arrival=1.0), rv("g", "gpu", arrival=2.0)],
             prefixes=[pv("load", 1000, "loading"), pv("host", 1000, "cpu"), pv("gpu", 1000)],
             budget=10_000, workflows={})
    d = KVFlow().decide(s)
    check_decision(s, d)
    assert d.admit == ("g",)  # l waits for its transfer, h for the one this decision starts
    assert d.prefix_in == ("host",)
    assert make_policy("lpm").decide(s).admit == ("l", "g", "h")  # stock LPM holds KV while loading


# ---------------------------------------------------------------------------- whole runs


@pytest.mark.parametrize("host_tier", [True, False])
@pytest.mark.parametrize("workload", ["chain3", "dag4", "metagpt-tl"])
def test_kvflow_runs_every_task_with_valid_decisions(workload: str, host_tier: bool) -> None:
    from topas_agents.bench.capacity import capacity_rps

    wf = load_workflow(workload)
    trace = make_trace(wf, 25, 0.5 * capacity_rps(wf, PROFILE), 3)
    res = simulate(trace, make_policy("kvflow"), PROFILE, host_tier=host_tier, check=True)
    assert len(res.tasks) == 25
    if not host_tier:
        assert res.stats.prefix_swaps_in == 0 and res.stats.prefix_swaps_out == 0


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_random_snapshots_give_valid_decisions_that_evict_farthest_first(data: st.DataObject) -> None:
    agents = ["a", "b", "c", "x", "y"]
    locs = data.draw(st.lists(st.sampled_from(["gpu", "loading", "cpu", "none"]), min_size=5, max_size=5))
    sizes = data.draw(st.lists(st.integers(0, 3000), min_size=5, max_size=5))
    prefixes = [pv(a, n, loc, last_used=float(i)) for i, (a, n, loc) in enumerate(zip(agents, sizes, locs, strict=True))]
    waiting = [rv(f"w{i}", data.draw(st.sampled_from(agents)), arrival=float(i), prefix=0,
                  inp=data.draw(st.integers(1, 2000)), max_new=data.draw(st.integers(1, 2000)),
                  workflow="chain3", stage=data.draw(st.sampled_from(["s1", "s2", "s3"])))
               for i in range(data.draw(st.integers(0, 6)))]
    done = data.draw(st.sampled_from([(), ("s1",), ("s1", "s2")]))
    tasks = [task("t1", "chain3", done=done)]
    resident = sum(p.tokens for p in prefixes if p.on_gpu)
    s = snap(waiting=waiting, prefixes=prefixes, tasks=tasks, budget=resident + data.draw(st.integers(0, 6000)))
    policy = KVFlow()
    d = policy.decide(s)
    check_decision(s, d)
    steps = policy.last_steps
    admitted = {r.agent for r in s.waiting if r.rid in d.admit} | set(d.prefix_in)
    kept = [p.agent for p in s.prefixes if p.on_gpu and p.agent not in d.prefix_out and p.agent not in admitted]
    for gone in d.prefix_out:  # nothing evicted while a strictly farther unpinned prefix stays
        assert all(steps.get(k, math.inf) <= steps.get(gone, math.inf) for k in kept), (gone, kept, steps)
    assert not set(d.admit) & {r.rid for r in s.waiting if s.prefix(r.agent).location in ("loading", "cpu")}
