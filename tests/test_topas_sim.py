"""Topas end to end in the simulator (small traces, engine integrity checked every decision)."""

from __future__ import annotations

import pytest
from test_topas_support import PROFILE, workflow

from topas_agents.bench.microbench import run_decision_benchmark
from topas_agents.policies import make_policy
from topas_agents.sim import make_trace, simulate
from topas_agents.workflow import load_workflow


@pytest.mark.parametrize("name", ["chain3", "dag4", "metagpt-tl"])
def test_topas_completes_every_task_with_engine_checks(name):
    wf = load_workflow(name)
    trace = make_trace(wf, 8, 0.2 if name != "metagpt-tl" else 0.01, seed=1)
    res = simulate(trace, make_policy("topas"), PROFILE, check=True)
    assert len(res.tasks) == 8 and res.mean_jct > 0


def test_ablations_and_no_host_tier_run_clean():
    wf = load_workflow("dag4")
    trace = make_trace(wf, 6, 0.15, seed=2)
    for name in ("topas-base", "topas-noreuse", "topas-noaging"):
        assert len(simulate(trace, make_policy(name), PROFILE, check=True).tasks) == 6
    res = simulate(trace, make_policy("topas"), PROFILE, host_tier=False, check=True)
    assert len(res.tasks) == 6


def test_unseen_workflow_with_wide_fork_uses_the_greedy_search():
    # 9 agents > enum_agents: the greedy/repair path, on a workflow nothing was tuned on
    wf = workflow("unseen", [("p", [])] + [(f"w{i}", ["p"]) for i in range(7)] + [("m", [f"w{i}" for i in range(7)])],
                  prefix=2048)
    trace = make_trace(wf, 5, 0.3, seed=3)
    res = simulate(trace, make_policy("topas"), PROFILE, check=True)
    assert len(res.tasks) == 5


def test_topas_beats_fcfs_on_a_loaded_chain():
    wf = load_workflow("chain3")
    trace = make_trace(wf, 30, 0.25, seed=0)
    topas = simulate(trace, make_policy("topas"), PROFILE)
    fcfs = simulate(trace, make_policy("fcfs"), PROFILE)
    assert topas.mean_jct < fcfs.mean_jct


def test_microbench_reports_decision_cost():
    out = run_decision_benchmark(["topas"], n_agents=12, n_waiting=60, seed=1, decisions=8, warmup=2, check=True)
    row = out["topas"]
    assert row["n"] == 8 and 0 < row["mean_ms"] <= row["p99_ms"] + 1e-9
