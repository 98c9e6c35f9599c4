"""make_trace and simulate: arrivals, DAG release, tool waits, metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from topas_agents import costmodel
from topas_agents.costmodel import load_profile
from topas_agents.errors import ConfigError
from topas_agents.policies import make_policy
from topas_agents.sim import BENCH_KEYS, StallError, make_trace, simulate
from topas_agents.snapshot import NOOP, Decision, Snapshot
from topas_agents.workflow import load_workflow, parse_workflow

PROFILE = load_profile()
PROFILE_PATH = Path(costmodel.__file__).parent / "profiles" / f"{costmodel.DEFAULT_PROFILE}.yaml"
DAG4 = load_workflow("dag4")


def test_make_trace_is_poisson_seeded_and_rate_independent_in_content() -> None:
    trace = make_trace(DAG4, 400, 0.5, seed=3)
    assert [tp.task_id for tp in trace[:3]] == ["dag4-0", "dag4-1", "dag4-2"]
    arrivals = np.array([tp.arrival_s for tp in trace])
    assert np.all(np.diff(arrivals) > 0) and arrivals[0] > 0
    assert np.mean(np.diff(arrivals)) == pytest.approx(2.0, rel=0.15)
    assert make_trace(DAG4, 400, 0.5, seed=3) == trace
    faster = make_trace(DAG4, 400, 2.0, seed=3)
    assert [tp.rounds for tp in faster] == [tp.rounds for tp in trace]  # same tasks, other times
    assert faster[-1].arrival_s < trace[-1].arrival_s
    with pytest.raises(ConfigError):
        make_trace(DAG4, 3, 0.0, seed=0)
    with pytest.raises(ConfigError):
        make_trace(DAG4, -1, 1.0, seed=0)


def test_metrics_follow_their_definitions() -> None:
    trace = make_trace(DAG4, 20, 0.05, seed=1)
    seen: list[tuple[int, int]] = []
    res = simulate(trace, make_policy("fcfs"), PROFILE, progress=lambda d, n: seen.append((d, n)))
    assert seen == [(i, 20) for i in range(1, 21)]
    jct = np.array([t.jct_s for t in res.tasks])
    first_arrival = min(tp.arrival_s for tp in trace)
    assert res.mean_jct == pytest.approx(jct.mean())
    assert res.p99_jct == pytest.approx(np.percentile(jct, 99))
    assert res.makespan_s == pytest.approx(max(t.finish_s for t in res.tasks) - first_arrival)
    assert res.first_task_s == pytest.approx(min(t.finish_s for t in res.tasks) - first_arrival)
    n_requests = sum(len(r) for tp in trace for r in tp.rounds.values())
    assert res.requests == n_requests
    assert res.throughput_rps == pytest.approx(n_requests / res.makespan_s)
    assert res.prefix_swaps == res.stats.prefix_swaps_in + res.stats.prefix_swaps_out
    d = res.as_dict()
    assert tuple(d) == BENCH_KEYS and all(isinstance(v, int | float) for v in d.values())
    assert {"makespan_s", "requests", "prefix_recomputes"} <= set(res.as_dict(full=True))


def test_stages_wait_for_all_predecessors_and_rounds_for_tool_waits() -> None:
    wf = parse_workflow({
        "name": "w",
        "agents": [{"name": "a", "prefix_tokens": 100}, {"name": "b", "prefix_tokens": 100}],
        "stages": [
            {"name": "x", "agent": "a", "requests": 1, "input_tokens": 10, "output_tokens": 5},
            {"name": "y", "agent": "b", "requests": 3, "input_tokens": 10, "output_tokens": 5, "tool_wait_s": 7.0},
            {"name": "z", "agent": "a", "after": ["x", "y"], "input_tokens": 10, "output_tokens": 5},
        ],
    })

    class Recorder:
        name = "rec"

        def __init__(self) -> None:
            self.fcfs = make_policy("fcfs")
            self.first_seen: dict[str, float] = {}
            self.done: dict[str, float] = {}

        def decide(self, snap: Snapshot) -> Decision:
            for r in snap.waiting:
                self.first_seen.setdefault(r.rid, snap.now)
            for e in snap.events:
                self.done.setdefault(e.stage, e.time_s)
            return self.fcfs.decide(snap)

    rec = Recorder()
    res = simulate(make_trace(wf, 1, 1.0, seed=0), rec, PROFILE, check=True)
    seen = {rid.split("/", 1)[1]: t for rid, t in rec.first_seen.items()}
    assert seen["y/1"] - seen["y/0"] >= 7.0 and seen["y/2"] - seen["y/1"] >= 7.0
    assert seen["z/0"] >= max(rec.done["x"], rec.done["y"])
    assert res.tasks[0].finish_s > seen["z/0"]


def test_a_policy_that_never_admits_stalls_loudly() -> None:
    class Never:
        name = "never"

        def decide(self, snap: Snapshot) -> Decision:
            return NOOP

    with pytest.raises(StallError, match="policy 'never' left 1 requests waiting"):
        simulate(make_trace(DAG4, 1, 1.0, seed=0), Never(), PROFILE)


def test_empty_trace() -> None:
    res = simulate((), make_policy("fcfs"), PROFILE)
    assert res.tasks == () and res.mean_jct == 0.0 and res.requests == 0


def test_call_overhead_delays_every_call_of_a_chain_and_zero_changes_nothing() -> None:
    chain = load_workflow("chain3")
    trace = make_trace(chain, 1, 1.0, seed=4)  # one task: no queueing, calls strictly in sequence
    base = simulate(trace, make_policy("fcfs"), PROFILE)
    zero = simulate(trace, make_policy("fcfs"), load_profile(call_overhead_s=0.0))
    assert zero == base
    slow = simulate(trace, make_policy("fcfs"), load_profile(call_overhead_s=0.25))
    assert slow.requests == base.requests >= 3
    assert slow.mean_jct == pytest.approx(base.mean_jct + 0.25 * base.requests, rel=1e-9)
    assert slow.stats.busy_s == pytest.approx(base.stats.busy_s)  # model time is unchanged


def test_profiles_default_call_overhead_to_zero_and_reject_negative(tmp_path: Path) -> None:
    import yaml

    data = yaml.safe_load(PROFILE_PATH.read_text())
    assert data["call_overhead_s"] == 0.0 and PROFILE.call_overhead_s == 0.0
    del data["call_overhead_s"]  # profiles written before the field still load
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(data))
    assert load_profile(tmp_path / "old.yaml").call_overhead_s == 0.0
    data["call_overhead_s"] = -0.1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="call_overhead_s"):
        load_profile(tmp_path / "bad.yaml")


@pytest.mark.parametrize(("field", "value"), [
    ("tc_s_per_token", float("nan")),  # was reported as "arrival rate must be > 0"
    ("swap_bytes_per_s", float("inf")),  # swaps were free
    ("hbm_bytes_per_s", 0),  # every step infinite
    ("tm_s", -0.01),
    ("kv_budget_tokens", 0),
])
def test_profile_values_are_checked_when_loaded(tmp_path: Path, field: str, value: float) -> None:
    import yaml

    data = yaml.safe_load(PROFILE_PATH.read_text())
    data[field] = value
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=f"{field} must be a finite number"):
        load_profile(tmp_path / "bad.yaml")


def test_concurrent_calls_queue_for_the_one_front_end() -> None:
    one_call = parse_workflow({"name": "one", "agents": [{"name": "a", "prefix_tokens": 0}],
                               "stages": [{"name": "s", "agent": "a", "requests": 1, "input_tokens": 10,
                                           "output_tokens": 2}]})
    trace = make_trace(one_call, 4, 1e9, seed=0)  # four tasks at (practically) the same instant
    model = simulate(trace, make_policy("fcfs"), PROFILE)
    slow = simulate(trace, make_policy("fcfs"), load_profile(call_overhead_s=5.0))
    jcts = sorted(t.jct_s for t in slow.tasks)
    # FIFO: the i-th call leaves the front-end after (i + 1) overheads; model time is < 1 s here
    assert all(5.0 * (i + 1) <= j < 5.0 * (i + 1) + 1.0 for i, j in enumerate(jcts))
    assert max(t.jct_s for t in model.tasks) < 1.0


@pytest.mark.parametrize("arrival", [float("nan"), float("inf"), "1.0", True, None])
def test_a_task_arrival_must_be_a_finite_time(arrival) -> None:
    # before: a NaN arrival hung simulate() for ever, inf gave a NaN JCT
    import random

    from topas_agents.workflow import sample_task
    with pytest.raises(ConfigError, match="arrival time"):
        sample_task(DAG4, "t", arrival, random.Random(0))


@pytest.mark.parametrize("task_id", ["", None, 7])
def test_a_task_id_must_be_a_non_empty_string(task_id) -> None:
    import random

    from topas_agents.workflow import sample_task
    with pytest.raises(ConfigError, match="task id"):
        sample_task(DAG4, task_id, 0.0, random.Random(0))


def test_simulate_accepts_a_generator_trace() -> None:
    # before: the generator was spent collecting workflows, and the run reported 0 tasks
    trace = make_trace(DAG4, 3, 0.5, seed=0)
    run = simulate((tp for tp in trace), make_policy("fcfs"), PROFILE)
    assert len(run.tasks) == 3
    assert run.mean_jct == simulate(trace, make_policy("fcfs"), PROFILE).mean_jct


def test_simulate_refuses_two_workflows_of_one_name() -> None:
    other = parse_workflow({"name": "dag4", "agents": [{"name": "x", "prefix_tokens": 64}],
                            "stages": [{"name": "s", "agent": "x", "input_tokens": 8, "output_tokens": 8}]})
    trace = make_trace(DAG4, 2, 0.5, seed=0) + make_trace(other, 2, 0.5, seed=1)
    with pytest.raises(ConfigError, match="two different workflows are named 'dag4'"):
        simulate(trace, make_policy("fcfs"), PROFILE)
    # the same definition loaded twice is one workflow
    import random

    from topas_agents.workflow import sample_task
    twice = make_trace(DAG4, 2, 0.5, seed=0) + (sample_task(load_workflow("dag4"), "again", 1.0, random.Random(1)),)
    assert len(simulate(twice, make_policy("fcfs"), PROFILE).tasks) == 3


@pytest.mark.parametrize(("call", "match"), [
    # before: a bare TypeError from a comparison, or "cannot convert float NaN to integer"
    (lambda: make_trace(DAG4, 2, "0.1", 0), "arrival rate"),
    (lambda: make_trace(DAG4, 2.5, 0.1, 0), "n_tasks"),
    (lambda: simulate(make_trace(DAG4, 2, 0.1, 0), make_policy("fcfs"), PROFILE, kv_budget=float("nan")), "kv_budget"),
    (lambda: simulate(make_trace(DAG4, 2, 0.1, 0), make_policy("fcfs"), PROFILE, kv_budget=20000.5), "kv_budget"),
])
def test_simulator_arguments_are_config_errors(call, match) -> None:
    with pytest.raises(ConfigError, match=match):
        call()


def test_numpy_numbers_are_numbers() -> None:
    trace = make_trace(DAG4, np.int64(2), np.float64(0.5), 0)
    assert len(simulate(trace, make_policy("fcfs"), PROFILE, kv_budget=np.int64(30_000)).tasks) == 2
