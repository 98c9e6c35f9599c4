"""J_block, the EASY head reservation, rival states and the guard's preempt-only case
(policies/topas/occupancy.py, pack.py, search.py, guard.py), on hand-made snapshots."""

from __future__ import annotations

import pytest
from test_topas_support import req, snap, task

from topas_agents.policies.baselines import LPM
from topas_agents.policies.topas import TopasConfig, TopasPolicy
from topas_agents.policies.topas.build import build_context
from topas_agents.policies.topas.guard import work_conserving
from topas_agents.policies.topas.longest_path import PathEstimator
from topas_agents.policies.topas.occupancy import delays_head, reserve_head, stranded_cost
from topas_agents.policies.topas.pack import greedy_pack
from topas_agents.policies.topas.profiles import ServiceProfiles, prior_scales
from topas_agents.policies.topas.search import rival_choice
from topas_agents.policies.topas.terms import CreditStore
from topas_agents.snapshot import NOOP, Decision, check_decision

# backfill at once (no starvation wait), so the reservation is exercised directly
EAGER = TopasConfig(backfill=1e-9)


def _context(s, cfg=EAGER):
    profiles = ServiceProfiles(cfg)
    ctx = build_context(s, cfg, CreditStore(), profiles, PathEstimator(profiles), prior_scales(s))
    ctx.reservation = reserve_head(ctx) if cfg.backfill > 0.0 else None
    return ctx


def _blocked_head():
    """Budget 10000. Running: one s1 request of agent a (prefix 2000 on GPU, KV 3000). The head
    (oldest task) needs agent b's 4000-token prefix (on CPU) + 4000 KV = 8000 > 5000 free; it fits
    once the running request ends. A young task waits with a small a-request and a long one."""
    running = req("r/s1", "r", "s1", "a", prefix=2000, inp=2000, out=1000, gen=10, service=1.0,
                  task_arrival=1.0)
    head = req("h/s2", "h", "s2", "b", prefix=4000, inp=3000, out=1000, arrival=5.0, task_arrival=0.0)
    short = req("y/s1", "y", "s1", "a", prefix=2000, inp=100, out=4, arrival=6.0, task_arrival=6.0)
    long = req("z/s1", "z", "s1", "a", prefix=2000, inp=1000, out=2000, arrival=6.0, task_arrival=6.0)
    return snap(now=50.0, budget=10_000, waiting=[head, short, long], running=[running],
                prefixes={"a": (2000, "gpu"), "b": (4000, "cpu")},
                tasks=[task("r", arrival=1.0, done={"s0"}), task("h", arrival=0.0, done={"s0", "s1"}),
                       task("y", arrival=6.0, done={"s0"}), task("z", arrival=6.0, done={"s0"})])


def test_the_head_waits_for_the_running_requests_to_free_its_kv():
    s = _blocked_head()
    ctx = _context(s)
    res = ctx.reservation
    assert res is not None and res.rid == "h/s2" and res.agent == "b" and not res.now
    # free now: 10000 - 2000 (a, pinned by the running request) - 3000 = 5000; the head needs
    # 4000 + 4000; when the running request ends its 3000 and a's idle prefix (2000) are free:
    # 10000, 2000 to spare
    assert res.extra == 2000
    assert res.start_s == pytest.approx(ctx.remaining(s.running[0]))


def test_only_work_that_ends_before_the_heads_start_may_backfill():
    s = _blocked_head()
    ctx = _context(s)
    items = {it.req.rid: it for it in ctx.candidates("a")}
    start = ctx.reservation.start_s
    assert ctx.remaining(items["y/s1"].req) <= start < ctx.remaining(items["z/s1"].req)
    assert not delays_head(ctx, items["y/s1"], spare=0)  # short: gone before the head starts
    assert delays_head(ctx, items["z/s1"], spare=0)  # long: would still hold KV the head needs
    assert not delays_head(ctx, items["z/s1"], spare=items["z/s1"].req.kv_tokens)  # fits the spare
    pack = greedy_pack(ctx, frozenset({"a"}))
    assert [it.req.rid for it in pack.admits] == ["y/s1"]


def test_a_head_that_has_not_waited_long_gets_no_reservation():
    s = _blocked_head()
    assert _context(s, TopasConfig(backfill=1e9)).reservation is None
    assert _context(s, TopasConfig(backfill=0.0)).reservation is None  # off


