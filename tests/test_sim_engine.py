"""SimEngine mechanics: timing against the cost model, residency, budget errors, callbacks."""

from __future__ import annotations

import math

import pytest

from topas_agents.costmodel import load_profile
from topas_agents.errors import DecisionError, TopasError
from topas_agents.policies import make_policy
from topas_agents.sim import EngineRequest, OverBudgetError, RequestError, SimEngine
from topas_agents.sim.steps import (
    decode_jump_terms,
    jump_s,
    prefill_batch_s,
    steps_to_cover,
    steps_within,
)
from topas_agents.snapshot import NOOP, Decision, Snapshot

PROFILE = load_profile()


def req(rid: str, agent: str = "a", *, prefix: int = 1000, inp: int = 200, out: int = 50,
        max_new: int | None = None, task: str | None = None, stage: str = "s") -> EngineRequest:
    return EngineRequest(rid, task or f"t-{rid}", None, stage, agent, prefix, inp, out,
                         out if max_new is None else max_new)


class Scripted:
    """A policy that records snapshots and returns queued decisions (then FCFS-greedy or NOOP)."""

    name = "scripted"

    def __init__(self, *decisions: Decision, fallback: str | None = "fcfs") -> None:
        self.queue = list(decisions)
        self.snaps: list[Snapshot] = []
        self.fallback = make_policy(fallback) if fallback else None

    def decide(self, snap: Snapshot) -> Decision:
        self.snaps.append(snap)
        if self.queue:
            return self.queue.pop(0)
        return self.fallback.decide(snap) if self.fallback else NOOP


def decode_loop_s(batch: int, context: int, steps: int) -> float:
    return sum(PROFILE.decode_step_s(batch, context + i * batch) for i in range(steps))


# ---------------------------------------------------------------------------- step math


@pytest.mark.parametrize("batch,context,k", [(1, 0, 1), (1, 5000, 37), (16, 80_000, 200), (64, 10, 999)])
def test_jump_closed_form_matches_per_step_loop(batch: int, context: int, k: int) -> None:
    step0, slope = decode_jump_terms(PROFILE, batch, context)
    assert jump_s(k, step0, slope) == pytest.approx(decode_loop_s(batch, context, k), rel=1e-12)


@pytest.mark.parametrize("dt", [0.0, 0.01, 0.5, 3.0, 77.7])
def test_steps_to_cover_is_the_first_boundary_at_or_after_dt(dt: float) -> None:
    step0, slope = decode_jump_terms(PROFILE, 8, 40_000)
    k = steps_to_cover(dt, step0, slope)
    assert k >= 1 and jump_s(k, step0, slope) >= dt
    assert k == 1 or jump_s(k - 1, step0, slope) < dt
    w = steps_within(dt, step0, slope)
    assert w >= 1 and (w == 1 or jump_s(w, step0, slope) <= dt)
    assert jump_s(w + 1, step0, slope) > dt


def test_single_chunk_prefill_equals_profile_prefill() -> None:
    assert prefill_batch_s(PROFILE, [(700, 3000)]) == pytest.approx(PROFILE.prefill_s(700, 3000))
    # A batch pays the dense term once: cheaper than two separate prefills.
    two = prefill_batch_s(PROFILE, [(700, 3000), (500, 0)])
    assert two < PROFILE.prefill_s(700, 3000) + PROFILE.prefill_s(500, 0)


# ---------------------------------------------------------------------------- timing


def test_single_request_time_is_prefill_plus_decode_steps() -> None:
    eng = SimEngine(PROFILE, make_policy("fcfs"), check=True)
    done: dict[str, float] = {}
    eng.on_finish = lambda rid, t: done.setdefault(rid, t)
    eng.submit(req("r", prefix=1000, inp=200, out=50, max_new=64))
    eng.run()
    # The prefix is recomputed inside the prefill, which also yields the first token;
    # then 49 decode steps each read prefix + input + tokens generated so far.
    expect = PROFILE.prefill_s(1200, 0) + decode_loop_s(1, 1201, 49)
    assert done["r"] == pytest.approx(expect, rel=1e-9)
    s = eng.stats()
    assert (s.tokens_generated, s.requests_finished, s.prefix_recomputes) == (50, 1, 1)
    assert s.mean_batch == pytest.approx(1.0)
    assert s.busy_s == pytest.approx(expect)


