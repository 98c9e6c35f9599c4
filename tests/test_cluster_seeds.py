"""The cluster bench over seeds: the paper rule per seed with (policy, router) pairs, then mean
and 95% CI over seeds (`topas bench --replicas N --seeds ...`)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest

from topas_agents.bench.aggregate import mean_ci
from topas_agents.cluster.bench import ClusterBenchConfig, run_cluster_bench
from topas_agents.cluster.cli import add_cluster_bench_options, run_cluster_from_args
from topas_agents.cluster.seeds import pair_rule, run_cluster_seeds
from topas_agents.costmodel import DEFAULT_PROFILE, load_profile
from topas_agents.errors import ConfigError
from topas_agents.workflow import load_workflow

PROFILE = load_profile(DEFAULT_PROFILE)
CFG = ClusterBenchConfig(workflow=load_workflow("chain3"), profile=PROFILE, policies=("topas", "lpm"),
                         routers=("task", "cache", "least-load"), replicas=(2,), loads=(0.3, 0.6),
                         tasks_per_replica=5)
SEEDS = (11, 12, 13)


def _points(results_by_load: list[dict[str, tuple[float, float]]]) -> list[dict]:
    return [{"results": {p: {"mean_jct": m, "p99_jct": q} for p, (m, q) in r.items()}} for r in results_by_load]


def test_pair_rule_compares_with_the_best_baseline_pair_only():
    pts = _points([{"topas+task": (1.0, 2.0), "lpm+task": (4.0, 5.0), "lpm+cache": (3.0, 9.0)},
                   {"topas+task": (3.0, 4.0), "lpm+task": (4.0, 5.0), "lpm+cache": (4.0, 7.0)}])
    rule = pair_rule(pts)
    assert rule["topas+task"]["mean_jct"] == 2.0
    assert rule["topas+task"]["best_baseline"] == "lpm+cache"  # average 3.5 < 4.0
    assert rule["topas+task"]["best_baseline_p99"] == "lpm+task"  # 5.0 < 8.0
    assert rule["topas+task"]["mean_jct_vs_best_baseline"] == pytest.approx(2.0 / 3.5)
    assert rule["topas+task"]["p99_jct_vs_best_baseline"] == pytest.approx(3.0 / 5.0)


@pytest.fixture(scope="module")
def doc():
    return run_cluster_seeds(CFG, SEEDS)


def test_over_seeds_is_the_per_seed_rule_aggregated(doc):
    json.dumps(doc)  # JSON-ready
    assert doc["seeds"] == list(SEEDS) and len(doc["runs"]) == 3
    block = doc["by_replicas"][0]
    assert block["replicas"] == 2 and len(block["per_seed"]) == 3
    # each seed's runs are the plain cluster bench at that seed (same trace, same numbers)
    again = run_cluster_bench(replace(CFG, seed=12))
    assert again["by_replicas"][0]["points"] == doc["runs"][1]["by_replicas"][0]["points"]
    for pair, row in block["over_seeds"].items():
        vals = [s[pair]["mean_jct"] for s in block["per_seed"]]
        assert row["mean_jct"]["values"] == vals
        ci = mean_ci(vals)
        assert row["mean_jct"]["mean"] == pytest.approx(ci.mean)
        assert row["mean_jct"]["ci95"] == pytest.approx([ci.low, ci.high])
        assert row["mean_jct"]["ci95"][0] <= row["mean_jct"]["mean"] <= row["mean_jct"]["ci95"][1]
    for s in block["per_seed"]:  # the comparator is always a baseline pair
        assert all(r["best_baseline"].startswith("lpm+") for r in s.values())


def test_headline_picks_the_router_once_and_ratios_per_seed(doc):
    block = doc["by_replicas"][0]
    head, agg = block["headline"], block["over_seeds"]
    topas = [p for p in agg if p.startswith("topas+")]
    assert head["topas_best_router"] == min(topas, key=lambda p: agg[p]["mean_jct"]["mean"])
    best = head["topas_best_router"]
    ratios = [s[best]["mean_jct"] / s["lpm+cache"]["mean_jct"] for s in block["per_seed"]]
    assert head["mean_jct_vs_lpm_cache"]["values"] == pytest.approx(ratios)
    assert head["mean_jct_vs_best_baseline"] == agg[best]["mean_jct_vs_best_baseline"]
    assert len(head["best_baseline"]) == 3


def _cli(policies: list[str]) -> argparse.ArgumentParser:
    """The `topas bench` options the cluster path reads."""
    p = argparse.ArgumentParser()
    for flag, default in (("--workload", None), ("--profile", DEFAULT_PROFILE), ("--load", None),
                          ("--kv-budget", None), ("--json", None)):
        p.add_argument(flag, default=default)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=lambda t: tuple(int(x) for x in t.split(",")), default=None)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--policies", type=lambda t: t.split(","), default=policies)
    add_cluster_bench_options(p)
    return p


def test_cli_with_seeds(tmp_path, capsys):
    p = _cli(["topas", "lpm"])
    out = tmp_path / "c.json"
    args = p.parse_args(["--workload", "chain3", "--replicas", "2", "--router", "task,cache",
                         "--tasks-per-replica", "4", "--seeds", "1,2", "--jobs", "2", "--json", str(out)])
    args.load = (0.3,)
    assert run_cluster_from_args(args) == 0
    text = capsys.readouterr().out
    assert "seeds [1, 2]" in text and "vs lpm+cache" in text and "[" in text
    saved = json.loads(out.read_text())
    assert saved["seeds"] == [1, 2] and saved["by_replicas"][0]["over_seeds"]["lpm+cache"]["mean_jct"]["n"] == 2
    # --jobs 2 ran the seeds in processes: the same numbers as serially
    serial = run_cluster_seeds(ClusterBenchConfig(workflow=load_workflow("chain3"), profile=PROFILE,
                                                  policies=("topas", "lpm"), routers=("task", "cache"),
                                                  replicas=(2,), loads=(0.3,), tasks_per_replica=4), (1, 2))
    assert saved["by_replicas"] == json.loads(json.dumps(serial["by_replicas"]))


@pytest.mark.parametrize("seeds", [None, "3"])
def test_cli_without_a_baseline_prints_and_saves(tmp_path, capsys, seeds):
    """Only Topas ran (no baseline pair to compare with): the table says so, the JSON is
    saved and the exit code is 0 (this used to raise after the runs, losing them)."""
    p = _cli(["topas"])
    out = tmp_path / "c.json"
    argv = ["--workload", "chain3", "--replicas", "2", "--router", "task", "--tasks-per-replica", "3",
            "--json", str(out)] + (["--seeds", seeds] if seeds else [])
    args = p.parse_args(argv)
    args.load = (0.3,)
    assert run_cluster_from_args(args) == 0
    text = capsys.readouterr().out
    assert "topas+task" in text
    saved = json.loads(out.read_text())
    if seeds:
        assert "none ran" in text and "n/a" in text
        assert saved["by_replicas"][0]["headline"]["best_baseline"] == [None]
    else:
        assert "best_baseline_mean_jct" not in saved["by_replicas"][0]["summary"]


def test_no_seeds_is_an_error():
    with pytest.raises(ConfigError):
        run_cluster_seeds(CFG, ())
