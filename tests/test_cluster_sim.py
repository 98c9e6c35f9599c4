"""The simulated cluster: routers, the lockstep co-simulation and the cluster bench."""

from __future__ import annotations

import argparse
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topas_agents.bench.capacity import capacity_rps
from topas_agents.cluster.bench import ClusterBenchConfig, run_cluster_bench
from topas_agents.cluster.cli import add_cluster_bench_options, run_cluster_from_args
from topas_agents.cluster.cosim import simulate_cluster
from topas_agents.cluster.routing import (
    ROUTERS,
    CacheAware,
    CacheAwareSettings,
    CallInfo,
    GroupPinned,
    agent_demand,
    group_replicas,
    make_router,
)
from topas_agents.costmodel import DEFAULT_PROFILE, load_profile
from topas_agents.errors import ConfigError
from topas_agents.policies import make_policy
from topas_agents.server.cluster.cli import add_replica_options, replica_serve_args
from topas_agents.sim import make_trace
from topas_agents.workflow import load_workflow

PROFILE = load_profile(DEFAULT_PROFILE)
CHAIN3 = load_workflow("chain3")


def _router(name: str):
    return make_router(name, workflows=(CHAIN3,), profile=PROFILE)


def _trace(n_tasks: int, replicas: int, load: float = 0.5, seed: int = 0):
    return make_trace(CHAIN3, n_tasks, load * replicas * capacity_rps(CHAIN3, PROFILE), seed)


def test_one_replica_makes_routing_irrelevant():
    trace = _trace(12, 1)
    runs = [simulate_cluster(trace, lambda: make_policy("topas", {}), 1, _router(r), PROFILE) for r in ROUTERS]
    assert len({(r.mean_jct, r.p99_jct) for r in runs}) == 1
    assert all(r.split_tasks == 0 and r.calls_per_replica == (36,) for r in runs)


def test_router_shapes():
    trace = _trace(24, 3)
    run = lambda name: simulate_cluster(trace, lambda: make_policy("lpm", {}), 3, _router(name), PROFILE)  # noqa: E731
    task = run("task")
    assert task.split_tasks == 0 and sum(task.calls_per_replica) == 72
    agent = run("agent")
    assert sorted(agent.calls_per_replica) == [24, 24, 24]  # one agent per replica
    assert agent.split_tasks == 24
    rr = run("round-robin")
    assert max(rr.calls_per_replica) - min(rr.calls_per_replica) <= 1
    group = run("group")  # three equal agents on three replicas: one agent each
    assert sorted(group.calls_per_replica) == [24, 24, 24]


def test_group_sizes_follow_demand():
    assert group_replicas({"a": 3.0, "b": 1.0}, 6) == {"a": (0, 1, 2, 3), "b": (4, 5)}
    assert group_replicas({"a": 1.0, "b": 1.0, "c": 1.0}, 8) == {"a": (0, 1, 2), "b": (3, 4, 5), "c": (0, 6, 7)}
    assert group_replicas({"a": 1.0, "b": 1.0, "c": 1.0}, 4) == {"a": (0, 1), "b": (2,), "c": (3,)}
    packed = group_replicas({"a": 5.0, "b": 3.0, "c": 2.0, "d": 1.0}, 2)
    assert packed == {"a": (0,), "b": (1,), "c": (1,), "d": (0,)}
    demand = agent_demand([load_workflow("metagpt-sop")], PROFILE)
    assert all(v > 0 for v in demand.values())
    groups = group_replicas(demand, 4)  # the engineer carries over half the work: two replicas
    assert len(groups["engineer"]) == 2 and set().union(*groups.values()) == {0, 1, 2, 3}
    with pytest.raises(ConfigError):
        make_router("group")


def test_group_pinning_by_hand():
    call = CallInfo("t1", "b", 4096, 512)
    router = GroupPinned({"a": 1.0, "b": 1.0}, groups={"a": [0], "b": [1, 3]})
    assert router.route(call, [0, 5, 0, 2]) == 3  # the least-loaded replica of b's own group
    assert router.route(CallInfo("t1", "z", 1, 1), [4, 3, 1, 2]) == 2  # unpinned: any replica
    with pytest.raises(ConfigError, match="pinned to replicas"):
        router.route(call, [0, 0])  # replica 3 does not exist


def test_cache_aware_model():
    router = CacheAware(CacheAwareSettings(cache_threshold=0.5, balance_abs_threshold=2, balance_rel_threshold=1.5))
    call = CallInfo("t1", "a", prefix_tokens=900, input_tokens=100)
    first = router.route(call, [0, 0, 0])
    assert router.route(CallInfo("t2", "a", 900, 100), [1, 0, 0]) == first  # the prefix holder wins
    assert router.route(CallInfo("t3", "b", 900, 100), [1, 0, 0]) != first  # new agent: smallest tree
    assert router.route(CallInfo("t4", "a", 900, 100), [9, 0, 1]) == 1  # imbalance: least loaded
    assert router.route(CallInfo("t5", "a", 10, 990), [0, 0, 0]) == 2  # low match ratio: smallest tree
    with pytest.raises(ConfigError):
        make_router("lpm")


