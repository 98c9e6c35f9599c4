"""Baseline orders, greedy admission with LRU eviction, and the incremental queue."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topas_agents.costmodel import load_profile
from topas_agents.errors import ConfigError
from topas_agents.policies import BASELINES, PEERS, make_policy
from topas_agents.policies.baselines import LPM, SPF, AutellixLAS, LPMGated, OrderedGreedy
from topas_agents.policies.greedy import KVLedger, SortedWaiting, greedy_admit
from topas_agents.snapshot import PrefixView, RequestView, Snapshot, TaskView, check_decision
from topas_agents.workflow import load_workflow

PROFILE = load_profile()


def rv(rid: str, agent: str = "a", *, arrival: float = 0.0, task: str = "t", task_arrival: float = 0.0,
       inp: int = 100, max_new: int = 100, prefix: int = 1000, workflow: str | None = None,
       stage: str = "s") -> RequestView:
    return RequestView(rid, task, workflow, stage, agent, prefix, inp, max_new, 0, arrival, task_arrival)


def pv(agent: str, tokens: int = 1000, location: str = "gpu", last_used: float = 0.0, running: int = 0) -> PrefixView:
    return PrefixView(agent, tokens, location, last_used, running)  # type: ignore[arg-type]


def snap(waiting=(), running=(), prefixes=(), tasks=(), budget: int = 10_000, workflows=None) -> Snapshot:
    return Snapshot(now=100.0, kv_budget=budget, waiting=tuple(waiting), running=tuple(running),
                    prefixes=tuple(prefixes), tasks=tuple(tasks), profile=PROFILE,
                    workflows=workflows or {})


# ---------------------------------------------------------------------------- registry


@pytest.mark.parametrize("name", BASELINES)
def test_baselines_are_registered_and_constructible(name: str) -> None:
    p = make_policy(name)
    assert p.name == name and isinstance(p, OrderedGreedy)
    assert p.decide(snap()).empty


# ---------------------------------------------------------------------------- greedy + LRU


@pytest.mark.parametrize(("name", "target", "match"), [
    # before: "a:b:c" and a missing module were accepted and failed in make_policy with a
    # bare ValueError / ModuleNotFoundError, and a built-in name was silently taken over
    ("x-bad", "a:b:c", "module:factory"),
    ("fcfs", "topas_agents.policies.baselines:LPM", "built in"),
    (5, "topas_agents.policies.baselines:LPM", "policy name"),
    ("", "topas_agents.policies.baselines:LPM", "policy name"),
])
def test_register_policy_refuses_bad_names_and_targets(name, target, match) -> None:
    from topas_agents.policies import register_policy
    with pytest.raises(ConfigError, match=match):
        register_policy(name, target)
    assert type(make_policy("fcfs")).__name__ == "FCFS"


def test_make_policy_errors_are_config_errors() -> None:
    from topas_agents.policies import register_policy
    register_policy("x-unresolvable", "no_such_module_for_tests:make")
    with pytest.raises(ConfigError, match="module 'no_such_module_for_tests' is missing"):
        make_policy("x-unresolvable")
    for options in ({1: 2}, "x=1", ["a"]):  # TypeError / "no option '1'" before
        with pytest.raises(ConfigError, match="options must be a mapping"):
            make_policy("topas-core", options)


def test_head_of_line_blocks_smaller_requests_behind() -> None:
    s = snap(waiting=[rv("big", inp=5000, max_new=5000, arrival=0), rv("small", arrival=1)],
             prefixes=[pv("a")], budget=8000)
    assert make_policy("fcfs").decide(s).empty
    skip = greedy_admit(s, s.waiting, head_of_line=False)
    assert skip.admit == ("small",)


def test_lru_eviction_takes_oldest_unpinned_prefixes_only_as_needed() -> None:
    prefixes = [pv("old", 2000, last_used=1), pv("mid", 2000, last_used=2), pv("pinned", 2000, last_used=0, running=1),
                pv("new", 2000, last_used=3)]
    running = [rv("r0", "pinned", inp=500, max_new=500)]
    # used = 4 x 2000 + 1000 = 9000 of 12000; the request needs 2000 (prefix) + 2500 = 4500
    s = snap(waiting=[rv("w", "x", prefix=2000, inp=1500, max_new=1000)], running=running,
             prefixes=[*prefixes, pv("x", 2000, "none")], budget=12_000)
    d = make_policy("fcfs").decide(s)
    assert d.admit == ("w",) and d.prefix_out == ("old",)  # 3000 free + 2000 from "old" suffices
    check_decision(s, d)


def test_no_eviction_when_the_request_cannot_fit_anyway() -> None:
    s = snap(waiting=[rv("w", "x", prefix=2000, inp=5000, max_new=3000)],
             prefixes=[pv("old", 2000), pv("x", 2000, "cpu")], running=[], budget=9000)
    assert make_policy("fcfs").decide(s).empty


def test_prefix_evicted_then_needed_again_is_kept() -> None:
    ledger = KVLedger(snap(prefixes=[pv("a", 1000), pv("b", 1000)], budget=3000))
    ledger.evict("a")
    assert ledger.try_admit(rv("r", "a", inp=100, max_new=100))
    d = ledger.decision()
    assert d.prefix_out == () and d.admit == ("r",)


def test_admitting_requests_of_a_cached_agent_needs_no_prefix_budget() -> None:
    s = snap(waiting=[rv(f"r{i}", arrival=i) for i in range(5)], prefixes=[pv("a", 5000)], budget=6000)
    d = make_policy("fcfs").decide(s)
    assert d.admit == ("r0", "r1", "r2", "r3", "r4")  # 5000 + 5 x 200 = 6000
    check_decision(s, d)


# ---------------------------------------------------------------------------- orders


def admitted_order(policy: OrderedGreedy, s: Snapshot) -> tuple[str, ...]:
    return policy.decide(s).admit


def test_fcfs_orders_by_arrival_then_rid() -> None:
    s = snap(waiting=[rv("c", arrival=2), rv("b", arrival=1), rv("a", arrival=1)], prefixes=[pv("a")])
    assert admitted_order(make_policy("fcfs"), s) == ("a", "b", "c")


def test_parrot_orders_by_task_arrival() -> None:
    s = snap(waiting=[rv("x", arrival=1, task="late", task_arrival=5), rv("y", arrival=9, task="early", task_arrival=0)],
             prefixes=[pv("a")])
    assert admitted_order(make_policy("parrot"), s) == ("y", "x")


def test_las_orders_by_task_attained_service() -> None:
    tasks = [TaskView("busy", None, 0, frozenset(), (), 30.0), TaskView("fresh", None, 1, frozenset(), (), 0.5)]
    s = snap(waiting=[rv("b", arrival=0, task="busy"), rv("f", arrival=5, task="fresh"), rv("u", arrival=6, task="?")],
             prefixes=[pv("a")], tasks=tasks)
    assert admitted_order(make_policy("las"), s) == ("u", "f", "b")  # unknown task: 0 attained


def test_spf_orders_deepest_stage_first() -> None:
    wf = load_workflow("dag4")
    reqs = [rv("root", arrival=0, workflow="dag4", stage="s_a"), rv("mid", arrival=1, workflow="dag4", stage="s_b"),
            rv("join", arrival=2, workflow="dag4", stage="s_d"), rv("unl", arrival=-1)]
    s = snap(waiting=reqs, prefixes=[pv("a")], workflows={"dag4": wf})
    assert admitted_order(make_policy("spf"), s) == ("join", "mid", "unl", "root")


def test_lpm_never_falls_back_to_fcfs_above_128_waiting() -> None:
    # 150 early requests of an uncached agent, then 150 later requests of the cached one.
    waiting = [rv(f"cold{i:03d}", "cold", arrival=i) for i in range(150)]
    waiting += [rv(f"hot{i:03d}", "hot", arrival=1000 + i) for i in range(150)]
    s = snap(waiting=waiting, prefixes=[pv("hot", 1000), pv("cold", 1000, "none")], budget=1000 + 10 * 200)
    lpm = admitted_order(make_policy("lpm"), s)
    assert lpm == tuple(f"hot{i:03d}" for i in range(10))
    fcfs = make_policy("fcfs").decide(s)
    assert fcfs.admit[0] == "cold000" and fcfs.prefix_out == ("hot",)


def test_lpm_prefers_the_longest_cached_prefix() -> None:
    s = snap(waiting=[rv("s", "short", arrival=0), rv("l", "long", arrival=1), rv("n", "none", arrival=-5)],
             prefixes=[pv("short", 500), pv("long", 3000), pv("none", 100, "cpu")], budget=100_000)
    assert admitted_order(LPM(), s) == ("l", "s", "n")


# ---------------------------------------------------------------------------- incremental queue


@pytest.mark.parametrize("name", [*BASELINES, "lpm-gated"])
def test_incremental_order_matches_a_full_sort_across_decisions(name: str) -> None:
    """Drive a policy through many snapshots (arrivals, admissions, cancels, value changes)."""
    rng = random.Random(name)
    wf = load_workflow("dag4")
    policy = make_policy(name)
    waiting: list[RequestView] = []
    for step in range(300):
        for _ in range(rng.randint(0, 3)):
            i = rng.randrange(10_000)
            waiting.append(rv(f"r{step}-{i}", rng.choice("abcd"), arrival=step + rng.random(), task=f"t{i % 7}",
                              task_arrival=i % 13, workflow="dag4", stage=rng.choice(["s_a", "s_b", "s_d"])))
        if waiting and rng.random() < 0.1:
            waiting.pop(rng.randrange(len(waiting)))  # a cancel: not via this policy
        prefixes = [pv(a, 1000 + 100 * k, rng.choice(["gpu", "cpu", "loading", "none"])) for k, a in enumerate("abcd")]
        tasks = [TaskView(f"t{k}", None, 0, frozenset(), (), float(rng.randint(0, 3))) for k in range(7)]
        resident = sum(p.tokens for p in prefixes if p.on_gpu)
        s = snap(waiting=waiting, prefixes=prefixes, tasks=tasks, budget=resident + rng.randint(0, 3000),
                 workflows={"dag4": wf})
        d = policy.decide(s)
        reference = sorted(s.waiting, key=policy.sort_key(s))
        expect = greedy_admit(s, reference)
        assert d == expect, f"step {step}"
        check_decision(s, d)
        waiting = [r for r in waiting if r.rid not in set(d.admit)]


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 50), st.integers(0, 3)), max_size=60))
def test_sorted_waiting_equals_sorted(ops: list[tuple[int, int, int]]) -> None:
    q = SortedWaiting(lambda r: (r.arrival_s, r.rid), lambda r: r.agent)
    waiting: tuple[RequestView, ...] = ()
    values: dict[str, int] = {}
    n = 0
    for kind, x, y in ops:
        if kind <= 1:  # arrival at the end
            n += 1
            waiting = (*waiting, rv(f"r{n}", "abcd"[y], arrival=float(x)))
        elif kind == 2 and waiting:  # the policy admits one
            victim = list(q)[x % len(waiting)]
            q.note_admitted([victim.rid])
            waiting = tuple(r for r in waiting if r is not victim)
        elif kind == 3:  # a group value changes
            values = {**values, "abcd"[y]: x}
        elif waiting:  # a cancel / reorder the queue did not see coming
            waiting = waiting[1:] + waiting[:1] if x % 2 else waiting[:-1]
        q.sync(waiting, values)
        expect = sorted(waiting, key=lambda r: (values.get(r.agent, 0), r.arrival_s, r.rid))
        assert list(q) == expect


def test_sorted_waiting_fast_path_avoids_rebuilds() -> None:
    q = SortedWaiting(lambda r: (r.arrival_s, r.rid))
    waiting: tuple[RequestView, ...] = ()
    for i in range(200):
        waiting = (*waiting, rv(f"r{i:03d}", arrival=float(i % 17)))
        if i % 3 == 0:
            head = list(q)[0] if len(q) else None
            if head is not None:
                q.note_admitted([head.rid])
                waiting = tuple(r for r in waiting if r is not head)
        q.sync(waiting)
    assert q.rebuilds == 0  # every sync took the fast path
    assert list(q) == sorted(waiting, key=lambda r: (r.arrival_s, r.rid))


def test_spf_and_las_sort_keys_are_total() -> None:
    s = snap(waiting=[rv("a", arrival=1), rv("b", arrival=1)], prefixes=[pv("a")])
    for p in (SPF(), AutellixLAS()):
        p.decide(s)
        keys = [p.sort_key(s)(r) for r in s.waiting]
        assert len(set(keys)) == 2 and keys[0][-1] == "a"


@pytest.mark.parametrize("name", [*BASELINES, "lpm-gated"])
def test_simengine_snapshots_take_the_incremental_fast_path(name: str) -> None:
    from topas_agents.sim import make_trace, simulate

    policy = make_policy(name)
    trace = make_trace(load_workflow("dag10wide"), 30, 0.05, 1)
    result = simulate(trace, policy, PROFILE)
    assert result.stats.decisions > 100
    assert policy._queue.rebuilds == 0  # noqa: SLF001 - no O(W log W) re-sort in the engine loop


# ---------------------------------------------------------------------------- lpm-gated (Diagnostic 2)

CHAIN = load_workflow("chain3")  # s1 (a) -> s2 (b) -> s3 (c)


def chain_req(rid: str, stage: str, arrival: float) -> RequestView:
    agent = {"s1": "a", "s2": "b", "s3": "c"}[stage]
    return rv(rid, agent, arrival=arrival, workflow="chain3", stage=stage, prefix=4096)


def gated_snap(waiting: list[RequestView]) -> Snapshot:
    # a resident, b and c not: plain LPM serves the entrance first.
    prefixes = [pv("a", 4096), pv("b", 4096, "none"), pv("c", 4096, "none")]
    return snap(waiting=waiting, prefixes=prefixes, budget=4096 + 4096 + 3 * 200, workflows={"chain3": CHAIN})


def test_lpm_gated_is_a_registered_peer_and_validates_its_options() -> None:
    assert "lpm-gated" in PEERS and "lpm-gated" not in BASELINES
    p = make_policy("lpm-gated", {"threshold": 3, "target": "deepest"})
    assert isinstance(p, LPMGated) and (p.config.threshold, p.config.target) == (3, "deepest")
    for bad in ({"threshold": 0}, {"threshold": True}, {"target": "root"}):
        with pytest.raises(ConfigError):
            make_policy("lpm-gated", bad)


def test_gate_opens_at_the_threshold_and_closes_when_the_backlog_is_empty() -> None:
    entrance = [chain_req(f"a{i}", "s1", i) for i in range(3)]
    policy = LPMGated(threshold=2)
    one_c = gated_snap([*entrance, chain_req("c0", "s3", 0.5)])
    assert policy.decide(one_c).admit == ("a0", "a1", "a2")  # below threshold: plain LPM
    policy = LPMGated(threshold=2)
    two_c = gated_snap([*entrance, chain_req("c0", "s3", 0.5), chain_req("c1", "s3", 0.7)])
    d = policy.decide(two_c)
    assert d.admit[:2] == ("c0", "c1") and d.prefix_out == ()  # c's prefix fits beside a's
    check_decision(two_c, d)
    # Hysteresis: one c left (below threshold) keeps the gate open; none closes it.
    policy = LPMGated(threshold=2)
    policy.decide(gated_snap([chain_req("c0", "s3", 0.5), chain_req("c1", "s3", 0.7)]))
    still = gated_snap([*entrance, chain_req("c2", "s3", 0.9)])
    assert policy.decide(still).admit[0] == "c2"
    policy.decide(gated_snap(entrance))
    assert policy.decide(gated_snap([*entrance, chain_req("c3", "s3", 9.0)])).admit[0] == "a0"


def test_sink_gate_ignores_a_middle_backlog_but_deepest_gate_drains_it() -> None:
    waiting = [chain_req("a0", "s1", 0), chain_req("b0", "s2", 1), chain_req("b1", "s2", 2)]
    assert LPMGated(threshold=2).decide(gated_snap(waiting)).admit[0] == "a0"
    assert LPMGated(threshold=2, target="deepest").decide(gated_snap(waiting)).admit[0] == "b0"


def test_gate_ignores_unlabelled_requests() -> None:
    waiting = [rv("u0", "a", arrival=0), rv("u1", "a", arrival=1), rv("u2", "a", arrival=2)]
    s = snap(waiting=waiting, prefixes=[pv("a")])
    assert LPMGated(threshold=1).decide(s) == LPM().decide(s)
