"""Bench core: oracle lower bound (hand-computed cases), capacity/load mapping, run_bench
JSON shape and trace sharing (fake simulator), and LB <= JCT on the real simulator."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topas_agents.bench import (
    BenchConfig,
    SimBackend,
    capacity_rps,
    lower_bound,
    run_bench,
    srpt_mean_response,
)
from topas_agents.bench.runner import RESULT_KEYS, plan_points, summarize
from topas_agents.bench.work import batch_cap, call_latency_s, call_work_s, critical_path_s
from topas_agents.costmodel import Profile, load_profile
from topas_agents.errors import ConfigError
from topas_agents.policies import BASELINES
from topas_agents.workflow import RoundPlan, TaskPlan, load_workflow, parse_workflow

HAVE_SIM = importlib.util.find_spec("topas_agents.sim") is not None
needs_sim = pytest.mark.skipif(not HAVE_SIM, reason="topas_agents.sim (the simulator) is not importable yet")

# A toy profile whose every step costs exactly 0.1 s plus a KV read of ctx/1000 s in decode:
# tc = 0 and no attention make a prefill cost 0.1 s whatever its size (recomputing a prefix is
# free), so a lone task's simulated JCT must equal its critical path exactly.
TOY = Profile(name="toy", gpu="none", model="none", kv_bytes_per_token=1, kv_budget_tokens=1000,
              tm_s=0.1, tc_s_per_token=0.0, lm_head_s=0.0, overhead_s=0.0, hbm_bytes_per_s=1000.0,
              attn_flops_per_token_pair=0.0, attn_flops_per_s=1.0, swap_bytes_per_s=1e9, host_tier=True)


def _wf(stages, agents=None, name="toy"):
    return parse_workflow({"name": name, "agents": agents or [{"name": "a", "prefix_tokens": 100}],
                           "stages": stages})


def _task(wf, rounds, arrival=0.0, task_id="t0"):
    return TaskPlan(task_id, wf, arrival, {s: tuple(RoundPlan(i, o) for i, o in rs) for s, rs in rounds.items()})


# ------------------------------------------------------------------ hand-computed bounds


def test_call_latency_by_hand():
    # prefill 0.1 (yields token 1), then 9 decode steps at mean context 100+50+10/2 = 155:
    # 0.1 + 155/1000 = 0.255 s each.
    assert call_latency_s(TOY, 100, 50, 10) == pytest.approx(0.1 + 9 * 0.255)
    assert call_latency_s(TOY, 100, 50, 1) == pytest.approx(0.1)  # the prefill's token only


def test_batch_cap_by_hand():
    assert batch_cap(1000, 100, 60, 60) == 1 + 840 // 60  # 15
    assert batch_cap(1000, 100, 900, 60) == 1  # alone exactly fits
    assert batch_cap(1000, 100, 901, 60) == 0  # cannot run


def test_call_work_by_hand():
    # cap 15; prefill share 0.1 * 50/1000; decode 9 x (0.1/15 + 155/1000)
    expected = 0.1 * 50 / 1000 + 9 * (0.1 / 15 + 0.155)
    assert call_work_s(TOY, 1000, 100, 50, 10, 60) == pytest.approx(expected)
    with pytest.raises(ConfigError, match="does not fit the KV budget of 1000"):
        call_work_s(TOY, 1000, 100, 850, 100, 60)


def test_critical_path_takes_longest_branch_and_counts_tool_waits():
    wf = _wf([
        {"name": "root", "agent": "a", "input_tokens": 10, "output_tokens": 1},
        {"name": "slow", "agent": "a", "after": ["root"], "requests": 3, "input_tokens": 10,
         "output_tokens": 1, "tool_wait_s": 2.0},
        {"name": "fast", "agent": "a", "after": ["root"], "input_tokens": 10, "output_tokens": 1},
        {"name": "join", "agent": "a", "after": ["slow", "fast"], "input_tokens": 10, "output_tokens": 1},
    ])
    task = _task(wf, {"root": [(10, 1)], "slow": [(10, 1)] * 3, "fast": [(10, 1)], "join": [(10, 1)]})
    # every call is one 0.1 s prefill; `slow` has 3 calls and 2 tool waits between them
    assert critical_path_s(TOY, task) == pytest.approx(0.1 + (0.3 + 4.0) + 0.1)


@pytest.mark.parametrize(
    ("arrivals", "works", "mean"),
    [
        ([0, 0], [1, 2], (1 + 3) / 2),
        ([0, 1], [3, 1], (1 + 4) / 2),  # the short job preempts the long one
        ([0, 10], [1, 1], 1.0),  # idle gap
        ([0, 0, 0], [0, 0, 5], 5 / 3),
        ([], [], 0.0),
    ],
)
def test_srpt_by_hand(arrivals, works, mean):
    assert srpt_mean_response(arrivals, works) == pytest.approx(mean)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0.01, 10)), min_size=1, max_size=25))
def test_srpt_bounds(jobs):
    arrivals, works = zip(*jobs, strict=True)
    mean = srpt_mean_response(arrivals, works)
    # no better than each job alone, no worse than FCFS (a feasible schedule)
    assert mean >= sum(works) / len(works) - 1e-9
    now, fcfs = 0.0, 0.0
    for a, w in sorted(jobs):
        now = max(now, a) + w
        fcfs += now - a
    assert mean <= fcfs / len(jobs) + 1e-9


def test_lower_bound_is_max_of_means():
    wf = _wf([{"name": "s", "agent": "a", "input_tokens": 50, "output_tokens": 10}])
    tasks = [_task(wf, {"s": [(50, 10)]}, arrival=0.0, task_id=f"t{i}") for i in range(40)]
    lb = lower_bound(tasks, TOY, 1000)
    assert lb.critical_path == pytest.approx(0.1 + 9 * 0.255)
    work = 0.1 * 50 / 1000 + 9 * (0.1 / 15 + 0.155)
    assert lb.work_bound == pytest.approx(work * (40 + 1) / 2)  # 40 equal jobs at t=0
    assert lb.mean_jct == max(lb.critical_path, lb.work_bound) == lb.work_bound
    assert lower_bound([], TOY).mean_jct == 0.0


# ------------------------------------------------------------------ capacity / load


def test_capacity_is_positive_and_grows_with_budget():
    prof = load_profile()
    for name in ("chain3", "dag4", "dag10wide", "metagpt-sop", "metagpt-tl"):
        wf = load_workflow(name)
        small, big = capacity_rps(wf, prof, 17_500), capacity_rps(wf, prof, 40_000)
        assert 0 < small < big


def test_capacity_matches_the_cost_facts_chain3_number():
    # serving-cost-facts: chain3 at 0.15 task/s is load 0.46 with one prefix resident.
    assert 0.15 / capacity_rps(load_workflow("chain3"), load_profile()) == pytest.approx(0.46, abs=0.01)


def test_capacity_rejects_a_budget_that_cannot_run_the_workflow():
    with pytest.raises(ConfigError, match="cannot hold stage 's1'"):
        capacity_rps(load_workflow("chain3"), load_profile(), 4000)


class FakeRun:
    def __init__(self, metrics):
        self.metrics = metrics

    def as_dict(self):
        return dict(self.metrics)


class FakeSim:
    """Records what each simulate call got; JCT = 100 s x a per-policy factor."""

    FACTOR = {"fcfs": 2.0, "lpm": 1.5, "parrot": 3.0, "las": 4.0, "spf": 1.6}

    def __init__(self):
        self.calls = []

    def make_trace(self, wf, n, rate, seed):
        import random

        from topas_agents.workflow import sample_task

        rng = random.Random(seed)
        return tuple(sample_task(wf, f"t{i}", i / rate, rng) for i in range(n))

    def simulate(self, trace, policy, profile, **kw):
        self.calls.append((trace, policy.name, kw))
        jct = 100.0 * self.FACTOR[policy.name]
        return FakeRun({k: 0.0 for k in RESULT_KEYS} | {"mean_jct": jct, "p99_jct": 2 * jct,
                                                        "decision_ms_p99": math.nan})

    @property
    def backend(self):
        return SimBackend(self.make_trace, self.simulate)


def test_load_maps_to_rate_linearly():
    fake = FakeSim()
    wf, prof = load_workflow("dag4"), load_profile()
    cap = capacity_rps(wf, prof)
    cfg = BenchConfig(policies=("fcfs",), profile=prof, workflow=wf, loads=(0.2, 0.5, 0.9), tasks=3)
    points = plan_points(cfg, fake.backend)
    assert [p.rate for p in points] == pytest.approx([0.2 * cap, 0.5 * cap, 0.9 * cap])
    assert [p.load for p in points] == [0.2, 0.5, 0.9]
    # no rates/loads: the workflow's default loads
    default = plan_points(replace(cfg, loads=()), fake.backend)
    assert [p.load for p in default] == list(wf.loads)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.01, 3.0), min_size=2, max_size=5, unique=True))
def test_load_to_rate_is_monotone(loads):
    fake = FakeSim()
    cfg = BenchConfig(policies=("fcfs",), profile=load_profile(), workflow=load_workflow("chain3"),
                      loads=tuple(sorted(loads)), tasks=1)
    rates = [p.rate for p in plan_points(cfg, fake.backend)]
    assert rates == sorted(rates) and len(set(rates)) == len(rates)


# ------------------------------------------------------------------ run_bench (fake simulator)


def _fake_result(policies=("fcfs", "lpm", "spf"), **kw):
    fake = FakeSim()
    cfg = BenchConfig(policies=policies, profile=load_profile(), workflow=load_workflow("chain3"),
                      rates=(0.05, 0.1), tasks=4, seed=3, **kw)
    return fake, run_bench(cfg, backend=fake.backend)


def test_json_shape_is_exact():
    _, res = _fake_result()
    assert list(res) == ["workload", "profile", "seed", "tasks", "capacity_rps", "host_tier", "policy_options",
                         "points", "summary"]
    assert res["policy_options"] == {}  # every policy at its defaults
    assert (res["workload"], res["profile"], res["seed"], res["tasks"]) == ("chain3", "a100-80g-qwen2.5-32b", 3, 4)
    assert res["host_tier"] == {"setup": "all", "policies": {"fcfs": True, "lpm": True, "spf": True}}
    for pt in res["points"]:
        assert list(pt) == ["rate", "load", "lower_bound", "results"]
        assert pt["load"] is None
        assert list(pt["lower_bound"]) == ["mean_jct", "critical_path", "work_bound"]
        assert list(pt["results"]) == ["fcfs", "lpm", "spf"]
        for row in pt["results"].values():
            assert list(row) == [*RESULT_KEYS, "prefix_recomputes", "host_tier", "gap"]
            assert row["gap"] == pytest.approx(row["mean_jct"] / pt["lower_bound"]["mean_jct"] - 1)
            assert row["decision_ms_p99"] is None  # NaN is not JSON: reported as null
    assert [pt["rate"] for pt in res["points"]] == [0.05, 0.1]


def test_every_policy_gets_the_same_trace_and_options():
    fake, _ = _fake_result(kv_budget=20_000, host_tier=False)
    by_rate: dict[float, set] = {}
    for trace, _, kw in fake.calls:
        by_rate.setdefault(trace[1].arrival_s - trace[0].arrival_s, set()).add(id(trace))
        assert kw["kv_budget"] == 20_000 and kw["host_tier"] is False and kw["check"] is False
    assert len(by_rate) == 2 and all(len(ids) == 1 for ids in by_rate.values())
    assert [name for _, name, _ in fake.calls] == ["fcfs", "lpm", "spf"] * 2


def test_summary_ratios_to_best_baseline():
    _, res = _fake_result()
    s = res["summary"]
    assert all(v["best_baseline"] == "lpm" for v in s.values())
    assert s["lpm"]["mean_jct_vs_best_baseline"] == pytest.approx(1.0)
    assert s["fcfs"]["mean_jct_vs_best_baseline"] == pytest.approx(2.0 / 1.5)
    assert s["spf"]["p99_jct"] == pytest.approx(320.0)


def test_summary_picks_the_best_baseline_per_metric():
    points = [{"results": {"fcfs": {"mean_jct": 10.0, "p99_jct": 20.0},
                           "lpm": {"mean_jct": 8.0, "p99_jct": 30.0},
                           "topas": {"mean_jct": 6.0, "p99_jct": 18.0}}}]
    s = summarize(points, ["fcfs", "lpm", "topas"])["topas"]
    assert (s["best_baseline"], s["best_baseline_p99"]) == ("lpm", "fcfs")
    assert s["mean_jct_vs_best_baseline"] == pytest.approx(6.0 / 8.0)
    assert s["p99_jct_vs_best_baseline"] == pytest.approx(18.0 / 20.0)


def test_summary_without_baselines_has_no_ratio():
    points = [{"results": {"x": {"mean_jct": 1.0, "p99_jct": 2.0}}}]
    assert summarize(points, ["x"])["x"]["mean_jct_vs_best_baseline"] is None


def test_bad_configs_fail_before_simulating():
    fake = FakeSim()
    wf, prof = load_workflow("chain3"), load_profile()
    with pytest.raises(ConfigError, match="cannot hold stage"):
        run_bench(BenchConfig(policies=("fcfs",), profile=prof, workflow=wf, kv_budget=1000), backend=fake.backend)
    with pytest.raises(ConfigError, match=r"policy 'fcfs' has no option 'bogus'"):
        run_bench(BenchConfig(policies=("fcfs",), profile=prof, workflow=wf, policy_options={"fcfs": {"bogus": 1}}),
                  backend=fake.backend)
    with pytest.raises(ConfigError, match="rates or loads, not both"):
        run_bench(BenchConfig(policies=("fcfs",), profile=prof, workflow=wf, rates=(1,), loads=(1,)),
                  backend=fake.backend)
    assert fake.calls == []


# ------------------------------------------------------------------ the real simulator


@needs_sim
def test_lone_task_jct_equals_critical_path_exactly():
    """On the toy profile nothing but the critical path costs time: LB must be tight, which
    pins down that the bound models the simulator's steps and tool waits exactly."""
    from topas_agents.bench.runner import build_policy
    from topas_agents.sim import simulate

    wf = _wf([
        {"name": "p", "agent": "a", "requests": 2, "input_tokens": 40, "output_tokens": 7, "tool_wait_s": 1.5},
        {"name": "q", "agent": "b", "after": ["p"], "input_tokens": 30, "output_tokens": 12},
        {"name": "r", "agent": "a", "after": ["q"], "requests": 3, "input_tokens": 20, "output_tokens": 3,
         "tool_wait_s": 0.25},
    ], agents=[{"name": "a", "prefix_tokens": 100}, {"name": "b", "prefix_tokens": 50}])
    task = _task(wf, {"p": [(40, 7), (35, 5)], "q": [(30, 12)], "r": [(20, 3), (10, 2), (20, 2)]})
    # p: 0.1 + 6 x (0.1 + 0.1435) and 0.1 + 4 x (0.1 + 0.1375), one 1.5 s wait; q: 0.1 + 11 x 0.186;
    # r: three calls and two 0.25 s waits.
    assert critical_path_s(TOY, task) == pytest.approx(
        (1.561 + 1.05 + 1.5) + 2.146 + (0.1 + 2 * 0.2215 + 0.1 + 0.2110 + 0.1 + 0.2210 + 0.5))
    for name in BASELINES:
        run = simulate([task], build_policy(name), TOY)
        assert run.tasks[0].jct_s == pytest.approx(critical_path_s(TOY, task), rel=1e-9), name


