"""`run_suite_cli`: a tiny suite end to end (report, worst-case YAMLs that replay, JSON),
independent of the worker count; config errors are one-line ConfigErrors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from topas_agents.errors import ConfigError
from topas_agents.suite import run_suite_cli
from topas_agents.suite.cli import DEFAULT_LOADS, DEFAULT_TASKS, config_from_args
from topas_agents.suite.generate import generate_suite
from topas_agents.workflow import load_workflow


def _args(tmp: Path, **over) -> argparse.Namespace:
    base = dict(suite="random", workflows=2, worst_dir=str(tmp / "worst"), seeds=None, seed=0, load=(0.5,),
                tasks=10, profile="a100-80g-qwen2.5-32b", kv_budget=None, policies=("lpm", "topas"),
                json=str(tmp / "out.json"), no_progress=True)
    return argparse.Namespace(**{**base, **over})


def test_tiny_suite_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_suite_cli(_args(tmp_path)) == 0
    assert not (tmp_path / "worst" / "failed").exists()  # created only when something failed
    out = capsys.readouterr().out
    assert "random suite: 2 workflows x seeds 0 x loads 0.5, 10 tasks" in out
    for rule in ("paper", "per_load", "vs_lpm"):
        assert f"topas         mean_jct  {rule}" in out
    assert "(1 baseline)  p99_jct   per_load" in out  # one baseline: the floor is 1.0 everywhere
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["seeds"] == [0] and doc["loads"] == [0.5] and doc["policies"] == ["lpm", "topas"]
    assert doc["policy_options"] == {}  # no --policy-opt: every policy at its defaults
    assert [w["index"] for w in doc["workflows"]] == [0, 1]
    for w in doc["workflows"]:
        runs = w["runs"]["0"]["0.5"]
        assert set(runs) == {"lpm", "topas"}
        ratio = runs["topas"]["mean_jct"] / runs["lpm"]["mean_jct"]
        # one seed, one load: paper rule and per-load ratio are the same number
        assert w["paper"]["topas"]["mean_jct"]["ratio"] == pytest.approx(ratio)
        assert w["per_load"]["topas"]["mean_jct"][0]["ratio"] == pytest.approx(ratio)
        assert w["paper"]["topas"]["mean_jct"]["winner"] == "lpm"
        assert w["vs_lpm"]["topas"]["mean_jct"][0]["ratio"] == pytest.approx(ratio)  # lpm is the only baseline
        assert w["baseline_floor"]["mean_jct"][0] == {"ratio": 1.0, "winner": "lpm", "winners": ["lpm"], "load": 0.5}
    dist = doc["distribution"]["topas"]["mean_jct"]["paper"]
    assert dist["n"] == 2 and dist["min"] <= dist["p50"] <= dist["max"]
    assert doc["baseline_floor"]["p99_jct"]["max"] == 1.0 and doc["baseline_floor"]["p99_jct"]["losses"] == 0
    # The worst cases are both workflows, worst first, each replayable from its YAML.
    worst = doc["worst"]
    assert len(worst) == 2 and worst[0]["ratio"] >= worst[1]["ratio"]
    generated = {g.workflow.name: g.workflow for g in generate_suite(2, 0, 17500, loads=(0.5,))}
    for case in worst:
        path = Path(case["yaml"])
        assert path.parent == tmp_path / "worst"
        assert load_workflow(path) == generated[case["workflow"]]
        assert "--load 0.5 --tasks 10 --seed 0" in path.read_text()
        assert set(case["detail"]) == {"topas", "lpm"}


def _edited_profile(tmp: Path) -> str:
    """The A100 profile with a slower weight read, in a file under the built-in's name."""
    import yaml

    data = yaml.safe_load((Path(__file__).parents[1] / "topas_agents/profiles/a100-80g-qwen2.5-32b.yaml").read_text())
    data["tm_s"] = data["tm_s"] * 1.5
    path = tmp / "profiles" / "a100-80g-qwen2.5-32b.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(data))
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


