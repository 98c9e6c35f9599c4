"""Topas decisions on hand-made snapshots: admission value, moves, preemption, reuse, aging."""

from __future__ import annotations

import pytest
from test_topas_support import CHAIN3, DAG4, PROFILE, done, req, snap, task, workflow

from topas_agents.policies import make_policy
from topas_agents.policies.topas import TopasConfig, TopasPolicy
from topas_agents.policies.topas.build import build_context
from topas_agents.policies.topas.longest_path import PathEstimator
from topas_agents.policies.topas.pack import greedy_pack
from topas_agents.policies.topas.profiles import ServiceProfiles, prior_scales, prior_service_s
from topas_agents.policies.topas.terms import CreditStore
from topas_agents.snapshot import NOOP, check_decision

DIAMOND = workflow("diamond", [("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"])])


def _decide(policy, s):
    d = policy.decide(s)
    check_decision(s, d)
    return d


def _context(s, cfg=None, events=()):
    cfg = cfg or TopasConfig()
    profiles = ServiceProfiles(cfg)
    profiles.observe(events)
    return build_context(s, cfg, CreditStore(), profiles, PathEstimator(profiles), prior_scales(s))


def test_critical_request_is_admitted_before_the_off_critical_one():
    events = [done(f"h{i}", "diamond", st, st.upper(), x)
              for i, (st, x) in enumerate([("a", 3.0), ("b", 10.0), ("c", 6.0), ("d", 5.0)])]
    wb = req("t/b", "t", "b", "B", wf="diamond", prefix=1024, inp=256, out=64)
    wc = req("t/c", "t", "c", "C", wf="diamond", prefix=1024, inp=256, out=64)
    s = snap(budget=2048 + 320 + 100, waiting=[wc, wb], prefixes={"B": (1024, "gpu"), "C": (1024, "gpu")},
             tasks=[task("t", "diamond", done={"a"})], workflows=(DIAMOND,), events=events)
    assert _decide(make_policy("topas-core"), s).admit == ("t/b",)  # b (10 s) is the critical branch


def test_prefix_grouping_beats_mixing_agents():
    # room for prefix a + 6 requests, or for both prefixes + 1 request
    waiting = [req(f"t{i}/s1", f"t{i}", "s1", "a", arrival=-1.0, task_arrival=-1.0) for i in range(6)]
    waiting.append(req("u/s2", "u", "s2", "b", arrival=-1.0, task_arrival=-1.0))
    tasks = [task(f"t{i}", arrival=-1.0) for i in range(6)] + [task("u", arrival=-1.0, done={"s1"})]
    s = snap(budget=9000, waiting=waiting, tasks=tasks,
             prefixes={"a": (4096, "gpu"), "b": (4096, "cpu"), "c": (4096, "cpu")})
    d = _decide(make_policy("topas-core"), s)
    assert sorted(d.admit) == [f"t{i}/s1" for i in range(6)]
    assert d.prefix_in == () and d.prefix_out == () and d.preempt == ()


def test_j_admit_and_j_move_in_the_pack_scores():
    # prefix a on CPU: both admissions wait for the same swap-in (one serialized transfer)
    waiting = [req("t0/s1", "t0", "s1", "a"), req("t1/s1", "t1", "s1", "a")]
    s = snap(budget=17500, waiting=waiting, tasks=[task("t0"), task("t1")], prefixes={"a": (4096, "cpu")})
    ctx = _context(s)
    pack = greedy_pack(ctx, frozenset({"a"}))
    swap = PROFILE.swap_s(4096)
    items = {it.req.rid: it for it in pack.admits}
    first, second = pack.admits
    assert [it.req.rid for it in pack.admits] == ["t0/s1", "t1/s1"]  # equal value: rid breaks the tie
    for it in (first, second):
        # chain, point-mass prior: serving for delta reduces L by exactly delta (critical path)
        assert it.gain == pytest.approx(it.delta) and it.delta == pytest.approx(ctx.horizon_s)
    g0, g1 = items["t0/s1"].task.g, items["t1/s1"].task.g
    assert pack.scores[0] == pytest.approx(0.0)
    assert pack.scores[1] == pytest.approx(g0 * first.delta - g0 * swap)
    assert pack.scores[2] == pytest.approx(g0 * first.delta + g1 * second.delta - (g0 + g1) * swap)
    assert pack.credit == [pytest.approx(g0 * first.delta), pytest.approx(g1 * second.delta)]