@needs_sim
def test_parallel_branches_of_one_task_share_steps_so_the_bound_has_slack():
    """Two branches decoding together make every step read both contexts: slower than
    either alone, so the batch-1 critical path stays a bound but is no longer attained."""
    from topas_agents.bench.runner import build_policy
    from topas_agents.sim import simulate

    wf = _wf([
        {"name": "root", "agent": "a", "input_tokens": 10, "output_tokens": 2},
        {"name": "x", "agent": "a", "after": ["root"], "input_tokens": 30, "output_tokens": 12},
        {"name": "y", "agent": "a", "after": ["root"], "input_tokens": 30, "output_tokens": 12},
    ])
    task = _task(wf, {"root": [(10, 2)], "x": [(30, 12)], "y": [(30, 12)]})
    run = simulate([task], build_policy("fcfs"), TOY)
    assert critical_path_s(TOY, task) < run.tasks[0].jct_s


@needs_sim
def test_single_token_call_completes_at_its_critical_path():
    """A call whose only token comes from its prefill (regression: the simulator once
    released such a request from the prefill queue twice)."""
    from topas_agents.bench.runner import build_policy
    from topas_agents.sim import simulate

    wf = _wf([{"name": "s", "agent": "a", "input_tokens": 10, "output_tokens": 1}])
    task = _task(wf, {"s": [(10, 1)]})
    run = simulate([task], build_policy("fcfs"), TOY)
    assert run.tasks[0].jct_s == pytest.approx(critical_path_s(TOY, task)) == pytest.approx(0.1)