def test_second_request_reuses_the_prefix_being_recomputed() -> None:
    eng = SimEngine(PROFILE, make_policy("fcfs"), check=True)
    done: dict[str, float] = {}
    eng.on_finish = lambda rid, t: done.setdefault(rid, t)
    eng.submit(req("r1", out=5))
    eng.submit(req("r2", out=5))
    eng.run()
    s = eng.stats()
    assert s.prefix_recomputes == 1
    assert s.prefill_tokens == 1000 + 200 + 200  # the prefix once, then each input
    assert s.prefill_steps == 2  # r2 waits for r1's prefill to materialise the prefix
    assert done["r1"] == done["r2"]  # r1 decodes with r2 once r2 is prefilled


def test_long_prefill_is_chunked_at_8192_tokens() -> None:
    eng = SimEngine(PROFILE, make_policy("fcfs"), check=True)
    eng.submit(req("r", prefix=0, inp=10_000, out=2))
    eng.run()
    s = eng.stats()
    assert s.prefill_steps == 2 and s.prefill_tokens == 10_000
    expect = prefill_batch_s(PROFILE, [(8192, 0)]) + prefill_batch_s(PROFILE, [(1808, 8192)])
    assert s.busy_s == pytest.approx(expect + PROFILE.decode_step_s(1, 10_001))


def test_jump_splitting_does_not_change_timing() -> None:
    ends = []
    for max_jump in (None, 0.2):
        eng = SimEngine(PROFILE, make_policy("fcfs"), max_jump_s=max_jump, check=True)
        tokens: list[int] = []
        eng.on_token = lambda rid, n, tokens=tokens: tokens.append(n)
        fin: list[float] = []
        eng.on_finish = lambda rid, t, fin=fin: fin.append(t)
        eng.submit(req("r", out=100))
        eng.run()
        ends.append(fin[0])
        assert tokens == sorted(tokens) and tokens[-1] == 100
        if max_jump is not None:
            assert len(tokens) > 10  # streamed in small jumps
    assert ends[0] == pytest.approx(ends[1], rel=1e-9)


def test_arrival_mid_jump_is_scheduled_at_the_next_step_boundary() -> None:
    pol = Scripted()
    eng = SimEngine(PROFILE, pol, check=True)
    eng.submit(req("long", out=400))
    eng.call_at(3.0, lambda: eng.submit(req("late", out=5)))
    eng.run()
    later = [s for s in pol.snaps if any(r.rid == "late" for r in s.waiting)]
    assert later, "the policy never saw the late request"
    step = PROFILE.decode_step_s(1, 2000)
    assert 3.0 <= later[0].now < 3.0 + step


# ---------------------------------------------------------------------------- budget


def test_submit_over_budget_raises_and_changes_nothing() -> None:
    eng = SimEngine(PROFILE, make_policy("fcfs"), kv_budget=5000, check=True)
    eng.submit(req("ok", prefix=1000, inp=100, out=10))
    before = eng.snapshot()
    with pytest.raises(OverBudgetError, match="5001 KV tokens.*budget is 5000"):
        eng.submit(req("big", agent="b", prefix=4000, inp=901, out=100))
    assert isinstance(OverBudgetError("x"), TopasError)
    assert eng.snapshot() == before
    assert eng.kv_used == 0 and eng.waiting_count == 1
    eng.submit(req("fits", agent="b", prefix=4000, inp=900, out=100))  # exactly the budget
    eng.run()
    assert eng.stats().requests_finished == 2


def test_malformed_requests_are_rejected() -> None:
    eng = SimEngine(PROFILE, make_policy("fcfs"))
    eng.submit(req("r"))
    with pytest.raises(RequestError, match="already"):
        eng.submit(req("r"))
    with pytest.raises(RequestError, match="output_tokens"):
        eng.submit(req("x", out=10, max_new=5))
    with pytest.raises(RequestError):
        eng.submit(req("y", out=0))


