"""The paper's comparison rule and its aggregation over seeds (public: the bench, `topas docs`
and the random-workflow suite all call these).

Paper rule (section V-A): "Workload-level comparisons average each metric over the reported
operating points; for each JCT metric, the comparator is the baseline with the lowest
average." So for metric m (mean or p99 JCT), policy P and operating points 1..K:

    avg_m(P)   = (1/K) * sum_k m_k(P)
    best_m     = argmin over B in BASELINES (the paper's five) of avg_m(B)
    ratio_m(P) = avg_m(P) / avg_m(best_m)          (< 1: P beats the best baseline)

This is *not* the mean of per-point ratios: one overloaded point can dominate the average,
exactly as it does in the paper's numbers.

Over seeds s = 1..n (each seed: its own arrival trace and task sizes, the paper rule applied
per seed), we report the mean of ratio_m and a 95% confidence interval from the
t-distribution:

    mean = (1/n) * sum_s x_s,   sd = sqrt(sum_s (x_s - mean)^2 / (n - 1))
    CI   = mean -/+ t_{0.975, n-1} * sd / sqrt(n)

(no CI for n = 1). t quantiles come from a table (df 1..30) and a Cornish-Fisher expansion
beyond it, so numpy is the only dependency.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..percentile import percentile  # noqa: F401  (re-exported: the bench's one percentile)
from ..policies import BASELINES

METRICS = ("mean_jct", "p99_jct")
RATIO_KEYS = {"mean_jct": "mean_jct_vs_best_baseline", "p99_jct": "p99_jct_vs_best_baseline"}
BEST_KEYS = {"mean_jct": "best_baseline", "p99_jct": "best_baseline_p99"}

# t_{0.975, df} for df = 1..30 (two-sided 95%), to 6 decimals.
_T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004,
         2.262157, 2.228139, 2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905,
         2.109816, 2.100922, 2.093024, 2.085963, 2.079614, 2.073873, 2.068658, 2.063899,
         2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)
_Z975 = 1.959963984540054


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975  # Cornish-Fisher expansion in 1/df; error < 1e-5 for df > 30
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


@dataclass(frozen=True, slots=True)
class Interval:
    """Mean of per-seed values with its 95% t confidence interval (low/high None if n < 2)."""

    mean: float
    low: float | None
    high: float | None
    n: int
    values: tuple[float, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "ci95": None if self.low is None else [self.low, self.high],
                "n": self.n, "values": list(self.values)}


def mean_ci(values: Sequence[float]) -> Interval:
    """`Interval` over `values` (formula in the module docstring)."""
    xs = np.asarray(values, dtype=float)
    if xs.size == 0:
        raise ValueError("mean_ci of no values")
    mean = float(xs.mean())
    if xs.size < 2:
        return Interval(mean, None, None, 1, tuple(float(x) for x in xs))
    half = t_quantile_975(xs.size - 1) * float(xs.std(ddof=1)) / math.sqrt(xs.size)
    return Interval(mean, mean - half, mean + half, int(xs.size), tuple(float(x) for x in xs))


def _avg(values: Sequence[float | None]) -> float | None:
    """Mean over points; None if any point has no value (a policy that failed a point
    has no workload-level average)."""
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals and len(vals) == len(values) else None


def paper_rule(points: Sequence[Mapping[str, Any]], policies: Sequence[str],
               baselines: Sequence[str] = BASELINES) -> dict[str, dict[str, Any]]:
    """Section V-A over one seed's operating points.

    `points`: bench points, each `{"results": {policy: {"mean_jct": s, "p99_jct": s, ...}}}`.
    Returns per policy: `mean_jct`, `p99_jct` (averages over points), `best_baseline`,
    `best_baseline_p99` (the comparators: baselines run here with the lowest average mean /
    p99), `mean_jct_vs_best_baseline`, `p99_jct_vs_best_baseline` (ratio of averages; None
    when no baseline ran or a value is missing)."""
    avg = {p: {m: _avg([pt["results"][p][m] for pt in points]) for m in METRICS} for p in policies}
    best: dict[str, str | None] = {}
    for m in METRICS:
        ranked = [b for b in baselines if b in avg and avg[b][m] is not None]
        best[m] = min(ranked, key=lambda b, k=m: avg[b][k]) if ranked else None
    out: dict[str, dict[str, Any]] = {}
    for p, a in avg.items():
        row: dict[str, Any] = dict(a)
        for m in METRICS:
            ref = avg[best[m]][m] if best[m] else None
            row[BEST_KEYS[m]] = best[m]
            row[RATIO_KEYS[m]] = a[m] / ref if a[m] is not None and ref else None
        out[p] = row
    return out


def over_seeds(per_seed_summaries: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Aggregate `paper_rule` outputs of several seeds (same policies in each).

    Returns per policy, for each key in `mean_jct`, `p99_jct`, `mean_jct_vs_best_baseline`,
    `p99_jct_vs_best_baseline`: `Interval.as_dict()` (mean over seeds, `ci95` [low, high] or
    None, `n`, per-seed `values`), or None if any seed lacks the value; plus
    `best_baseline` / `best_baseline_p99`: the per-seed comparators (a list, one per seed)."""
    if not per_seed_summaries:
        raise ValueError("over_seeds of no seeds")
    out: dict[str, dict[str, Any]] = {}
    for p in per_seed_summaries[0]:
        row: dict[str, Any] = {}
        for key in (*METRICS, *RATIO_KEYS.values()):
            vals = [s[p][key] for s in per_seed_summaries]
            row[key] = None if any(v is None for v in vals) else mean_ci(vals).as_dict()
        for key in BEST_KEYS.values():
            row[key] = [s[p][key] for s in per_seed_summaries]
        out[p] = row
    return out
