"""Topas never livelocks: on a generated workflow where preemptions for the EASY head cycled
for ever while the head's advance (occupancy.py) was not part of its admission credit (a later
decision preempted the head again for less than its advance, and it became the head once more),
every task completes within a bounded number of decisions."""

from __future__ import annotations

import pytest

from topas_agents.bench.runner import BenchConfig, default_backend, plan_points
from topas_agents.costmodel import load_profile
from topas_agents.policies.topas import TopasPolicy
from topas_agents.sim.driver import simulate
from topas_agents.suite.generate import generate_suite

PROFILE = load_profile("a100-80g-qwen2.5-32b")
# (suite seed, suite size, workflow index, load, arrival seed, tasks): cycled without the credit
CYCLED = [(0, 24, 16, 0.5, 102, 60)]
DECISIONS_PER_TASK = 200  # the run takes about 25 per task; a cycle takes unboundedly many


class _Capped(TopasPolicy):
    def __init__(self, cap: int) -> None:
        super().__init__()
        self.left = cap

    def decide(self, snap):
        self.left -= 1
        if self.left < 0:
            raise RuntimeError("decision cap reached: the policy is cycling")
        return super().decide(snap)


@pytest.mark.parametrize(("suite_seed", "size", "index", "load", "seed", "tasks"), CYCLED)
def test_every_task_completes_without_a_preemption_cycle(suite_seed, size, index, load, seed, tasks):
    suite = generate_suite(size, suite_seed, PROFILE.kv_budget_tokens, loads=(load,))
    wf = next(g.workflow for g in suite if g.index == index)
    cfg = BenchConfig(policies=("topas",), profile=PROFILE, workflow=wf, loads=(load,), tasks=tasks, seed=seed)
    point = plan_points(cfg, default_backend())[0]
    result = simulate(point.trace, _Capped(DECISIONS_PER_TASK * tasks), PROFILE)
    assert len(result.tasks) == tasks
