"""Inputs that used to run for ever, overflow mid-run or count twice: refused up front."""

from __future__ import annotations

import pytest

from topas_agents.cli import main
from topas_agents.costmodel import load_profile
from topas_agents.errors import ConfigError, WorkflowError
from topas_agents.policies import forecast_run, make_policy
from topas_agents.policies.forecast_run import JctPair
from topas_agents.workflow import load_workflow, parse_workflow

CHAIN = {"name": "t", "agents": [{"name": "a", "prefix_tokens": 256}],
         "stages": [{"name": "s", "agent": "a", "input_tokens": 64, "output_tokens": 16}]}


@pytest.mark.parametrize("loads", ["[1.0e-300]", "[0.001]", "[500]"])
def test_a_workflows_own_loads_are_held_to_the_load_range(tmp_path, capsys, loads):
    # before: 1e-300 never finished, 1e18 reported JCTs below the lower bound (exit 0)
    path = tmp_path / "w.yaml"
    path.write_text(f"name: t\nagents: [{{name: a, prefix_tokens: 256}}]\n"
                    f"stages: [{{name: s, agent: a, input_tokens: 64, output_tokens: 16}}]\nloads: {loads}\n")
    assert main(["bench", "--workload", str(path), "--tasks", "3", "--policies", "fcfs", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "workflow 't' `loads:`" in err and "outside the supported range [0.01, 10]" in err
    assert err.count("\n") == 1
    # --load given on the command line replaces them (and is checked itself)
    assert main(["bench", "--workload", str(path), "--tasks", "2", "--load", "0.3", "--policies", "fcfs",
                 "--no-progress"]) == 0


def test_the_cluster_bench_holds_a_workflows_loads_to_the_same_range():
    from topas_agents.cluster.bench import ClusterBenchConfig

    wf = parse_workflow({**CHAIN, "loads": [1e-9]})
    with pytest.raises(ConfigError, match="`loads:`: 1e-09 is outside"):
        ClusterBenchConfig(workflow=wf, profile=load_profile(), policies=("fcfs",), routers=("task",), replicas=(2,))


@pytest.mark.parametrize(("key", "value", "match"), [
    ("loads", [0.3, 0.3], "loads: 0.3 listed twice"),  # simulated and weighed twice before
    ("rates", [0.1], "rates: not read by any command"),  # validated, then ignored before
])
def test_workflow_operating_points_are_distinct_and_read(key, value, match):
    with pytest.raises(WorkflowError, match=match):
        parse_workflow({**CHAIN, key: value})


@pytest.mark.parametrize(("policy", "option", "value"), [
    ("topas-core", "size_weight", 400),  # OverflowError mid-run before
    ("topas", "size_weight", 17),
    ("topas-paper", "beta", 1e200),  # its search never ended before
    ("topas-core", "beta", 1e7),
])
def test_overflowing_option_values_are_refused(policy, option, value):
    with pytest.raises(ConfigError, match=f"'{option}' must be in"):
        make_policy(policy, {option: value})
    make_policy(policy, {option: 16 if option == "size_weight" else 1e6})  # the bound itself is fine


def test_forecast_scores_survive_a_zero_reference():
    # every task of a trace finishing in no clock time: a ZeroDivisionError ended the run
    runs = [{"topas-core": JctPair(0.0, 0.0), "fcfs": JctPair(0.0, 0.0), "lpm": JctPair(1.0, 2.0)}]
    scores = forecast_run._regret_scores(runs, ("fcfs", "lpm"))
    assert scores["topas-core"] == scores["fcfs"] == 1.0 and scores["lpm"] == float("inf")


def test_builtin_workflows_still_parse():
    for name in ("chain3", "dag4", "dag10wide", "metagpt-sop", "metagpt-tl"):
        assert load_workflow(name).loads
