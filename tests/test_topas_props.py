"""Property tests: every Topas decision is applicable and within the KV budget."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_topas_support import CHAIN3, DAG4, PROFILE

from topas_agents.policies import make_policy
from topas_agents.snapshot import (
    PrefixView,
    RequestView,
    Snapshot,
    StageDone,
    TaskView,
    check_decision,
    kv_after,
)
from topas_agents.workflow import load_workflow

WORKFLOWS = (CHAIN3, DAG4, load_workflow("dag10wide"))
POLICIES = ("topas-core", "topas-base", "topas-noreuse", "topas-noaging")


@st.composite
def snapshots(draw) -> Snapshot:
    """A consistent engine state: tasks with a down-closed done set, requests of ready stages
    (waiting or running), prefixes whose location is consistent with the running requests."""
    wfs = {w.name: w for w in WORKFLOWS}
    agents = {a.name: a.prefix_tokens for w in WORKFLOWS for a in w.agents}
    waiting, running, tasks, events = [], [], [], []
    now = draw(st.floats(0, 500))
    for i in range(draw(st.integers(0, 8))):
        wf = draw(st.sampled_from(WORKFLOWS))
        tid = f"t{i}"
        done: set[str] = set()
        for stage in wf.topo_order:
            if stage in wf.ready_stages(done) and draw(st.booleans()):
                done.add(stage)
        ready = wf.ready_stages(done)
        if not ready:
            continue
        arrival = now - draw(st.floats(0, 400))
        active = []
        for stage in ready:
            kind = draw(st.sampled_from(["waiting", "running", "none"]))
            if kind == "none":
                continue
            spec = wf.stage(stage)
            gen = draw(st.integers(0, spec.output_tokens.hi - 1)) if kind == "running" else 0
            e = draw(st.floats(0, 40)) if kind == "running" or draw(st.booleans()) else 0.0
            active.append((stage, e))
            r = RequestView(f"{tid}/{stage}", tid, wf.name, stage, spec.agent, agents[spec.agent],
                            spec.input_tokens.lo, spec.output_tokens.hi, gen, arrival, arrival, service_s=e,
                            preemptions=draw(st.integers(0, 2)))
            (running if kind == "running" else waiting).append(r)
        tasks.append(TaskView(tid, wf.name, arrival, frozenset(done), tuple(active), sum(e for _, e in active)))
        if done and draw(st.booleans()):
            stage = sorted(done)[0]
            events.append(StageDone(tid, wf.name, stage, wf.stage(stage).agent, draw(st.floats(0.5, 30)), 1, now))
    for j in range(draw(st.integers(0, 3))):  # unlabelled one-stage calls, agent not registered
        waiting.append(RequestView(f"u{j}", f"u{j}", None, "call", f"anon{j % 2}", draw(st.integers(0, 2048)),
                                   draw(st.integers(1, 1024)), draw(st.integers(1, 256)), 0, now, now))
    used = {r.agent for r in running}
    prefixes = []
    for agent, tokens in sorted(agents.items()):
        loc = "gpu" if agent in used and draw(st.booleans()) else draw(st.sampled_from(["gpu", "loading", "cpu", "none"]))
        if agent in used and loc not in ("gpu", "loading"):
            loc = "gpu"
        prefixes.append(PrefixView(agent, tokens, loc, draw(st.floats(0, 100)), sum(r.agent == agent for r in running)))
    base = Snapshot(now, 1, tuple(waiting), tuple(running), tuple(prefixes), tuple(tasks), PROFILE,
                    MappingProxyType(wfs), tuple(events))
    budget = base.kv_used + draw(st.integers(0, 20000))
    profile = replace(PROFILE, host_tier=draw(st.booleans()))
    return replace(base, kv_budget=budget, profile=profile)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.sampled_from(POLICIES), st.sampled_from([{}, {"enum_agents": 0}, {"k_admit": 2}]))
def test_decision_is_applicable_and_within_budget(s, name, options):
    policy = make_policy(name, options)
    d = policy.decide(s)
    check_decision(s, d)
    assert kv_after(s, d) <= s.kv_budget
    assert len(d.admit) <= policy.config.k_admit
    assert len(d.preempt) <= policy.config.k_preempt


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(snapshots(), min_size=2, max_size=5))
def test_a_stateful_policy_stays_valid_and_deterministic(seq):
    a, b = make_policy("topas-core"), make_policy("topas-core")
    for s in seq:
        da, db = a.decide(s), b.decide(s)
        check_decision(s, da)
        assert da == db