def test_cancel_frees_kv_waiting_and_running() -> None:
    eng = SimEngine(PROFILE, make_policy("fcfs"), check=True)
    eng.submit(req("a1", out=300))
    eng.submit(req("a2", out=300))
    eng.advance(2.0)  # both admitted and decoding
    assert eng.running_count == 2
    assert eng.kv_used == 1000 + 2 * (200 + 300)
    assert eng.cancel("a1") is True
    assert eng.kv_used == 1000 + 500
    eng.check_integrity()
    assert eng.cancel("a1") is False and eng.cancel("nope") is False
    eng.submit(req("w", agent="b", out=5))
    assert eng.cancel("w") is True  # cancelled while waiting
    eng.run()
    s = eng.stats()
    assert (s.requests_finished, s.requests_cancelled) == (1, 2)
    assert eng.kv_used == 1000  # only the (unpinned) prefix stays resident
    assert eng.cancel("a2") is False


def test_decision_over_budget_raises_decision_error() -> None:
    class Greedy:
        name = "bad"

        def decide(self, snap: Snapshot) -> Decision:
            return Decision(admit=tuple(r.rid for r in snap.waiting))

    eng = SimEngine(PROFILE, Greedy(), kv_budget=3000)
    for i in range(4):  # prefix 1000 + 4 x 600 > 3000
        eng.submit(req(f"r{i}", prefix=1000, inp=500, out=100))
    with pytest.raises(DecisionError, match="budget is 3000"):
        eng.run()


@pytest.mark.parametrize("bad", [Decision(admit=("ghost",)), Decision(preempt=("r",)),
                                 Decision(prefix_out=("zzz",))])
def test_inapplicable_decisions_raise(bad: Decision) -> None:
    eng = SimEngine(PROFILE, Scripted(bad))
    eng.submit(req("r"))
    with pytest.raises(DecisionError):
        eng.run()


# ---------------------------------------------------------------------------- residency


def _two_agent_engine(host_tier: bool, *decisions: Decision) -> tuple[SimEngine, Scripted]:
    pol = Scripted(*decisions)
    eng = SimEngine(PROFILE, pol, host_tier=host_tier, check=True)
    return eng, pol


def test_prefix_out_with_host_tier_swaps_and_reloads() -> None:
    eng, pol = _two_agent_engine(True, Decision(admit=("r1",)))
    done: dict[str, float] = {}
    eng.on_finish = lambda rid, t: done.setdefault(rid, t)
    eng.submit(req("r1", prefix=4096, out=3))
    eng.run()
    t1 = done["r1"]
    pol.queue = [Decision(prefix_out=("a",)), Decision(admit=("r2",))]
    eng.submit(req("r2", prefix=4096, out=3))
    eng.advance(eng.now)  # decision 1: swap out (GPU space freed at once)
    assert eng.snapshot().prefix("a").location == "cpu" and eng.kv_used == 0
    eng.submit(req("r3", agent="b", prefix=10, out=1))  # another event -> decision 2: admit r2
    eng.run()
    s = eng.stats()
    assert (s.prefix_swaps_out, s.prefix_swaps_in, s.prefix_recomputes) == (1, 1, 2)  # a once, b once
    # r2 waited for the swap-out then the swap-in on the one FIFO link, then prefilled
    # only its input against the cached prefix.
    assert done["r2"] - t1 >= 2 * PROFILE.swap_s(4096)
    assert s.prefill_tokens == (4096 + 200) + 200 + (10 + 200)


def test_prefix_out_without_host_tier_drops_and_recomputes() -> None:
    eng, pol = _two_agent_engine(False)
    eng.submit(req("r1", prefix=4096, out=3))
    eng.run()
    pol.queue = [Decision(prefix_out=("a",))]
    eng.submit(req("r2", prefix=4096, out=3))
    eng.advance(eng.now)
    assert eng.snapshot().prefix("a").location == "none" and eng.kv_used == 0
    eng.submit(req("r3", agent="b", prefix=0, out=1))  # a new event: FCFS admits r2, r3
    eng.run()
    assert eng.snapshot().prefix("a").location == "gpu"
    s = eng.stats()
    assert (s.prefix_swaps_out, s.prefix_swaps_in, s.prefix_recomputes) == (0, 0, 2)
    assert s.prefill_tokens == 2 * (4096 + 200) + 200


