"""`run_cluster_bench`: scheduling policies x routers on N simulated replicas.

For each replica count, each operating point (offered load relative to N x one engine's
capacity, `bench.capacity`) and each (policy, router) pair, the same Poisson trace is run
on N engines behind the router (`cosim.simulate_cluster`). Summary, by the paper's rule:
mean and p99 JCT averaged over the operating points, compared with the best baseline pair
(the lowest average among pairs whose policy is one of the paper's baselines). The
`headlines` compare each Topas policy that ran with its best router against LPM behind
cache-aware routing (SGLang's default: LPM in the engine, cache_aware in the router) and
against the best baseline pair, every number from that one router (headline.py); `headline`
is the recommended `topas`'s, else the first Topas policy's.

`scaling` (optional): for replica counts 1..8, the highest arrival rate whose p99 JCT stays
under a fixed target (bisection on the load), and scaling efficiency
`rate(n) / (n x rate(1))`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..bench.capacity import capacity_rps, rate_for_load
from ..bench.options import options_record
from ..bench.runner import build_policy
from ..costmodel import Profile
from ..errors import ConfigError
from ..policies import BASELINES
from ..sim import make_trace
from ..workflow import Workflow
from .cosim import ClusterRun, simulate_cluster
from .headline import SGLANG_DEFAULT_PAIR, best_pair, headline_policies, pair_policy, with_headlines
from .routing import ROUTERS, make_router

# Bisection steps for the highest load meeting the p99 target: 6 halve [0.05, 1.2] to ~0.02.
SCALING_STEPS = 6
SCALING_LOAD_RANGE = (0.05, 1.2)


@dataclass(frozen=True)
class ClusterBenchConfig:
    workflow: Workflow
    profile: Profile
    policies: tuple[str, ...] = ("topas", "lpm")
    routers: tuple[str, ...] = ROUTERS
    replicas: tuple[int, ...] = (4, 8)
    loads: tuple[float, ...] = ()  # default: the workflow's loads
    tasks_per_replica: int = 40  # the trace grows with the cluster so each replica sees as much
    seed: int = 0
    kv_budget: int | None = None
    policy_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # scaling: (policy, router) pairs, the replica counts, the p99 target (None: 1.5 x the
    # p99 of one replica at load 0.3 for each pair)
    scaling_pairs: tuple[tuple[str, str], ...] = ()
    scaling_replicas: tuple[int, ...] = (1, 2, 4, 8)
    p99_target_s: float | None = None

    def __post_init__(self) -> None:
        bad = [r for r in self.routers if r not in ROUTERS]
        if bad:
            raise ConfigError(f"unknown router(s) {', '.join(bad)}; choose from {', '.join(ROUTERS)}")
        if not self.policies or not self.routers or not self.replicas:
            raise ConfigError("need at least one policy, router and replica count")
        if any(n < 1 for n in (*self.replicas, *self.scaling_replicas)) or self.tasks_per_replica < 1:
            raise ConfigError("replica counts and tasks per replica must be >= 1")
        from ..bench.protocol import LIMITS, check_range

        # a run's trace is K x replicas tasks: the bound --tasks has for one run (hours past it)
        most = max((*self.replicas, *(self.scaling_replicas if self.scaling_pairs else ())))
        if self.tasks_per_replica * most > LIMITS.tasks[1]:
            where = "" if most in self.replicas else " (--scaling's largest)"
            raise ConfigError(f"--tasks-per-replica {self.tasks_per_replica} x {most} replicas{where}: "
                              f"{self.tasks_per_replica * most} tasks per run is outside the supported range "
                              f"[{LIMITS.tasks[0]}, {LIMITS.tasks[1]}]")
        # the workflow's own `loads:` stand in for --load: the same range as the single-GPU bench
        check_range(self.loads or self.workflow.loads, LIMITS.load,
                    "load" if self.loads else f"workflow {self.workflow.name!r} `loads:`")


def _run(cfg: ClusterBenchConfig, policy: str, router: str, n: int, load: float) -> ClusterRun:
    budget = cfg.profile.kv_budget_tokens if cfg.kv_budget is None else cfg.kv_budget
    rate = rate_for_load(load, n * capacity_rps(cfg.workflow, cfg.profile, budget))
    trace = make_trace(cfg.workflow, cfg.tasks_per_replica * n, rate, cfg.seed)
    opts = cfg.policy_options.get(policy)
    route = make_router(router, workflows=(cfg.workflow,), profile=cfg.profile)
    return simulate_cluster(trace, lambda: build_policy(policy, opts), n, route, cfg.profile,
                            kv_budget=cfg.kv_budget)


def _avg(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _summary(points: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    pairs = list(points[0]["results"]) if points else []
    avg = {p: {k: _avg([pt["results"][p][k] for pt in points]) for k in ("mean_jct", "p99_jct")} for p in pairs}
    out: dict[str, Any] = {"pairs": avg}
    baseline_pairs = [p for p in pairs if pair_policy(p) in BASELINES]
    for key in ("mean_jct", "p99_jct"):
        if baseline_pairs:
            best = min(baseline_pairs, key=lambda p, k=key: avg[p][k])
            out[f"best_baseline_{key}"] = {"pair": best, "value": avg[best][key]}
    heads = {}
    for policy in headline_policies(pairs):
        best_t = best_pair(policy, pairs, lambda p: avg[p]["mean_jct"])
        if best_t is not None:
            heads[policy] = _headline(policy, best_t, avg, out)
    return with_headlines(out, heads)


def _headline(policy: str, best: str, avg: Mapping[str, Mapping[str, float]], out: Mapping[str, Any]) -> dict[str, Any]:
    """`policy` behind its router `best`: every number is that pair's (headline.py)."""
    head: dict[str, Any] = {"policy": policy, "topas_best_router": best, "topas": dict(avg[best])}
    if SGLANG_DEFAULT_PAIR in avg:
        head[SGLANG_DEFAULT_PAIR] = avg[SGLANG_DEFAULT_PAIR]
        for key in ("mean_jct", "p99_jct"):
            head[f"{key}_vs_lpm_cache"] = avg[best][key] / avg[SGLANG_DEFAULT_PAIR][key]
    for key in ("mean_jct", "p99_jct"):
        if f"best_baseline_{key}" in out:
            head[f"{key}_vs_best_baseline"] = avg[best][key] / out[f"best_baseline_{key}"]["value"]
    return head


