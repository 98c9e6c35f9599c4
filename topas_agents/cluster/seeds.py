"""`run_cluster_seeds`: the cluster bench at several seeds, summarised by the paper's rule per
seed and then over seeds (`topas bench --replicas N --seeds S1,S2,...`, docs/cluster.md).

Per seed and replica count, each (policy, router) pair is one "policy" of the paper's rule
(`bench.aggregate.paper_rule`): mean and p99 JCT averaged over the loads, the comparator being
the pair with the lowest average among pairs whose policy is one of the paper's baselines. Over
seeds, `bench.aggregate.over_seeds` gives each value's mean and 95% t confidence interval.

Headline per replica count, for each Topas policy that ran (headline.py): the policy with
its best router, the router chosen ONCE from the mean over seeds of the averaged mean JCT
(choosing per seed would pick each seed's luckiest router and bias the ratio down). Against `lpm+cache` (SGLang's default stack: LPM in the engine,
cache-aware routing) the per-seed ratio of averages is aggregated; against the best baseline
pair it is the paper rule's own ratio.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from ..bench.aggregate import mean_ci, over_seeds, paper_rule
from ..errors import ConfigError
from ..policies import BASELINES
from .bench import ClusterBenchConfig, run_cluster_bench, scaling
from .headline import SGLANG_DEFAULT_PAIR, best_pair, headline_policies, pair_policy, with_headlines


def _one_seed(cfg: ClusterBenchConfig) -> dict[str, Any]:  # top level: picklable for the pool
    return run_cluster_bench(cfg)


def pair_rule(points: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """`paper_rule` with (policy, router) pairs as the policies; baselines are the pairs
    whose policy is one of the paper's baselines."""
    pairs = list(points[0]["results"]) if points else []
    baselines = [p for p in pairs if pair_policy(p) in BASELINES]
    return paper_rule(points, pairs, baselines=baselines)


def _headline(policy: str, per_seed: Sequence[Mapping[str, Mapping[str, Any]]],
              agg: Mapping[str, Any]) -> dict[str, Any] | None:
    """`policy` behind its best router, chosen once over seeds; every number is that pair's."""
    best = best_pair(policy, agg, lambda p: agg[p]["mean_jct"]["mean"] if agg[p]["mean_jct"] else None)
    if best is None:
        return None
    head: dict[str, Any] = {"policy": policy, "topas_best_router": best,
                            "topas": {m: agg[best][m] for m in ("mean_jct", "p99_jct")},
                            "mean_jct_vs_best_baseline": agg[best]["mean_jct_vs_best_baseline"],
                            "p99_jct_vs_best_baseline": agg[best]["p99_jct_vs_best_baseline"],
                            "best_baseline": agg[best]["best_baseline"],
                            "best_baseline_p99": agg[best]["best_baseline_p99"]}
    if SGLANG_DEFAULT_PAIR in agg:
        head[SGLANG_DEFAULT_PAIR] = {m: agg[SGLANG_DEFAULT_PAIR][m] for m in ("mean_jct", "p99_jct")}
        for m in ("mean_jct", "p99_jct"):
            pairs = [(s[best][m], s[SGLANG_DEFAULT_PAIR][m]) for s in per_seed]
            ok = all(a is not None and b for a, b in pairs)  # a point without a value: no ratio
            head[f"{m}_vs_lpm_cache"] = mean_ci([a / b for a, b in pairs]).as_dict() if ok else None
    return head


def summarise_seeds(docs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per replica count: the per-seed paper rule, its aggregation over seeds and the headline."""
    out = []
    for k, block in enumerate(docs[0]["by_replicas"]):
        per_seed = [pair_rule(d["by_replicas"][k]["points"]) for d in docs]
        agg = over_seeds(per_seed)
        heads = {p: h for p in headline_policies(agg) if (h := _headline(p, per_seed, agg)) is not None}
        out.append(with_headlines({"replicas": block["replicas"], "per_seed": per_seed, "over_seeds": agg}, heads))
    return out


def run_cluster_seeds(cfg: ClusterBenchConfig, seeds: Sequence[int], *, jobs: int = 1,
                      progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """One `run_cluster_bench` per seed (in `jobs` processes), then `summarise_seeds`.
    `scaling` (if asked) runs once, at the first seed."""
    if not seeds:
        raise ConfigError("run_cluster_seeds needs at least one seed")
    cfgs = [replace(cfg, seed=s, scaling_pairs=()) for s in seeds]
    if jobs > 1 and len(cfgs) > 1:
        with ProcessPoolExecutor(max_workers=min(jobs, len(cfgs))) as pool:
            docs = list(pool.map(_one_seed, cfgs))  # in seed order, whatever finishes first
    else:
        docs = []
        for c in cfgs:
            step = (lambda msg, s=c.seed: progress(f"seed {s}: {msg}")) if progress else None
            docs.append(run_cluster_bench(c, progress=step))
    doc: dict[str, Any] = {"workload": cfg.workflow.name, "profile": cfg.profile.name, "seeds": list(seeds),
                           "tasks_per_replica": cfg.tasks_per_replica, "loads": docs[0]["loads"],
                           "policies": list(cfg.policies), "routers": list(cfg.routers),
                           "by_replicas": summarise_seeds(docs), "runs": docs}
    if cfg.scaling_pairs:
        first = replace(cfg, seed=seeds[0])
        doc["scaling"] = [scaling(first, p, r) for p, r in cfg.scaling_pairs]
    return doc
