"""A 1-replica simulated cluster is the single engine, event for event (cluster/cosim.py): the
same trace gives every task the same JCT, with or without the profile's per-call overhead,
which each replica's own front end charges."""

from __future__ import annotations

import dataclasses

import pytest

from topas_agents.bench.capacity import capacity_rps
from topas_agents.bench.lower_bound import lower_bound
from topas_agents.cluster.cosim import simulate_cluster
from topas_agents.cluster.routing import make_router
from topas_agents.costmodel import DEFAULT_PROFILE, load_profile
from topas_agents.policies import make_policy
from topas_agents.sim import make_trace, simulate
from topas_agents.workflow import load_workflow

PROFILE = load_profile(DEFAULT_PROFILE)
# a front end slow enough to matter: a call's overhead is a sizeable share of its service
SLOW_FRONT = dataclasses.replace(PROFILE, call_overhead_s=5.0)


def _pair(workload: str, policy: str, profile, n_tasks: int, load: float = 0.6):
    wf = load_workflow(workload)
    trace = make_trace(wf, n_tasks, load * capacity_rps(wf, profile), seed=3)
    one = simulate(trace, make_policy(policy, {}), profile)
    cluster = simulate_cluster(trace, lambda: make_policy(policy, {}), 1,
                               make_router("task", workflows=(wf,), profile=profile), profile)
    return trace, one, cluster


# chain3: one call a stage; metagpt-sop: ReAct rounds with tool waits and a parallel stage
@pytest.mark.parametrize(("workload", "n_tasks"), [("chain3", 16), ("metagpt-sop", 6)])
# topas-core: workflow-aware (reads StageDone events) and fast; `topas` adds its forecast guard
@pytest.mark.parametrize("policy", ["topas-core", "lpm"])
def test_one_replica_is_the_single_engine(workload, n_tasks, policy):
    _, one, cluster = _pair(workload, policy, PROFILE, n_tasks)
    assert cluster.task_jcts == tuple(t.jct_s for t in one.tasks)
    assert (cluster.mean_jct, cluster.p99_jct, cluster.makespan_s) == (one.mean_jct, one.p99_jct, one.makespan_s)
    assert cluster.preemptions == one.preemptions and cluster.prefix_swaps == one.prefix_swaps


@pytest.mark.parametrize("workload", ["chain3", "metagpt-sop"])
def test_each_replica_charges_the_call_overhead(workload):
    """The capacity behind --load counts the front end, and so does the cluster: one replica
    gives the single engine's JCTs, never below the lower bound (it was a third below it)."""
    trace, one, cluster = _pair(workload, "fcfs", SLOW_FRONT, 6)
    assert cluster.task_jcts == tuple(t.jct_s for t in one.tasks)
    assert cluster.mean_jct >= lower_bound(trace, SLOW_FRONT).mean_jct
    _, _, free = _pair(workload, "fcfs", PROFILE, 6)
    assert cluster.mean_jct > free.mean_jct  # the overhead is charged at all


def test_front_ends_are_per_replica():
    """Each replica has its own FIFO front end. With an overhead far above the GPU work and a
    burst of tasks, a replica's front end is the bottleneck: the run takes at least the calls
    of the busiest replica times the overhead, and less than all calls times it (what one
    front end shared by the replicas would take)."""
    wf = load_workflow("chain3")
    front_bound = dataclasses.replace(PROFILE, call_overhead_s=100.0)
    trace = make_trace(wf, 8, 100 * capacity_rps(wf, front_bound), seed=1)  # a burst
    run = simulate_cluster(trace, lambda: make_policy("fcfs", {}), 2,
                           make_router("task", workflows=(wf,), profile=front_bound), front_bound)
    overhead = front_bound.call_overhead_s
    assert min(run.calls_per_replica) > 0
    assert max(run.calls_per_replica) * overhead <= run.makespan_s < sum(run.calls_per_replica) * overhead