def _max_rate(cfg: ClusterBenchConfig, policy: str, router: str, n: int, target: float) -> float:
    """Highest offered load (as tasks/s) whose p99 JCT <= target, by bisection on the load."""
    lo, hi = SCALING_LOAD_RANGE
    if _run(cfg, policy, router, n, lo).p99_jct > target:
        return 0.0
    for _ in range(SCALING_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _run(cfg, policy, router, n, mid).p99_jct <= target else (lo, mid)
    budget = cfg.profile.kv_budget_tokens if cfg.kv_budget is None else cfg.kv_budget
    return rate_for_load(lo, n * capacity_rps(cfg.workflow, cfg.profile, budget))


def scaling(cfg: ClusterBenchConfig, policy: str, router: str) -> dict[str, Any]:
    target = cfg.p99_target_s
    if target is None:
        target = 1.5 * _run(cfg, policy, router, 1, 0.3).p99_jct
    rates = {n: _max_rate(cfg, policy, router, n, target) for n in cfg.scaling_replicas}
    base = rates.get(1)
    return {"policy": policy, "router": router, "p99_target_s": target,
            "rows": [{"replicas": n, "max_rate_rps": r,
                      "efficiency": r / (n * base) if base else None} for n, r in rates.items()]}


def run_cluster_bench(cfg: ClusterBenchConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The cluster bench JSON document (module docstring)."""
    loads = cfg.loads or tuple(cfg.workflow.loads)
    by_n = []
    for n in cfg.replicas:
        points = []
        for load in loads:
            results = {}
            for policy in cfg.policies:
                for router in cfg.routers:
                    if progress:
                        progress(f"{n} replicas, load {load:g}: {policy}+{router}")
                    results[f"{policy}+{router}"] = _run(cfg, policy, router, n, load).as_dict()
            points.append({"load": load, "results": results})
        by_n.append({"replicas": n, "points": points, "summary": _summary(points)})
    doc: dict[str, Any] = {"workload": cfg.workflow.name, "profile": cfg.profile.name, "seed": cfg.seed,
                           "tasks_per_replica": cfg.tasks_per_replica, "loads": list(loads),
                           "policy_options": options_record(cfg.policy_options), "by_replicas": by_n}
    if cfg.scaling_pairs:
        doc["scaling"] = [scaling(cfg, p, r) for p, r in cfg.scaling_pairs]
    return doc
