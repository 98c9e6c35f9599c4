"""Property tests: random small workflows, traces, budgets and policies keep every engine
invariant (check=True asserts them after every decision), finish every task, conserve
tokens and are deterministic."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topas_agents.costmodel import load_profile
from topas_agents.policies import BASELINES, make_policy
from topas_agents.policies.greedy import KVLedger, greedy_admit
from topas_agents.sim import make_trace, simulate
from topas_agents.snapshot import Decision, Snapshot
from topas_agents.workflow import Workflow, parse_workflow

PROFILE = load_profile()
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def workflows(draw: st.DrawFn) -> Workflow:
    n_agents = draw(st.integers(1, 3))
    agents = [{"name": f"a{i}", "prefix_tokens": draw(st.integers(0, 1500))} for i in range(n_agents)]
    stages: list[dict] = []
    for j in range(draw(st.integers(1, 4))):
        names = [s["name"] for s in stages]
        after = draw(st.lists(st.sampled_from(names), unique=True, max_size=2)) if names else []
        lo_in, lo_out = draw(st.integers(1, 300)), draw(st.integers(1, 80))
        stages.append({
            "name": f"s{j}",
            "agent": f"a{draw(st.integers(0, n_agents - 1))}",
            "after": after,
            "requests": [1, draw(st.integers(1, 3))],
            "input_tokens": [lo_in, lo_in + draw(st.integers(0, 200))],
            "output_tokens": [lo_out, lo_out + draw(st.integers(0, 60))],
            "tool_wait_s": draw(st.sampled_from([0.0, 0.0, 0.3, 2.0])),
        })
    return parse_workflow({"name": "rand", "agents": agents, "stages": stages})


def max_need(wf: Workflow) -> int:
    return max(wf.prefix_tokens(s.agent) + s.input_tokens.hi + s.output_tokens.hi for s in wf.stages)


@st.composite
def scenarios(draw: st.DrawFn) -> dict:
    wf = draw(workflows())
    need = max_need(wf)
    return {
        "wf": wf,
        "trace": make_trace(wf, draw(st.integers(1, 6)), draw(st.floats(0.05, 5.0)), draw(st.integers(0, 99))),
        "kv_budget": need + draw(st.integers(0, 3 * need)),
        "host_tier": draw(st.booleans()),
    }


def planned_tokens(trace) -> tuple[int, int]:
    rounds = [r for tp in trace for rs in tp.rounds.values() for r in rs]
    return len(rounds), sum(r.output_tokens for r in rounds)


def assert_complete(result, trace) -> None:
    n_requests, n_tokens = planned_tokens(trace)
    assert len(result.tasks) == len(trace)  # every task completed
    assert result.requests == result.stats.requests_finished == n_requests
    assert result.stats.tokens_generated == n_tokens  # each request made exactly output_tokens
    for t in result.tasks:
        assert t.finish_s > t.arrival_s and t.jct_s == t.finish_s - t.arrival_s


@SETTINGS
@given(scenario=scenarios(), policy=st.sampled_from(BASELINES))
def test_baselines_keep_invariants_finish_everything_and_are_deterministic(scenario: dict, policy: str) -> None:
    kw = {"kv_budget": scenario["kv_budget"], "host_tier": scenario["host_tier"]}
    first = simulate(scenario["trace"], make_policy(policy), PROFILE, check=True, **kw)
    assert_complete(first, scenario["trace"])
    assert first.preemptions == 0  # baselines never preempt
    again = simulate(scenario["trace"], make_policy(policy), PROFILE, **kw)
    assert again == first


class Chaos:
    """Random but valid decisions: preemptions, proactive loads, evictions, random admission order."""

    name = "chaos"

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def decide(self, snap: Snapshot) -> Decision:
        rng = self.rng
        victims = tuple(r.rid for r in snap.running
                        if r.generated > 0 and r.preemptions < 2 and rng.random() < 0.15)
        d = self._build(snap, victims, rng)
        if victims and not d.admit:  # only preempt to make room for something
            d = self._build(snap, (), rng)
        if not d.admit and snap.waiting and not snap.running:
            # Never leave the GPU idle with work waiting: fall back to plain FCFS greedy.
            return greedy_admit(snap, sorted(snap.waiting, key=lambda r: (r.arrival_s, r.rid)))
        return d

    @staticmethod
    def _build(snap: Snapshot, victims: tuple[str, ...], rng: random.Random) -> Decision:
        kept = replace(snap, running=tuple(r for r in snap.running if r.rid not in victims))
        ledger = KVLedger(kept)
        for p in kept.prefixes:
            if p.on_gpu and p.agent not in ledger.pinned and rng.random() < 0.3:
                ledger.evict(p.agent)
        loads = []
        for p in kept.prefixes:
            if not p.on_gpu and p.agent not in ledger.evicted and rng.random() < 0.3 and p.tokens <= ledger.free:
                ledger.free -= p.tokens
                ledger.on_gpu.add(p.agent)
                ledger.pinned.add(p.agent)  # never evict what this decision loads
                loads.append(p.agent)
        order = list(snap.waiting)
        rng.shuffle(order)
        for r in order:
            ledger.try_admit(r)
        return Decision(admit=tuple(ledger.admitted), preempt=victims, prefix_in=tuple(loads),
                        prefix_out=tuple(ledger.evicted))


@SETTINGS
@given(scenario=scenarios(), seed=st.integers(0, 10_000))
def test_random_valid_decisions_keep_invariants(scenario: dict, seed: int) -> None:
    kw = {"kv_budget": scenario["kv_budget"], "host_tier": scenario["host_tier"]}
    first = simulate(scenario["trace"], Chaos(seed), PROFILE, check=True, **kw)
    assert_complete(first, scenario["trace"])
    assert simulate(scenario["trace"], Chaos(seed), PROFILE, **kw) == first


@SETTINGS
@given(ops=st.lists(st.tuples(st.floats(0.0, 3.0), st.integers(0, 3), st.integers(0, 2), st.integers(1, 120)),
                    min_size=1, max_size=40),
       policy=st.sampled_from(BASELINES), max_jump=st.sampled_from([None, 0.05, 0.5]),
       host_tier=st.booleans())
def test_online_submit_cancel_advance_keeps_invariants(ops, policy: str, max_jump, host_tier: bool) -> None:
    """Server-style driving: submits and cancels between advance() calls, mid-jump included."""
    from topas_agents.sim import EngineRequest, SimEngine

    eng = SimEngine(PROFILE, make_policy(policy), kv_budget=6000, host_tier=host_tier, check=True,
                    max_jump_s=max_jump)
    tokens: dict[str, int] = {}
    finished: dict[str, float] = {}
    eng.on_token = lambda rid, n: tokens.__setitem__(rid, n)
    eng.on_finish = lambda rid, t: finished.__setitem__(rid, t)
    outputs: dict[str, int] = {}
    cancelled: set[str] = set()
    for i, (dt, action, agent, out) in enumerate(ops):
        eng.advance(eng.now + dt)
        live = sorted(set(outputs) - set(finished) - cancelled)
        if action == 0 and live:
            rid = live[out % len(live)]
            assert eng.cancel(rid)
            cancelled.add(rid)
        else:
            rid = f"r{i}"
            outputs[rid] = out
            eng.submit(EngineRequest(rid, f"t{i % 3}", None, "s", f"a{agent}", 1000 * agent, 50 + out, out, 120))
        eng.check_integrity()
    while (t := eng.next_event_time()) is not None:
        eng.advance(t)
    assert eng.idle and eng.kv_used <= 6000
    assert set(finished) == set(outputs) - cancelled
    for rid in finished:
        assert tokens[rid] == outputs[rid]
    assert eng.stats().tokens_generated == sum(tokens.values())
