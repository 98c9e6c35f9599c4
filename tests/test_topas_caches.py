"""Valuations carried across decisions (DecisionCaches) must not change what Topas decides."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from topas_agents.bench.microbench import _world
from topas_agents.costmodel import load_profile
from topas_agents.policies.topas.caches import DecisionCaches, snap_to_grid
from topas_agents.policies.topas.context import Context
from topas_agents.policies.topas.policy import TopasPolicy


@pytest.mark.parametrize("profile", ["a100-80g-qwen2.5-32b", "h200-qwen2.5-32b"])
def test_carried_valuations_decide_as_fresh_ones(profile, monkeypatch):
    world = _world(20, 200, 3, load_profile(profile))
    carried, fresh = TopasPolicy(), TopasPolicy()
    states: Counter[str] = Counter()  # task states built, by policy
    build_state = Context._task_state

    def counted(ctx, req):
        states["carried" if ctx.caches is carried.caches else "fresh"] += 1
        return build_state(ctx, req)

    monkeypatch.setattr(Context, "_task_state", counted)
    reused = 0
    for _ in range(40):
        snap = world.snapshot()
        fresh.caches = DecisionCaches()  # nothing carried: every task and item valued anew
        before = {rid: (item, item.prio) for rid, item in carried.caches.items.items()}
        decision = carried.decide(snap)
        assert fresh.decide(snap) == decision
        # carried and re-weighted this decision: same object, new priority (the task aged)
        reused += sum(1 for rid, (item, prio) in before.items()
                      if carried.caches.items.get(rid) is item and item.prio != prio)
        world.apply(decision)
        world.step(0.2, 4)
    assert reused > 0  # the cache was exercised, not bypassed
    # idle tasks were carried without rebuilding their state (Context._carried_idle)
    assert states["carried"] < 0.75 * states["fresh"]


def test_horizon_grid_is_stable_and_close():
    for x in (0.01, 0.3, 1.0, 2.7, 150.0):
        y = snap_to_grid(x)
        assert abs(math.log2(y / x)) <= 1 / 16 + 1e-12  # nearest of 8 steps per doubling
        assert snap_to_grid(y) == y
        assert snap_to_grid(x * 1.001) == y or abs(math.log2(x * 1.001 / y)) > 1 / 16 - 0.002
    assert snap_to_grid(0.0) == 0.0
