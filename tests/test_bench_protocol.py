"""The evaluation protocol: the paper rule (section V-A), CIs over seeds, host-tier setups,
--seeds documents, the named protocol, input limits, the suite hook and the moved tools."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topas_agents.bench import (
    BenchConfig,
    HostTier,
    mean_ci,
    over_seeds,
    paper_rule,
    parse_host_tier,
    run_bench,
)
from topas_agents.bench.aggregate import percentile, t_quantile_975
from topas_agents.bench.protocol import PAPER_RATES, PROTOCOLS
from topas_agents.cli import build_parser, main
from topas_agents.cli.bench import resolve_args
from topas_agents.costmodel import load_profile
from topas_agents.errors import ConfigError
from topas_agents.policies import available_policies
from topas_agents.workflow import load_workflow

needs_sim = pytest.mark.skipif(importlib.util.find_spec("topas_agents.sim") is None,
                               reason="topas_agents.sim (the simulator) is not importable yet")


def _pt(**rows):
    return {"results": {p: {"mean_jct": m, "p99_jct": q} for p, (m, q) in rows.items()}}


# ------------------------------------------------------------------ paper rule and CIs


def test_paper_rule_differs_from_averaging_per_point_reductions():
    # Topas wins the light point by 50% and loses the heavy one by 10%: the old per-point
    # average says +20%, the paper rule (averages first, then one comparator) says it is slower.
    points = [_pt(fcfs=(10.0, 20.0), lpm=(20.0, 30.0), topas=(5.0, 10.0)),
              _pt(fcfs=(100.0, 200.0), lpm=(100.0, 150.0), topas=(110.0, 220.0))]
    per_point = [1 - 5.0 / 10.0, 1 - 110.0 / 100.0]
    assert sum(per_point) / 2 == pytest.approx(0.20)
    s = paper_rule(points, ["fcfs", "lpm", "topas"])["topas"]
    assert s["mean_jct"] == pytest.approx(57.5) and s["best_baseline"] == "fcfs"
    assert s["mean_jct_vs_best_baseline"] == pytest.approx(57.5 / 55.0)
    assert s["mean_jct_vs_best_baseline"] > 1
    # p99: fcfs averages 110, lpm 90 -> lpm is the comparator for p99 only
    assert s["best_baseline_p99"] == "lpm" and s["p99_jct_vs_best_baseline"] == pytest.approx(115.0 / 90.0)


def test_paper_rule_missing_value_has_no_ratio():
    points = [_pt(fcfs=(10.0, 20.0), topas=(5.0, 10.0)), _pt(fcfs=(10.0, 20.0), topas=(None, None))]
    s = paper_rule(points, ["fcfs", "topas"])
    assert s["topas"]["mean_jct"] is None and s["topas"]["mean_jct_vs_best_baseline"] is None
    assert s["fcfs"]["mean_jct_vs_best_baseline"] == pytest.approx(1.0)


def test_mean_ci_known_numbers():
    iv = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.776445 * math.sqrt(2.5) / math.sqrt(5)  # t_{0.975,4} * sd / sqrt(n)
    assert iv.mean == 3.0 and iv.n == 5
    assert iv.low == pytest.approx(3.0 - half, abs=1e-5) and iv.high == pytest.approx(3.0 + half, abs=1e-5)
    one = mean_ci([0.8])
    assert (one.mean, one.low, one.high) == (0.8, None, None)
    assert mean_ci([2.0, 2.0, 2.0]).as_dict() == {"mean": 2.0, "ci95": [2.0, 2.0], "n": 3, "values": [2.0] * 3}


def test_t_quantile_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 4, 9, 30, 31, 45, 100, 1000):
        assert t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=5e-6)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.1, 10.0), min_size=2, max_size=12))
def test_ci_contains_the_mean_and_shrinks_with_agreement(values):
    iv = mean_ci(values)
    assert iv.low <= iv.mean <= iv.high
    assert mean_ci([iv.mean] * len(values)).high - iv.mean <= iv.high - iv.mean + 1e-12


def test_over_seeds_aggregates_each_seeds_ratio():
    seeds = [paper_rule([_pt(fcfs=(10.0, 20.0), topas=(t, 2 * t))], ["fcfs", "topas"]) for t in (8.0, 9.0, 10.0)]
    agg = over_seeds(seeds)["topas"]
    assert agg["mean_jct_vs_best_baseline"]["values"] == pytest.approx([0.8, 0.9, 1.0])
    assert agg["mean_jct_vs_best_baseline"]["mean"] == pytest.approx(0.9)
    low, high = agg["mean_jct_vs_best_baseline"]["ci95"]
    assert high - 0.9 == pytest.approx(4.302653 * 0.1 / math.sqrt(3), abs=1e-5) and low < 0.9
    assert agg["best_baseline"] == ["fcfs"] * 3


def test_percentile_is_numpys_linear_one():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert math.isnan(percentile([], 99))


# ------------------------------------------------------------------ host tier setups


def test_host_tier_parsing():
    known = available_policies()
    assert parse_host_tier("all", known) == HostTier("all") and parse_host_tier(" none ", known).mode == "none"
    paper = parse_host_tier("paper", known)
    assert paper.has("topas") and paper.has("topas-paper") and not paper.has("lpm") and not paper.has("spf")
    listed = parse_host_tier("topas,lpm", known)
    assert listed.has("lpm") and not listed.has("fcfs") and listed.label == "topas,lpm"
    for bad, msg in (("topas,bogus", "unknown policy 'bogus'"), ("lpm,lpm", "given twice"), ("lpm,", "empty")):
        with pytest.raises(ConfigError, match=msg):
            parse_host_tier(bad, known)


def _args(*argv):
    return resolve_args(build_parser("bench").parse_args(["bench", *argv]))


def test_no_host_tier_is_an_alias_of_none_and_conflicts_with_host_tier(capsys):
    assert _args("--workload", "chain3", "--no-host-tier").host_tier == HostTier("none")
    assert _args("--workload", "chain3", "--host-tier", "paper").host_tier == HostTier("paper")
    assert _args("--workload", "chain3").host_tier is None  # the profile's setting
    assert main(["bench", "--workload", "chain3", "--host-tier", "all", "--no-host-tier"]) == 2
    assert main(["bench", "--workload", "chain3", "--host-tier", "nope"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "not allowed with argument" in err[0] and "unknown policy 'nope'" in err[1]


@needs_sim
def test_paper_setup_baseline_recomputes_and_topas_swaps():
    cfg = BenchConfig(policies=("lpm", "topas"), profile=load_profile(), workflow=load_workflow("metagpt-tl"),
                      loads=(0.6,), tasks=8, host_tier=HostTier("paper"))
    res = run_bench(cfg)
    assert res["host_tier"] == {"setup": "paper", "policies": {"lpm": False, "topas": True}}
    lpm, topas = (res["points"][0]["results"][p] for p in ("lpm", "topas"))
    assert lpm["host_tier"] is False and lpm["prefix_swaps"] == 0 and lpm["prefix_recomputes"] > 0
    assert topas["host_tier"] is True and topas["prefix_swaps"] > 0
    symmetric = run_bench(BenchConfig(**{**cfg.__dict__, "host_tier": HostTier("all")}))
    assert symmetric["points"][0]["results"]["lpm"]["prefix_swaps"] > 0


# ------------------------------------------------------------------ seeds, protocol, jobs


@needs_sim
def test_seeds_json_shape(tmp_path, capsys):
    out = tmp_path / "s.json"
    rc = main(["bench", "--workload", "chain3", "--policies", "fcfs,lpm,topas", "--load", "0.3,0.6", "--tasks", "3",
               "--seeds", "0,2", "--host-tier", "paper", "--task-jcts", "--json", str(out), "--no-progress",
               "--policy-opt", "topas.beta=0.5"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "seed 0" in text and "seed 2" in text and "over seeds 0, 2 (mean [95% t CI]" in text
    doc = json.loads(out.read_text())
    assert list(doc) == ["workload", "profile", "seeds", "tasks", "capacity_rps", "host_tier", "policy_options",
                         "per_seed", "over_seeds"]
    assert doc["policy_options"] == {"topas": {"beta": "0.5"}}  # the variant the runs are
    assert doc["seeds"] == [0, 2] and [r["seed"] for r in doc["per_seed"]] == [0, 2]
    assert doc["host_tier"]["policies"] == {"fcfs": False, "lpm": False, "topas": True}
    for run in doc["per_seed"]:
        assert [p["load"] for p in run["points"]] == [0.3, 0.6]
        assert run["summary"]["topas"]["best_baseline"] in ("fcfs", "lpm")
        assert all(len(r["task_jcts"]) == 3 for p in run["points"] for r in p["results"].values())
    topas = doc["over_seeds"]["topas"]["mean_jct_vs_best_baseline"]
    assert topas["n"] == 2 and topas["values"] == [r["summary"]["topas"]["mean_jct_vs_best_baseline"]
                                                   for r in doc["per_seed"]]


@needs_sim
def test_results_do_not_depend_on_jobs():
    cfg = BenchConfig(policies=("fcfs", "lpm", "topas"), profile=load_profile(), workflow=load_workflow("dag4"),
                      loads=(0.3, 0.6), tasks=4, seed=1)

    def strip(doc):
        for pt in doc["points"]:
            for row in pt["results"].values():
                row.pop("decision_ms_mean"), row.pop("decision_ms_p99")
        return doc

    assert strip(run_bench(cfg, jobs=1)) == strip(run_bench(cfg, jobs=2))


def test_paper_protocol_defaults():
    args = _args("--workload", "metagpt-tl", "--protocol", "paper")
    assert len(args.seeds) >= 5 and args.tasks >= 200 and args.extra_rates == (0.0175,)
    assert PAPER_RATES == {"chain3": (0.15,), "metagpt-tl": (0.0175,)}
    mine = _args("--workload", "chain3", "--protocol", "paper", "--tasks", "7", "--seeds", "3")
    assert (mine.tasks, mine.seeds, mine.extra_rates) == (7, (3,), (0.15,))
    assert _args("--workload", "chain3", "--protocol", "paper", "--rate", "0.1").extra_rates == ()
    assert PROTOCOLS["paper"].rates_for("dag4") == ()


def test_paper_rates_go_to_the_paper_workflow_not_to_a_file_name(tmp_path):
    """The rates were looked up by the file's name: a small workflow in chain3.yaml got chain3's
    0.15 task/s (load 0.00004 for it), and chain3 itself copied to another name got none."""
    from topas_agents.workflow import builtin_workflow_dir

    (tmp_path / "x").mkdir()
    tiny = tmp_path / "x" / "chain3.yaml"
    tiny.write_text("name: tiny\nagents: [{name: a, prefix_tokens: 100}]\n"
                    "stages: [{name: s, agent: a, input_tokens: 10, output_tokens: 10}]\n")
    copy = tmp_path / "c3copy.yaml"
    copy.write_text((builtin_workflow_dir() / "chain3.yaml").read_text())
    assert _args("--workload", str(tiny), "--protocol", "paper").extra_rates == ()
    assert _args("--workload", str(copy), "--protocol", "paper").extra_rates == (0.15,)
    changed = tmp_path / "c3changed.yaml"
    changed.write_text(copy.read_text().replace("input_tokens: 512", "input_tokens: 513", 1))
    assert "input_tokens: 513" in changed.read_text()
    assert _args("--workload", str(changed), "--protocol", "paper").extra_rates == ()


@needs_sim
def test_extra_rates_join_the_load_points_in_rate_order():
    from topas_agents.bench.jobs import SimBackend
    from topas_agents.bench.runner import plan_points
    from topas_agents.sim import make_trace

    cfg = BenchConfig(policies=("fcfs",), profile=load_profile(), workflow=load_workflow("chain3"),
                      tasks=2, extra_rates=(0.15,))
    points = plan_points(cfg, SimBackend(make_trace, None))
    assert [p.load for p in points] == [0.3, 0.45, None, 0.6] and points[2].rate == 0.15


# ------------------------------------------------------------------ limits


@pytest.mark.parametrize("argv, msg", [
    (["--rate", "1e-300"], "--rate: 1e-300 is outside the supported range [0.0001, 1000] tasks/s"),
    (["--rate", "5000"], "--rate: 5000 is outside"),
    (["--load", "50"], "--load: 50 is outside the supported range [0.01, 10]"),
    (["--tasks", "1000000"], "--tasks: 1e+06 is outside"),
    (["--seeds", ",".join(map(str, range(101)))], "at most 100 seeds"),
    (["--seeds", "1,1"], "given twice"),
    (["--seeds", "0", "--seed", "1"], "not allowed with argument"),
])
def test_out_of_range_inputs_are_one_line_errors(argv, msg, capsys):
    assert main(["bench", "--workload", "chain3", "--policies", "fcfs", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1


# ------------------------------------------------------------------ suite hook, moved tools


def test_suite_hook_passes_resolved_args(monkeypatch):
    seen = []
    fake = types.ModuleType("topas_agents.suite")
    fake.run_suite_cli = lambda args: seen.append(args) or 0
    monkeypatch.setitem(sys.modules, "topas_agents.suite", fake)
    rc = main(["bench", "--suite", "random", "--workflows", "3", "--seeds", "0,1", "--policies", "fcfs,topas",
               "--host-tier", "paper", "--policy-opt", "topas.beta=0.5", "--jobs", "2"])
    assert rc == 0
    a = seen[0]
    assert (a.suite, a.workflows, a.worst_dir, a.seeds, a.seed, a.load, a.tasks) == (
        "random", 3, "results/suite-worst", (0, 1), 0, None, None)
    assert a.policies == ("fcfs", "topas") and a.policy_options == {"topas": {"beta": 0.5}}
    assert a.host_tier == HostTier("paper") and a.jobs == 2 and a.json is None and a.no_progress is False


def test_suite_hook_without_the_package_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "topas_agents.suite", types.ModuleType("topas_agents.suite"))
    assert main(["bench", "--suite", "random"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --suite needs topas_agents.suite") and err.count("\n") == 1


def test_microbench_honours_profile():
    from topas_agents.bench.microbench import run_decision_benchmark

    out = run_decision_benchmark(["fcfs"], n_agents=12, n_waiting=40, decisions=5, warmup=1,
                                 profile="h100-80g-qwen2.5-32b")["fcfs"]
    assert out["profile"] == "h100-80g-qwen2.5-32b" and out["n"] == 5
    assert out["running_mean"] > 0 and out["cpu_p99_ms"] >= 0
    # the queue the times were taken at: topped up to n_waiting, plus released successors
    assert out["waiting_mean"] >= 40 and out["warmup"] == 1
    assert out["gc_full"] >= 0 and 0.0 <= out["gc_mean_ms"] <= out["cpu_mean_ms"] + 1e-9


@pytest.mark.parametrize(("argv", "message"), [
    (["--agents", "0"], "argument --agents: expected a positive integer"),  # was a traceback
    (["--warmup", "-1"], "argument --warmup: expected an integer >= 0"),
    (["--profile", "nope"], "unknown profile 'nope'"),  # was a traceback
    (["--policies", "lpm,nope"], "unknown policy 'nope'"),  # was a traceback
])
def test_microbench_module_refuses_bad_input_in_one_line(argv, message, capsys):
    from topas_agents.bench import microbench
    from topas_agents.cli.args import run_module

    args = [*argv, "--decisions", "1", "--warmup", "0"] if argv[0] != "--warmup" else argv
    with pytest.raises(SystemExit) as exit_:  # as `python -m topas_agents.bench.microbench` runs it
        run_module(lambda: microbench.main(args))
    rc = exit_.value.code
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err


def test_microbench_counts_only_collections_inside_timed_decisions():
    import gc

    from topas_agents.bench.microbench import _GcMeter

    with _GcMeter() as meter:
        gc.collect()  # untimed (a warm-up decision, or the world between decisions)
        meter.timing = True
        gc.collect()
        gc.collect(0)
        meter.timing = False
        gc.collect()
    out = meter.record(2)
    assert out["gc_full"] == 1 and out["gc_mean_ms"] > 0.0
    assert meter._note not in gc.callbacks  # the hook is gone with the meter


@needs_sim
def test_evaluate_reuses_the_bench(capsys):
    from topas_agents.bench.evaluate import main as evaluate_main

    assert evaluate_main(["--tasks", "3", "--workloads", "chain3", "--policies", "fcfs,lpm,topas",
                          "--seeds", "0,1", "--loads", "0.3,0.6"]) == 0
    text = capsys.readouterr().out
    assert "== chain3 (host tier: all)" in text and "mean_jct: topas reduction vs best baseline" in text
    assert importlib.util.find_spec("topas_agents.policies.topas.evaluate") is None
    assert importlib.util.find_spec("topas_agents.bench.accuracy") is not None