@settings(max_examples=8, deadline=None)
@given(replicas=st.integers(1, 4), router=st.sampled_from(ROUTERS), seed=st.integers(0, 50))
def test_every_task_finishes_under_every_router(replicas, router, seed):
    trace = _trace(6, replicas, load=0.6, seed=seed)
    run = simulate_cluster(trace, lambda: make_policy("fcfs", {}), replicas, _router(router), PROFILE)
    assert sum(run.calls_per_replica) == 18 and len(run.calls_per_replica) == replicas
    assert run.mean_jct > 0 and run.p99_jct >= run.mean_jct * 0.999


def test_cluster_bench_document():
    cfg = ClusterBenchConfig(workflow=CHAIN3, profile=PROFILE, policies=("topas", "lpm"),
                             routers=("task", "cache"), replicas=(2,), loads=(0.4,), tasks_per_replica=6,
                             scaling_pairs=(("topas", "task"),), scaling_replicas=(1, 2),
                             policy_options={"topas": {"beta": 0.5}})
    doc = run_cluster_bench(cfg)
    json.dumps(doc)  # JSON-ready
    assert doc["policy_options"] == {"topas": {"beta": "0.5"}}  # the variant the runs are
    s = doc["by_replicas"][0]["summary"]
    assert set(s["pairs"]) == {"topas+task", "topas+cache", "lpm+task", "lpm+cache"}
    assert s["best_baseline_mean_jct"]["pair"].startswith("lpm+")
    head = s["headline"]
    assert head["topas_best_router"] in ("topas+task", "topas+cache")
    assert head["mean_jct_vs_lpm_cache"] == pytest.approx(head["topas"]["mean_jct"] / s["pairs"]["lpm+cache"]["mean_jct"])
    rows = doc["scaling"][0]["rows"]
    assert [r["replicas"] for r in rows] == [1, 2] and rows[0]["efficiency"] in (1.0, None)


def test_bench_cli_hand_off(tmp_path, capsys):
    p = argparse.ArgumentParser()
    for flag, default in (("--workload", None), ("--profile", DEFAULT_PROFILE), ("--load", None),
                          ("--kv-budget", None), ("--json", None)):
        p.add_argument(flag, default=default)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policies", type=lambda t: t.split(","), default=["lpm"])
    add_cluster_bench_options(p)
    out = tmp_path / "c.json"
    args = p.parse_args(["--workload", "chain3", "--replicas", "2", "--router", "task,least-load",
                         "--tasks-per-replica", "4", "--json", str(out)])
    args.load = (0.3,)
    assert run_cluster_from_args(args) == 0
    assert "lpm+task" in capsys.readouterr().out
    assert json.loads(out.read_text())["by_replicas"][0]["replicas"] == 2
    with pytest.raises(SystemExit):
        p.parse_args(["--router", "lpm"])


def test_serve_cli_replica_args():
    p = argparse.ArgumentParser()
    p.add_argument("--policy", default="topas")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--workflow", action="append", default=[])
    p.add_argument("--port", type=int, default=8000)
    add_replica_options(p)
    args = p.parse_args(["--replicas", "3", "--workflow", "chain3", "--workflow", "diamond",
                         "--router-policy", "cache_aware", "--time-scale", "5"])
    assert args.replicas == 3 and args.router_policy == "cache_aware"
    assert replica_serve_args(args) == ("--policy", "topas", "--time-scale", "5.0",
                                         "--workflow", "chain3", "--workflow", "diamond")
    # an SGLang replica gets no sim-only option (topas serve refuses them there), and the
    # sglang-only ones reach it
    sglang = argparse.Namespace(**{**vars(args), "engine": "sglang", "model_path": "/m", "decision_log": "d.jsonl"})
    assert replica_serve_args(sglang) == ("--policy", "topas", "--model-path", "/m", "--decision-log", "d.jsonl",
                                          "--workflow", "chain3", "--workflow", "diamond")
    sim = argparse.Namespace(**{**vars(sglang), "engine": "sim"})
    assert "--model-path" not in replica_serve_args(sim) and "--time-scale" in replica_serve_args(sim)
    named = argparse.Namespace(**{**vars(sglang), "model_name": "m", "drain_timeout": 5.0})
    assert "--model-name" not in replica_serve_args(named) and "--drain-timeout" not in replica_serve_args(named)
    named_sim = argparse.Namespace(**{**vars(named), "engine": "sim"})
    assert {"--model-name", "--drain-timeout"} <= set(replica_serve_args(named_sim))