@pytest.mark.parametrize("setup", ["defaults", "options"])
def test_worst_case_replay_command_reproduces_the_suite_runs(tmp_path: Path, setup: str) -> None:
    """The worst case's ratio is averaged over the suite's arrival seeds, so its YAML's replay
    command must run every one of them, and running it gives the suite's own numbers. Also
    with a profile file, a host-tier setup and policy options, which the command left out
    (and it named the profile file by its name, an unknown built-in)."""
    import shlex

    from topas_agents.bench.hosttier import NONE
    from topas_agents.cli import main

    judged = "topas" if setup == "defaults" else "topas-core"
    extra = {} if setup == "defaults" else {"profile": _edited_profile(tmp_path), "host_tier": NONE,
                                             "policies": ("lpm", judged), "policy_opt": ["topas-core.beta=0.25"]}
    run_suite_cli(_args(tmp_path, workflows=1, seeds=(1, 2), **extra))
    doc = json.loads((tmp_path / "out.json").read_text())
    case = doc["worst"][0]
    text = Path(case["yaml"]).read_text()
    command = next(line.strip() for line in text.splitlines() if "topas bench --workload" in line)
    command = command.lstrip("# ").strip()
    assert "--seeds 1,2" in command and "--seed " not in command
    if setup == "options":
        assert "--host-tier none" in command and "--policy-opt topas-core.beta=0.25" in command
    argv = shlex.split(command)[1:] + ["--json", str(tmp_path / "replay.json"), "--no-progress", "--jobs", "1"]
    assert main(argv) == 0
    replay = json.loads((tmp_path / "replay.json").read_text())
    runs = doc["workflows"][0]["runs"]
    for seed_doc in replay["per_seed"]:
        (point,) = seed_doc["points"]
        for policy in ("lpm", judged):
            assert point["results"][policy]["mean_jct"] == pytest.approx(
                runs[str(seed_doc["seed"])]["0.5"][policy]["mean_jct"])


def test_output_does_not_depend_on_worker_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    run_suite_cli(_args(one, jobs=1, worst_dir=None, json=str(one / "r.json"), seeds=(1, 2)))
    run_suite_cli(_args(two, jobs=2, worst_dir=None, json=str(two / "r.json"), seeds=(1, 2)))
    capsys.readouterr()
    assert (one / "r.json").read_text() == (two / "r.json").read_text()


def test_defaults_and_optional_attributes(tmp_path: Path) -> None:
    args = argparse.Namespace(suite="random", workflows=3, worst_dir=None, seeds=None, seed=4, load=None,
                              tasks=None, profile="a100-80g-qwen2.5-32b", kv_budget=9000,
                              policies=("fcfs", "topas"), json=None, no_progress=True, no_host_tier=True,
                              policy_opt=["topas.kv_exp=0"])
    cfg = config_from_args(args)
    assert (cfg.seeds, cfg.gen_seed, cfg.loads, cfg.tasks, cfg.jobs) == ((4,), 4, DEFAULT_LOADS, DEFAULT_TASKS, 1)
    assert cfg.budget == 9000 and cfg.host_tier is False
    assert cfg.policy_options == {"topas": {"kv_exp": 0}}
    assert cfg.baselines == ("fcfs",) and cfg.compared == ("topas",)
    # a held-out suite: its own generator seed, independent of the arrival seeds
    held_out = config_from_args(argparse.Namespace(**{**vars(args), "suite_seed": 7, "seeds": (1, 2)}))
    assert (held_out.gen_seed, held_out.seeds) == (7, (1, 2))


@pytest.mark.parametrize(("over", "match"), [
    ({"suite": "nope"}, "unknown suite"),
    ({"policies": ("topas",)}, "best baseline"),
    ({"policies": ("lpm", "fcfs")}, "non-baseline"),
])
def test_config_errors(tmp_path: Path, over: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        run_suite_cli(_args(tmp_path, **over))


class _NeverAdmits:
    """A policy that never runs anything: the simulator reports it as stalled."""

    name = "never"

    def decide(self, snap):
        from topas_agents.snapshot import Decision

        return Decision()


def make_never(**_options):
    return _NeverAdmits()


def test_failed_policy_is_reported_not_fatal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from topas_agents.policies import _REGISTRY, register_policy

    register_policy("never-suite-test", f"{__name__}:make_never")
    try:
        code = run_suite_cli(_args(tmp_path, workflows=1, policies=("lpm", "never-suite-test", "topas")))
    finally:
        _REGISTRY.pop("never-suite-test", None)
    assert code == 1  # reported and written, but the suite is incomplete: no false success
    assert not (tmp_path / "worst" / "failed").exists()  # only the judged policy's failures are written
    captured = capsys.readouterr()
    out = captured.out
    assert "FAILED runs (1" in out and "stalled" in out
    assert "1 run(s) failed" in captured.err
    doc = json.loads((tmp_path / "out.json").read_text())
    (fail,) = doc["failures"]
    assert (fail["policy"], fail["seed"], fail["load"]) == ("never-suite-test", 0, 0.5)
    runs = doc["workflows"][0]["runs"]["0"]["0.5"]
    assert runs["never-suite-test"]["mean_jct"] is None and runs["lpm"]["mean_jct"] > 0  # others still ran
    assert doc["workflows"][0]["paper"]["never-suite-test"]["mean_jct"]["ratio"] is None
    assert doc["distribution"]["never-suite-test"]["mean_jct"]["paper"]["unknown"] == 1


def test_the_json_records_the_policy_options_it_ran(tmp_path: Path) -> None:
    """A variant's runs say which variant they are (`--policy-opt`)."""
    args = _args(tmp_path, workflows=1, policy_opt=["topas.forecast_margin=0.05"])
    assert run_suite_cli(args) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["policy_options"] == {"topas": {"forecast_margin": "0.05"}}
