"""`topas bench --replicas`: the headline's rule (one router per Topas policy, every number
from it; every Topas policy covered) and the flags the cluster refuses (cluster/cli.py,
cluster/headline.py)."""

from __future__ import annotations

import pytest

from topas_agents.bench.protocol import LIMITS
from topas_agents.cli import main
from topas_agents.cluster.bench import ClusterBenchConfig, _summary
from topas_agents.cluster.cli import format_cluster_seeds_table, format_cluster_table
from topas_agents.cluster.seeds import summarise_seeds
from topas_agents.costmodel import DEFAULT_PROFILE, load_profile
from topas_agents.errors import ConfigError
from topas_agents.workflow import load_workflow

# Per pair (mean, p99) at two loads. topas+task has the lower mean, topas+cache the lower p99:
# the headline must show topas+task for both. lpm+task is the best baseline by mean, lpm+cache by p99.
POINTS = [
    {"topas+task": (1.0, 9.0), "topas+cache": (2.0, 3.0), "topas-core+task": (3.0, 4.0),
     "topas-core+cache": (2.5, 5.0), "kvflow+task": (1.5, 2.0), "lpm+task": (4.0, 8.0), "lpm+cache": (5.0, 6.0)},
    {"topas+task": (3.0, 7.0), "topas+cache": (4.0, 5.0), "topas-core+task": (3.0, 6.0),
     "topas-core+cache": (3.5, 7.0), "kvflow+task": (2.5, 4.0), "lpm+task": (4.0, 8.0), "lpm+cache": (6.0, 6.0)},
]


def _points(only: tuple[str, ...] | None = None, scale: float = 1.0) -> list[dict]:
    return [{"results": {p: {"mean_jct": m * scale, "p99_jct": q * scale} for p, (m, q) in pt.items()
                         if only is None or p.split("+")[0] in only}} for pt in POINTS]


def _avg(pair: str, metric: str, points: list[dict]) -> float:
    return sum(pt["results"][pair][metric] for pt in points) / len(points)


def test_single_seed_headline_takes_every_number_from_one_router():
    pts = _points()
    s = _summary(pts)
    head = s["headline"]  # topas's
    best = min(("topas+task", "topas+cache"), key=lambda p: _avg(p, "mean_jct", pts))
    assert head["topas_best_router"] == best
    # the p99 ratio is the chosen router's p99 over the best baseline p99 (it was the p99 of
    # whichever Topas router had the lowest one: another configuration than the mean's)
    assert head["p99_jct_vs_best_baseline"] == pytest.approx(
        _avg(best, "p99_jct", pts) / s["best_baseline_p99_jct"]["value"])
    assert head["mean_jct_vs_best_baseline"] == pytest.approx(
        _avg(best, "mean_jct", pts) / s["best_baseline_mean_jct"]["value"])
    assert head["p99_jct_vs_lpm_cache"] == pytest.approx(_avg(best, "p99_jct", pts) / _avg("lpm+cache", "p99_jct", pts))
    assert head["topas"] == s["pairs"][best]


def test_every_topas_policy_gets_a_headline():
    s = _summary(_points())
    assert set(s["headlines"]) == {"topas", "topas-core"}  # kvflow is a peer: the table only
    assert s["headline"]["policy"] == "topas"  # the recommended policy's, when it ran
    core = s["headlines"]["topas-core"]
    assert core["topas_best_router"] == min(("topas-core+task", "topas-core+cache"),
                                            key=lambda p: s["pairs"][p]["mean_jct"])
    alone = _summary(_points(only=("topas-core", "lpm")))  # topas-core without topas: it was dropped
    assert alone["headline"]["policy"] == "topas-core" and set(alone["headlines"]) == {"topas-core"}
    assert "topas-core+" in format_cluster_table(_doc(alone))
    assert _summary(_points(only=("lpm",)))["headline"] == {}  # no Topas policy: no headline


def _doc(summary: dict) -> dict:
    return {"workload": "w", "profile": "p", "loads": [0.3, 0.6], "seed": 0,
            "by_replicas": [{"replicas": 2, "summary": summary}]}


def _seed_docs(only: tuple[str, ...] | None = None) -> list[dict]:
    return [{"by_replicas": [{"replicas": 2, "points": _points(only, scale)}]} for scale in (1.0, 1.1, 0.9)]


def test_over_seeds_every_topas_policy_gets_a_headline_from_one_router():
    block = summarise_seeds(_seed_docs())[0]
    assert set(block["headlines"]) == {"topas", "topas-core"} and block["headline"]["policy"] == "topas"
    for policy, head in block["headlines"].items():
        best = head["topas_best_router"]
        assert best.startswith(f"{policy}+")
        assert head["topas"]["p99_jct"] == block["over_seeds"][best]["p99_jct"]
        assert head["p99_jct_vs_best_baseline"] == block["over_seeds"][best]["p99_jct_vs_best_baseline"]
    alone = summarise_seeds(_seed_docs(only=("topas-core", "lpm")))[0]
    assert alone["headline"]["policy"] == "topas-core"
    text = format_cluster_seeds_table({"workload": "w", "profile": "p", "loads": [0.3], "seeds": [1, 2, 3],
                                       "tasks_per_replica": 4, "by_replicas": [alone]})
    assert f"headline {alone['headline']['topas_best_router']}" in text


def _bench(capsys, *argv: str) -> tuple[int, str]:
    rc = main(["bench", "--workload", "chain3", "--no-progress", *argv])
    return rc, capsys.readouterr().err.strip()


def test_protocol_with_replicas_is_refused(capsys):
    """--protocol paper set the cluster's seeds but not its tasks or stated rates, silently."""
    rc, err = _bench(capsys, "--replicas", "2", "--protocol", "paper")
    assert rc == 2 and len(err.splitlines()) == 1
    assert "--protocol paper" in err and "--replicas" in err and "--tasks-per-replica" in err


def test_tasks_per_replica_is_bounded_as_tasks_is(capsys):
    low, high = LIMITS.tasks
    rc, err = _bench(capsys, "--replicas", "2", "--tasks-per-replica", str(high + 1))
    assert rc == 2 and f"[{low}, {high}]" in err and "--tasks-per-replica" in err
    rc, tasks_err = _bench(capsys, "--tasks", str(high + 1))
    assert rc == 2 and tasks_err.replace("--tasks", "--tasks-per-replica") == err
    rc, err = _bench(capsys, "--replicas", "2", "--tasks-per-replica", str(low - 1))
    assert rc == 2 and "positive integer" in err
    # each value fits, the run (K x replicas tasks) does not
    k = high // 2 + 1
    rc, err = _bench(capsys, "--replicas", "2", "--tasks-per-replica", str(k))
    assert rc == 2 and f"{2 * k} tasks per run" in err and len(err.splitlines()) == 1
    wf, profile = load_workflow("chain3"), load_profile(DEFAULT_PROFILE)
    with pytest.raises(ConfigError, match="--scaling's largest"):
        ClusterBenchConfig(workflow=wf, profile=profile, replicas=(1,), tasks_per_replica=high,
                           scaling_pairs=(("topas", "task"),))
    ClusterBenchConfig(workflow=wf, profile=profile, replicas=(1,), tasks_per_replica=high)  # one replica: fits