def test_preemption_prices_redo_and_revokes_credit():
    policy = make_policy("topas-core")
    young = req("y/s1", "y", "s1", "b", wf="chain3", arrival=0.0, task_arrival=0.0)
    # 1. admit the young request: its admission credit is stored
    s1 = snap(now=0.0, budget=8000, waiting=[young], tasks=[task("y")], prefixes={"a": (4096, "cpu"),
                                                                               "b": (4096, "gpu")})
    assert _decide(policy, s1).admit == ("y/s1",)
    credit = policy.credits.get("y/s1")
    assert credit > 0
    # 2. five old tasks need prefix a, which only fits if b goes: b's running request is preempted
    running = req("y/s1", "y", "s1", "b", gen=10, service=0.5, task_arrival=0.0)
    old = [req(f"o{i}/s3", f"o{i}", "s3", "a", arrival=-300.0, task_arrival=-300.0) for i in range(5)]
    tasks = [task("y", active=[("s1", 0.5)])] + [task(f"o{i}", arrival=-300.0, done={"s1", "s2"}) for i in range(5)]
    prefixes = {"a": (4096, "cpu"), "b": (4096, "gpu")}
    s2 = snap(now=1.0, budget=8000, running=[running], waiting=old, tasks=tasks, prefixes=prefixes)
    ctx = _context(s2)
    [item] = ctx.running_items("b")
    expected_redo = item.task.g * PROFILE.prefill_s(512 + 10, 4096)
    ctx.credits.grant("y/s1", credit)
    assert ctx.preempt_cost(item) == pytest.approx(expected_redo + credit)  # J_redo + J_revoke
    d = _decide(policy, s2)
    assert d.preempt == ("y/s1",) and d.prefix_out == ("b",)
    assert sorted(d.admit) == [f"o{i}/s3" for i in range(5)]
    assert "y/s1" not in policy.credits  # revoked on preemption
    assert all(f"o{i}/s3" in policy.credits for i in range(5))
    # 3. completion clears credits: the o* requests are gone from the next snapshot
    s3 = snap(now=20.0, budget=8000, waiting=[young], tasks=[task("y")], prefixes=prefixes)
    policy.decide(s3)
    assert not any(f"o{i}/s3" in policy.credits for i in range(5))
    # with preemption disabled the same state admits nothing
    assert _decide(make_policy("topas-core", {"k_preempt": 0}), s2) == NOOP


def test_v_reuse_loads_the_prefixes_a_fork_is_about_to_need():
    prior = PROFILE.request_service_s(4096, 512, 256)
    running = req("t/s_a", "t", "s_a", "a", wf="dag4", gen=250, service=prior)
    # s_a has attained its whole expected service: its children are about to be released
    s = snap(running=[running], tasks=[task("t", "dag4", active=[("s_a", prior)])], workflows=(DAG4,),
             prefixes={"a": (4096, "gpu"), "b": (4096, "cpu"), "c": (4096, "cpu"), "d": (4096, "cpu")})
    d = _decide(make_policy("topas-core"), s)
    assert d.prefix_in == ("b", "c") and d.admit == () and d.preempt == ()  # both fork children, not d
    assert make_policy("topas-noreuse").decide(s) == NOOP
    assert make_policy("topas-base").decide(s) == NOOP


def test_v_reuse_join_only_when_its_other_predecessors_are_done():
    prior = prior_service_s(DAG4, "s_b", PROFILE)  # 1-2 rounds: 1.5 x one request
    running = req("t/s_b", "t", "s_b", "b", wf="dag4", gen=250, service=prior)
    prefixes = {"a": (4096, "cpu"), "b": (4096, "gpu"), "c": (4096, "cpu"), "d": (4096, "cpu")}
    half = snap(running=[running], tasks=[task("t", "dag4", done={"s_a"}, active=[("s_b", prior)])],
                workflows=(DAG4,), prefixes=prefixes)
    assert make_policy("topas-core").decide(half) == NOOP  # s_c still pending: d is not released
    full = snap(running=[running], tasks=[task("t", "dag4", done={"s_a", "s_c"}, active=[("s_b", prior)])],
                workflows=(DAG4,), prefixes=prefixes)
    assert _decide(make_policy("topas-core"), full).prefix_in == ("d",)


