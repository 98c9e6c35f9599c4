"""SimEngine's prefix-cache counters (/metrics `prefix_cache_queries/hits`) and its per-decision
times: pure accounting, counted at admission, never changing what the engine does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from topas_agents.costmodel import load_profile
from topas_agents.policies import make_policy
from topas_agents.sim import EngineRequest, PrefixCacheCount, SimEngine
from topas_agents.snapshot import Decision, Snapshot
from topas_agents.workflow import load_workflow

PROFILE = load_profile()
PREFIX = {"a": 1000, "b": 3000, "c": 0}


def _req(rid: str, agent: str, inp: int = 200, out: int = 20) -> EngineRequest:
    return EngineRequest(rid, f"t-{rid}", None, "s", agent, PREFIX[agent], inp, out, out)


def test_second_call_of_an_agent_hits_its_resident_prefix() -> None:
    eng = SimEngine(PROFILE, make_policy("fcfs"), check=True)
    eng.submit(_req("r1", "a"))
    eng.run()
    assert eng.prefix_cache_counts() == {"a": PrefixCacheCount(queries=1200, hits=0)}  # computed, not cached
    eng.submit(_req("r2", "a", inp=50))
    eng.run()
    assert eng.prefix_cache_counts()["a"] == PrefixCacheCount(queries=1200 + 1050, hits=1000)


def test_a_hit_needs_the_prefix_on_gpu_at_admission() -> None:
    """'b' is new: a miss while 'a' is resident. 'a' again: a hit exactly when its prefix
    was still on GPU when it was admitted (fcfs with this budget keeps both)."""
    eng = SimEngine(PROFILE, make_policy("fcfs"), check=True)
    for rid, agent in (("r1", "a"), ("r2", "b")):
        eng.submit(_req(rid, agent))
        eng.run()
    where = {p.agent: p.location for p in eng.snapshot().prefixes}
    assert where == {"a": "gpu", "b": "gpu"}
    eng.submit(_req("r3", "a"))
    eng.run()
    counts = eng.prefix_cache_counts()
    assert counts == {"a": PrefixCacheCount(2400, 1000), "b": PrefixCacheCount(3200, 0)}


class EvictAThenFcfs:
    """fcfs, but first swaps agent 'a' out whenever it sits idle on GPU."""

    name = "evict-a"

    def __init__(self) -> None:
        self.fcfs = make_policy("fcfs")

    def decide(self, snap: Snapshot) -> Decision:
        if any(p.agent == "a" and p.location == "gpu" and p.running == 0 for p in snap.prefixes):
            return Decision(prefix_out=("a",))
        return self.fcfs.decide(snap)


def test_a_prefix_on_host_at_admission_is_a_miss() -> None:
    """Swapped out to CPU, 'a' must load again before its next request runs: not a hit."""
    eng = SimEngine(PROFILE, EvictAThenFcfs(), host_tier=True, check=True)
    eng.submit(_req("r1", "a"))
    eng.run()
    assert {p.agent: p.location for p in eng.snapshot().prefixes} == {"a": "cpu"}
    eng.submit(_req("r2", "a"))
    eng.run()
    assert eng.prefix_cache_counts()["a"] == PrefixCacheCount(2400, 0)
    assert eng.stats().prefix_swaps_in == 1


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(PREFIX)), st.integers(1, 800), st.integers(1, 60),
                          st.floats(0.0, 5.0)), min_size=1, max_size=25),
       st.sampled_from(["fcfs", "lpm", "topas"]))
def test_counts_are_bounded_and_whole_prefixes(reqs, policy) -> None:
    eng = SimEngine(PROFILE, make_policy(policy), check=True)
    t = 0.0
    for i, (agent, inp, out, gap) in enumerate(reqs):
        t += gap
        eng.advance(t)
        eng.submit(_req(f"r{i}", agent, inp, out))
    eng.run()
    counts = eng.prefix_cache_counts()
    admissions = len(reqs) + eng.stats().preemptions  # each preempted request is admitted again
    assert sum(c.queries for c in counts.values()) >= sum(PREFIX[a] + inp for a, inp, _, _ in reqs)
    for agent, c in counts.items():
        assert 0 <= c.hits <= c.queries
        per_call = [PREFIX[agent] + inp for a, inp, _, _ in reqs if a == agent]
        assert c.hits % max(1, PREFIX[agent]) == 0 and c.hits <= PREFIX[agent] * admissions
        if eng.stats().preemptions == 0:
            assert c.queries == sum(per_call)


def test_decision_times_are_append_only_and_match_the_stats() -> None:
    eng = SimEngine(PROFILE, make_policy("topas"), check=True)
    for i in range(4):
        eng.submit(_req(f"r{i}", "ab"[i % 2]))
    eng.run()
    times = eng.decision_times_s()
    assert len(times) == eng.stats().decisions > 0 and all(x >= 0 for x in times)
    assert eng.decision_times_s(2) == times[2:] and eng.decision_times_s(len(times)) == []
    times.append(99.0)  # a copy: a reader cannot change the engine's list
    assert len(eng.decision_times_s()) == eng.stats().decisions


def test_decision_times_are_bounded_and_a_reader_keeps_its_place() -> None:
    # a server kept every decision's time: 31 MiB and a 0.24 s stats request at a million
    from topas_agents.sim.decision_times import DecisionTimes

    times = DecisionTimes(kept=4)
    for i in range(10):
        times.add(i / 1000)
    assert times.count == 10 and abs(times.mean_ms() - 4.5) < 1e-9
    assert times.since(0) == [0.006, 0.007, 0.008, 0.009]  # the dropped are skipped
    assert times.since(8) == [0.008, 0.009] and times.since(10) == [] and times.since(12) == []
    assert abs(times.p99_ms() - 8.97) < 1e-9  # over the kept ones


def test_idle_undeclared_agents_are_forgotten_past_the_floor(monkeypatch) -> None:
    # one prefix record per agent name for the engine's life: clients naming an agent per
    # task made every decision slower and slower
    from topas_agents.sim import engine as engine_module

    monkeypatch.setattr(engine_module, "FORGET_PREFIXES_PAST", 8)
    eng = SimEngine(load_profile("a100-80g-qwen2.5-32b"), make_policy("lpm"), workflows={"chain3": load_workflow("chain3")},
                    kv_budget=6000, check=True)
    for i in range(40):
        eng.submit(EngineRequest(rid=f"r{i}", task_id=f"t{i}", workflow=None, stage="s", agent=f"agent-{i}",
                                 prefix_tokens=1000, input_tokens=10, output_tokens=2, max_new_tokens=2))
        eng.advance(eng.now + 5.0)
    counts = eng.prefix_cache_counts()
    assert len(eng.snapshot().prefixes) < 40  # forgotten: at most twice the floor, plus what is resident
    assert set(counts) == {f"agent-{i}" for i in range(40)} | {"a", "b", "c"}  # counters survive
    assert sum(c.queries for c in counts.values()) == 40 * 1010
    assert {"a", "b", "c"} <= {p.agent for p in eng.snapshot().prefixes}  # declared: kept