def test_prefix_in_of_unknown_location_runs_a_prefix_prefill() -> None:
    eng, pol = _two_agent_engine(False, Decision(prefix_in=("a",)))
    eng.submit(req("r1", agent="b", prefix=0, inp=10, out=1))
    eng.submit(req("r2", agent="a", prefix=4096, inp=10, out=1))
    pol.queue.append(Decision(admit=("r1",)))
    eng.run()
    snap = eng.snapshot()
    assert snap.prefix("a").location == "gpu"
    assert eng.stats().prefix_recomputes >= 1


def test_preempted_request_is_reprefilled_and_keeps_its_tokens() -> None:
    class PreemptOnce:
        name = "preempt-once"

        def __init__(self) -> None:
            self.fcfs = make_policy("fcfs")
            self.done = False

        def decide(self, snap: Snapshot) -> Decision:
            victim = [r for r in snap.running if r.rid == "long" and r.generated >= 10]
            if victim and not self.done:
                self.done = True
                return Decision(preempt=("long",), admit=tuple(r.rid for r in snap.waiting))
            return self.fcfs.decide(snap)

    eng = SimEngine(PROFILE, PreemptOnce(), check=True)
    tokens: dict[str, int] = {}
    eng.on_token = lambda rid, n: tokens.__setitem__(rid, n)
    eng.submit(req("long", out=60))
    eng.call_at(1.0, lambda: eng.submit(req("short", agent="b", prefix=0, out=2)))
    eng.run()
    s = eng.stats()
    assert s.preemptions == 1
    assert tokens == {"long": 60, "short": 2}
    assert s.tokens_generated == 62
    # prefix+input once, then the re-prefill of input + generated (>= 10) tokens
    assert s.prefill_tokens >= 1000 + 200 + (200 + 10) + 200


# ---------------------------------------------------------------------------- API / events


def test_stage_done_events_reach_the_next_decision_once() -> None:
    pol = Scripted()
    eng = SimEngine(PROFILE, pol, check=True)
    eng.on_finish = lambda rid, t: rid == "r" and eng.stage_done("T", "s1")
    eng.submit(req("r", task="T", stage="s1", out=3))
    eng.run()
    eng.submit(req("r2", task="T", stage="s2", out=1))
    eng.run()
    events = [e for s in pol.snaps for e in s.events]
    assert len(events) == 1
    ev = events[0]
    assert (ev.task_id, ev.stage, ev.agent, ev.rounds) == ("T", "s1", "a", 1)
    assert ev.service_s > 0
    task = [t for t in pol.snaps[-1].tasks if t.task_id == "T"][0]
    assert "s1" in task.done_stages and task.attained_s >= ev.service_s
    eng.task_done("T")
    assert eng.snapshot().tasks == ()


def test_online_driving_with_next_event_time() -> None:
    eng = SimEngine(PROFILE, make_policy("fcfs"), check=True)
    assert eng.next_event_time() is None and eng.idle
    eng.advance(10.0)
    assert eng.now == 10.0
    eng.submit(req("r", out=20))
    assert eng.next_event_time() == 10.0  # a decision is pending
    finished: list[float] = []
    eng.on_finish = lambda rid, t: finished.append(t)
    while (t := eng.next_event_time()) is not None:
        eng.advance(t)
    assert finished and finished[0] > 10.0 and eng.idle


def test_advance_never_moves_the_clock_back() -> None:
    eng = SimEngine(PROFILE, make_policy("fcfs"))
    eng.advance(5.0)
    eng.advance(1.0)
    assert eng.now == 5.0
    eng.call_at(0.0, lambda: None)  # clamped to now
    assert eng.next_event_time() == 5.0
    eng.run()
    assert math.isfinite(eng.now)


def test_workflows_mapping_is_a_live_view() -> None:
    from topas_agents.workflow import load_workflow

    registry: dict = {}
    pol = Scripted()
    eng = SimEngine(PROFILE, pol, workflows=registry)
    registry["chain3"] = load_workflow("chain3")  # registered after the engine started
    eng.submit(req("r", out=1))
    eng.run()
    assert "chain3" in pol.snaps[0].workflows
    with pytest.raises(TypeError):
        eng.workflows["x"] = registry["chain3"]  # type: ignore[index]