def _available(names):
    from topas_agents.bench.runner import build_policy

    out = []
    for name in names:
        try:
            build_policy(name)
            out.append(name)
        except ConfigError:
            pass
    return tuple(out)


ALL_POLICIES = (*BASELINES, "topas")


def _small_runs(workload, rate, n, policies=ALL_POLICIES, **kw):
    from topas_agents.bench.runner import build_policy
    from topas_agents.sim import make_trace, simulate

    prof = load_profile()
    trace = make_trace(load_workflow(workload), n, rate, 1)
    lb = lower_bound(trace, prof, kw.get("kv_budget"))
    return trace, lb, {p: simulate(trace, build_policy(p), prof, **kw) for p in _available(policies)}


@needs_sim
@pytest.mark.parametrize("workload", ["chain3", "dag4", "dag10wide", "metagpt-sop", "metagpt-tl"])
def test_lower_bound_below_every_policy(workload):
    cap = capacity_rps(load_workflow(workload), load_profile())
    for load, n in ((0.2, 10), (2.0, 14)):  # light, and overloaded so the work bound binds
        trace, lb, runs = _small_runs(workload, load * cap, n)
        for name, run in runs.items():
            assert lb.mean_jct <= run.mean_jct * (1 + 1e-9), (workload, load, name)
            for t in run.tasks:  # per task, the critical path is a bound too
                plan = next(p for p in trace if p.task_id == t.task_id)
                assert critical_path_s(load_profile(), plan) <= t.jct_s * (1 + 1e-9)


