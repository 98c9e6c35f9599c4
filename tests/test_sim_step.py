"""SimEngine.step(): the loop's one turn; driving an engine by steps is driving it by run()."""

from __future__ import annotations

import math

import pytest

from topas_agents.costmodel import load_profile
from topas_agents.policies import make_policy
from topas_agents.sim import SimEngine, make_trace, simulate
from topas_agents.sim.driver import _Driver
from topas_agents.workflow import load_workflow

PROFILE = load_profile()


@pytest.mark.parametrize("policy,host_tier", [("lpm", False), ("topas", True)])
def test_stepping_to_the_end_equals_run(policy: str, host_tier: bool) -> None:
    trace = make_trace(load_workflow("dag4"), 30, 0.2, 3)
    expected = simulate(trace, make_policy(policy), PROFILE, host_tier=host_tier, check=True)
    eng = SimEngine(PROFILE, make_policy(policy), host_tier=host_tier, check=True,
                    workflows={"dag4": trace[0].workflow})
    driver = _Driver(eng, trace, None)
    turns = 0
    while eng.step():
        turns += 1
        assert eng.kv_used <= eng.kv_budget
    assert driver.completed == len(trace) and eng.idle
    assert eng.stats() == expected.stats and turns > len(trace)
    finish = [tr.finish_s for tr in driver.runs]
    assert finish == [t.finish_s for t in expected.tasks]


def test_step_past_until_leaves_the_clock() -> None:
    eng = SimEngine(PROFILE, make_policy("fcfs"))
    fired: list[float] = []
    eng.call_at(5.0, lambda: fired.append(eng.now))
    assert not eng.step(until=4.0) and eng.now == 0.0 and fired == []
    assert eng.step(until=math.inf) and fired == [5.0] and eng.now == 5.0
    assert not eng.step() and eng.idle
