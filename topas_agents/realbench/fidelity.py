"""Simulator fidelity: the real engine's task JCTs against the simulator's on the same trace.

    fidelity(real, sim, sim_model_only) -> {"policies": {...}, "ranking": {...}, "goal": {...}}

`real[policy]` and `sim[policy]` map task id -> JCT (s). Per policy: both means, the mean's
relative error `(sim - real) / real`, and the distribution of per-task relative errors (a
mean can be right while tasks are wrong both ways). `sim_model_only` is the same simulation
without the profile's per-call overhead, to show what that term contributes. The ranking
compares policies by mean JCT (lower is better); the goal is every mean within
`GOAL_REL_ERROR` and the same ranking.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..percentile import percentile

GOAL_REL_ERROR = 0.10  # issue #10: each policy's simulated mean JCT within 10% of the real one


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def task_errors(real: Mapping[str, float], sim: Mapping[str, float]) -> dict[str, Any]:
    """Per-task relative errors over the tasks both runs completed."""
    errs = sorted((sim[t] - real[t]) / real[t] for t in real if t in sim and real[t] > 0)
    if not errs:
        return {"n": 0}
    return {"n": len(errs), "mean": _mean(errs), "mean_abs": _mean([abs(e) for e in errs]),
            "min": errs[0], "p10": percentile(errs, 10), "p50": percentile(errs, 50),
            "p90": percentile(errs, 90), "max": errs[-1],
            "within_goal": sum(abs(e) <= GOAL_REL_ERROR for e in errs)}


def fidelity(real: Mapping[str, Mapping[str, float]], sim: Mapping[str, Mapping[str, float]],
             sim_model_only: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, Any]:
    policies: dict[str, Any] = {}
    for name in (p for p in real if p in sim):
        r, s = _mean(list(real[name].values())), _mean(list(sim[name].values()))
        entry: dict[str, Any] = {"real_mean_jct": r, "sim_mean_jct": s, "mean_jct_rel_error": (s - r) / r,
                                 "task_rel_error": task_errors(real[name], sim[name])}
        if sim_model_only is not None and name in sim_model_only:
            m = _mean(list(sim_model_only[name].values()))
            entry.update(sim_mean_jct_without_call_overhead=m, rel_error_without_call_overhead=(m - r) / r)
        policies[name] = entry
    by = lambda key: sorted(policies, key=lambda p: policies[p][key])  # noqa: E731
    ranking: dict[str, Any] = {"real": by("real_mean_jct"), "sim": by("sim_mean_jct")}
    # nothing compared is no evidence: `all([])` said the goal was met
    ranking["matches"] = ranking["real"] == ranking["sim"] if policies else None
    within = all(abs(e["mean_jct_rel_error"]) <= GOAL_REL_ERROR for e in policies.values()) if policies else None
    return {"policies": policies, "ranking": ranking,
            "goal": {"rel_error": GOAL_REL_ERROR, "means_within": within, "ranking_matches": ranking["matches"],
                     "met": (within and ranking["matches"]) if policies else None}}