def test_a_head_that_fits_runs_first_in_every_state():
    head = req("h/s1", "h", "s1", "b", prefix=1000, inp=500, out=100, arrival=1.0, task_arrival=0.0)
    other = req("y/s1", "y", "s1", "a", prefix=1000, inp=500, out=100, arrival=2.0, task_arrival=2.0)
    s = snap(now=60.0, budget=10_000, waiting=[other, head], prefixes={"a": (1000, "gpu"), "b": (1000, "cpu")},
             tasks=[task("h", arrival=0.0), task("y", arrival=2.0)])
    ctx = _context(s)
    assert ctx.reservation.now and ctx.reservation.rid == "h/s1"
    assert greedy_pack(ctx, frozenset({"a"})) is None  # a state without the head's agent
    pack = greedy_pack(ctx, frozenset({"a", "b"}))
    assert pack.admits[0].req.rid == "h/s1"


def test_j_block_charges_stranded_kv_to_the_shut_out_tasks():
    # budget 17500: agent x's 16000-token prefix + 1000 never fits beside agent s's prefix (1200)
    # and a 5000-token request; admitting that request strands the rest of the budget
    longs = req("t/s1", "t", "s1", "s", prefix=1200, inp=3000, out=2000, task_arrival=0.0)
    big = req("u/s1", "u", "s1", "x", prefix=16000, inp=900, out=100, task_arrival=1.0)
    s = snap(now=2.0, budget=17_500, waiting=[longs, big], prefixes={"s": (1200, "gpu"), "x": (16000, "cpu")},
             tasks=[task("t", arrival=0.0), task("u", arrival=1.0)])
    ctx = _context(s, TopasConfig(backfill=0.0))
    pack = greedy_pack(ctx, frozenset({"s"}))
    assert [it.req.rid for it in pack.admits] == ["t/s1"]
    free = 17_500 - 1200 - longs.kv_tokens
    weight = ctx.task(big).g
    expected = ctx.cfg.block * weight * ctx.remaining(longs) * free / 17_500
    assert stranded_cost(ctx, pack, free) == pytest.approx(expected)
    unpriced = greedy_pack(_context(s, TopasConfig(backfill=0.0, block=0.0)), frozenset({"s"}))
    assert pack.scores[0] == pytest.approx(unpriced.scores[0])  # admitting nothing: no charge
    assert pack.scores[1] == pytest.approx(unpriced.scores[1] - expected)


def test_j_block_counts_a_resident_agent_whose_requests_no_longer_fit():
    # budget 17500, both prefixes resident (11500 + 2600). Agent b's long request leaves 1900
    # free for its whole decode; agent a's only waiting request needs 6000: a is shut out
    # although its prefix stays resident (the loop workflows of docs/suite.md)
    long_b = req("t/s3", "t", "s3", "b", prefix=2600, inp=200, out=1200, task_arrival=0.0)
    big_a = req("u/s4", "u", "s4", "a", prefix=11500, inp=5800, out=200, task_arrival=1.0)
    s = snap(now=2.0, budget=17_500, waiting=[long_b, big_a], prefixes={"a": (11500, "gpu"), "b": (2600, "gpu")},
             tasks=[task("t", arrival=0.0), task("u", arrival=1.0)])
    ctx = _context(s, TopasConfig(backfill=0.0))
    pack = greedy_pack(ctx, frozenset({"a", "b"}))
    assert [it.req.rid for it in pack.admits] == ["t/s3"]
    free = 17_500 - 11500 - 2600 - long_b.kv_tokens
    expected = ctx.cfg.block * ctx.task(big_a).g * ctx.remaining(long_b) * free / 17_500
    assert stranded_cost(ctx, pack, free) == pytest.approx(expected)
    # an agent whose every waiting request is admitted is not shut out
    only_b = snap(now=2.0, budget=17_500, waiting=[long_b], prefixes={"a": (11500, "gpu"), "b": (2600, "gpu")},
                  tasks=[task("t", arrival=0.0)])
    ctx = _context(only_b, TopasConfig(backfill=0.0))
    pack = greedy_pack(ctx, frozenset({"a", "b"}))
    assert stranded_cost(ctx, pack, free) == 0.0


def test_a_head_may_count_on_prefixes_that_go_idle():
    # budget 17500: the head needs its resident 11500 prefix + 6000 KV, i.e. agent b's prefix
    # too, which goes idle when b's only running request ends; before the fix b's prefix was
    # counted as pinned forever and the reservation never started (start_s = inf)
    running = req("r/s3", "r", "s3", "b", prefix=2600, inp=200, out=1200, gen=10, service=1.0, task_arrival=1.0)
    head = req("h/s4", "h", "s4", "a", prefix=11500, inp=5800, out=200, arrival=5.0, task_arrival=0.0)
    s = snap(now=50.0, budget=17_500, waiting=[head], running=[running],
             prefixes={"a": (11500, "gpu"), "b": (2600, "gpu")},
             tasks=[task("r", arrival=1.0, done={"s0", "s1", "s2"}), task("h", arrival=0.0, done={"s0", "s1", "s2", "s3"})])
    res = _context(s).reservation
    assert res is not None and res.rid == "h/s4" and not res.now
    assert res.start_s == pytest.approx(_context(s).remaining(running))
    assert res.extra == 17_500 - 11500 - head.kv_tokens