def test_aging_lets_an_old_task_overtake_a_denser_young_one():
    young = req("y/s1", "y", "s1", "a", inp=400, arrival=0.0, task_arrival=0.0)
    old = req("o/s1", "o", "s1", "a", inp=512, arrival=-300.0, task_arrival=-300.0)
    s = snap(budget=4096 + 768 + 100, waiting=[young, old], tasks=[task("y"), task("o", arrival=-300.0)],
             prefixes={"a": (4096, "gpu")})
    # the aging term alone: no head reservation (the old task's request has waited 300 s) and no
    # rival states (Parrot's oldest-first state scores the same and would win the tie)
    alone = {"backfill": "0", "rivals": "0"}
    assert _decide(make_policy("topas-core", alone), s).admit == ("o/s1",)
    # without aging, the knapsack-density order (kv_exp = 1) prefers fewer KV tokens per progress
    assert _decide(make_policy("topas-noaging", {"kv_exp": "1", **alone}), s).admit == ("y/s1",)
    ctx = _context(s)
    g_old, g_young = ctx.task(old).g, ctx.task(young).g
    from topas_agents.policies.topas.terms import aging

    assert g_old / g_young == pytest.approx(aging(300.0, ctx.age_scale_s, 1.0))  # same remaining work


def test_unlabelled_requests_are_one_stage_tasks():
    waiting = [req(f"u{i}", f"u{i}", "call", "anon", wf=None, prefix=0, inp=300, out=100) for i in range(3)]
    s = snap(budget=1000, waiting=waiting, prefixes={})
    d = _decide(make_policy("topas-core"), s)
    assert len(d.admit) == 2  # 2 x 400 tokens fit, 3 do not


def test_no_waiting_and_nothing_running_is_a_noop():
    assert make_policy("topas-core").decide(snap(prefixes={"a": (4096, "gpu")})) == NOOP


def test_same_snapshot_sequence_same_decisions():
    from topas_agents.bench.microbench import _workflow, _World

    def run() -> list:
        import random

        rng = random.Random(3)
        wfs = [_workflow(k, 6, rng) for k in range(3)]
        world = _World(wfs, PROFILE, 120, seed=3)
        policy = TopasPolicy()
        out = []
        for _ in range(25):
            s = world.snapshot()
            d = policy.decide(s)
            check_decision(s, d)
            out.append(d)
            world.apply(d)
            world.step(0.5, 10)
        return out

    first, second = run(), run()
    assert first == second
    assert any(d.admit for d in first)


def test_chain_workflow_constant_is_the_builtin():
    assert CHAIN3.name == "chain3" and [s.name for s in CHAIN3.stages] == ["s1", "s2", "s3"]


def test_v_reuse_never_prefetches_by_recompute():
    from dataclasses import replace

    prior = PROFILE.request_service_s(4096, 512, 256)
    running = req("t/s_a", "t", "s_a", "a", wf="dag4", gen=250, service=prior)
    s = snap(running=[running], tasks=[task("t", "dag4", active=[("s_a", prior)])], workflows=(DAG4,),
             prefixes={"a": (4096, "gpu"), "b": (4096, "none"), "c": (4096, "none"), "d": (4096, "none")},
             profile=replace(PROFILE, host_tier=False))
    assert make_policy("topas-core").decide(s) == NOOP  # a speculative recompute would stall the batch


def test_default_fill_order_ignores_the_kv_reservation():
    """kv_exp = 0 (default): equal weighted progress, so the larger reservation is not penalised
    and the earlier task goes first; kv_exp = 1 ranks by progress per KV token."""
    small = req("y/s1", "y", "s1", "a", inp=400, arrival=0.0, task_arrival=0.0)
    large = req("o/s1", "o", "s1", "a", inp=512, arrival=-1.0, task_arrival=-1.0)
    s = snap(budget=4096 + 768 + 100, waiting=[small, large], tasks=[task("y"), task("o", arrival=-1.0)],
             prefixes={"a": (4096, "gpu")})
    assert _decide(make_policy("topas-base"), s).admit == ("o/s1",)
    # (block = 0: with it, the state that strands less KV, admitting o, is scored higher)
    assert _decide(make_policy("topas-base", {"kv_exp": "1", "block": "0"}), s).admit == ("y/s1",)