@needs_sim
def test_work_bound_binds_under_a_burst():
    trace, lb, runs = _small_runs("chain3", 50.0, 30, policies=("fcfs", "lpm"), kv_budget=12_000)
    assert lb.work_bound > lb.critical_path
    assert all(lb.mean_jct <= r.mean_jct for r in runs.values())


@needs_sim
def test_real_bench_same_arrivals_for_every_policy():
    cfg = BenchConfig(policies=("fcfs", "spf"), profile=load_profile(), workflow=load_workflow("dag4"),
                      loads=(0.2, 0.5), tasks=8, seed=2)
    res = run_bench(cfg)
    for pt in res["points"]:
        assert pt["load"] in (0.2, 0.5)
        for row in pt["results"].values():
            assert row["gap"] >= -1e-9
            assert row["mean_jct"] <= row["p99_jct"] * (1 + 1e-9) or row["p99_jct"] >= 0
    assert res["points"][0]["rate"] < res["points"][1]["rate"]


def test_the_front_end_overhead_is_in_the_lower_bound_and_the_capacity():
    # the simulator charges call_overhead_s on a FIFO front end; the bound and the load left
    # it out (JCTs twice the "lower bound", and --load 0.5 a front end at 300%)
    import dataclasses

    from topas_agents.bench.capacity import capacity_rps
    from topas_agents.bench.lower_bound import lower_bound
    from topas_agents.costmodel import load_profile
    from topas_agents.policies import make_policy
    from topas_agents.sim import make_trace, simulate
    from topas_agents.workflow import load_workflow

    wf, plain = load_workflow("chain3"), load_profile("a100-80g-qwen2.5-32b")
    slow = dataclasses.replace(plain, call_overhead_s=5.0)
    trace = make_trace(wf, 20, 0.01, 0)
    assert lower_bound(trace, slow).critical_path == pytest.approx(lower_bound(trace, plain).critical_path + 15.0)
    assert capacity_rps(wf, slow) == pytest.approx(1 / 15.0)  # 3 calls x 5 s: the front end is the bottleneck
    assert capacity_rps(wf, plain) > 1 / 15.0
    run = simulate(trace, make_policy("lpm"), slow)
    assert run.mean_jct >= lower_bound(trace, slow).mean_jct - 1e-9