def test_an_lpm_decision_is_scored_as_a_topas_state():
    waiting = [req(f"t{i}/s1", f"t{i}", "s1", "a", arrival=-1.0, task_arrival=-1.0) for i in range(3)]
    s = snap(budget=17_500, waiting=waiting, tasks=[task(f"t{i}", arrival=-1.0) for i in range(3)],
             prefixes={"a": (4096, "gpu")})
    ctx = _context(s, TopasConfig(backfill=0.0))
    decision = LPM().decide(s)
    choice = rival_choice(ctx, decision)
    assert [it.req.rid for it in choice.pack.admits] == list(decision.admit)
    assert choice.k == len(decision.admit) and choice.score == pytest.approx(choice.pack.scores[-1])
    assert rival_choice(ctx, Decision(admit=("nope",))) is None  # unknown request
    assert rival_choice(ctx, NOOP) is None


def test_the_guard_never_lets_a_preempt_only_decision_empty_the_gpu():
    running = req("r/s1", "r", "s1", "a", prefix=2000, inp=500, out=100, gen=5, service=1.0)
    waiting = req("w/s1", "w", "s1", "b", prefix=2000, inp=500, out=100, task_arrival=0.5)
    s = snap(budget=4000, waiting=[waiting], running=[running], prefixes={"a": (2000, "gpu"), "b": (2000, "cpu")},
             tasks=[task("r"), task("w", arrival=0.5)])
    d = work_conserving(s, Decision(preempt=("r/s1",)))
    check_decision(s, d)
    # 2000 + 600 (running) + 2000 + 600 > 4000: nothing fits beside the running request, so the
    # preemption is dropped instead of leaving the GPU idle with nothing admitted
    assert d == NOOP


def _head_behind(running_task_arrival: float):
    """`_blocked_head` with a long running request (the head's start is far off) of a task that
    arrived at `running_task_arrival` (the head's task arrived at 0.0)."""
    base = _blocked_head()
    running = req("r/s1", "r", "s1", "a", prefix=2000, inp=2000, out=1000, gen=10, service=1.0,
                  task_arrival=running_task_arrival)
    tasks = [t for t in base.tasks if t.task_id != "r"] + [task("r", arrival=running_task_arrival, done={"s0"})]
    return snap(now=base.now, budget=base.kv_budget, waiting=base.waiting, running=[running],
                prefixes={"a": (2000, "gpu"), "b": (4000, "cpu")}, tasks=tasks)


def _head_state(s, advance: float):
    """The state that drops agent a (preempting the running request) and starts the head on b."""
    ctx = _context(s, TopasConfig(backfill=1e-9, advance=advance))
    pack = greedy_pack(ctx, frozenset({"b"}))
    assert [it.req.rid for it in pack.preempt] == ["r/s1"]
    assert pack.admits[0].req.rid == "h/s2"
    return ctx, pack


def test_starting_the_head_now_is_credited_its_advance():
    s = _head_behind(running_task_arrival=1.0)  # the running request's task is younger
    ctx, on = _head_state(s, advance=1.0)
    _, off = _head_state(s, advance=0.0)
    res = ctx.reservation
    assert res.rid == "h/s2" and 0.0 < res.start_s < float("inf")
    advance = on.admits[0].task.g * res.start_s  # the head's task, start_s sooner
    assert on.scores[0] == off.scores[0]  # before the head's admission: no advance
    assert on.scores[1:] == pytest.approx([v + advance for v in off.scores[1:]])
    assert on.credit[0] == pytest.approx(off.credit[0] + advance)  # J_revoke would charge it back
    # and it is what the decision does: without the advance the head waits for the drain
    assert TopasPolicy(TopasConfig(backfill=1e-9)).decide(s).preempt == ("r/s1",)
    assert TopasPolicy(TopasConfig(backfill=1e-9, advance=0.0)).decide(s).preempt == ()


def test_no_advance_for_making_an_older_task_give_way():
    s = _head_behind(running_task_arrival=-1.0)  # the running request's task is older
    _, on = _head_state(s, advance=1.0)
    _, off = _head_state(s, advance=0.0)
    assert on.scores == off.scores and on.credit == off.credit
