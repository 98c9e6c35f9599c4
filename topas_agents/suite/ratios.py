"""A policy's JCT relative to the best baseline, by the paper's rule and per load.

`Runs` is one workflow's measurements: seed -> load -> policy -> metric -> value (None when
the bench reported a non-finite value).

* Paper rule (`paper_rule`): for each seed, average the metric over the loads; the
  comparator is the baseline with the lowest average; the ratio is policy / comparator;
  the result is the mean of the per-seed ratios (with a 95% t interval over seeds).
* Per load (`per_load`): at each load, average the metric over seeds first; the comparator
  is the baseline with the lowest seed-averaged value at that load. The contract "never
  worse than the best baseline" is per workflow AND per load, so this is the stricter view.

* Baseline floor (`baseline_floor`): at each load, the one baseline whose larger ratio
  (mean, p99) to each metric's best baseline is smallest, picked with hindsight. It is the
  best any policy could do that runs one stock policy per workflow and load (a perfect
  selector): where the mean-best and the p99-best baselines differ, even it loses on one
  metric, and only a policy better than both passes the per-load contract there.

The paper rule itself is `bench.aggregate`'s (one definition for the bench, the docs and the
suite); the per-load view is the suite's own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Metric = Literal["mean_jct", "p99_jct"]
METRICS: tuple[Metric, ...] = ("mean_jct", "p99_jct")

Runs = Mapping[int, Mapping[float, Mapping[str, Mapping[str, float | None]]]]


@dataclass(frozen=True, slots=True)
class Ratio:
    """`ratio` < 1 means the policy beat the comparator. `winners`: the comparator baseline
    (per seed for the paper rule, one name per load). `load` is None for the paper rule."""

    ratio: float | None
    winners: tuple[str, ...]
    load: float | None = None
    ci95: tuple[float, float] | None = None  # paper rule over >= 2 seeds

    @property
    def winner(self) -> str | None:
        """The most frequent comparator (ties: the first seen)."""
        return Counter(self.winners).most_common(1)[0][0] if self.winners else None


def _mean(values: Sequence[float | None]) -> float | None:
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None) / len(values)


def _best(values: Mapping[str, float | None], baselines: Sequence[str]) -> str | None:
    ranked = [b for b in baselines if values.get(b) is not None]
    return min(ranked, key=lambda b: values[b]) if ranked else None  # type: ignore[return-value,arg-type]


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def paper_rule(runs: Runs, policy: str, metric: Metric, baselines: Sequence[str]) -> Ratio:
    """bench.aggregate's paper rule on each seed's loads, then its mean (and 95% CI) over seeds."""
    from ..bench.aggregate import over_seeds
    from ..bench.aggregate import paper_rule as seed_rule

    names = [policy, *(b for b in baselines if b != policy)]
    summaries = []
    for seed in sorted(runs):
        by_load = runs[seed]
        points = [{"results": by_load[u]} for u in sorted(by_load)]
        summaries.append(seed_rule(points, [p for p in names if all(p in pt["results"] for pt in points)],
                                   baselines))
    row = over_seeds(summaries).get(policy)
    if row is None:
        return Ratio(None, ())
    key = f"{metric}_vs_best_baseline"
    best_key = "best_baseline" if metric == "mean_jct" else "best_baseline_p99"
    agg = row[key]
    winners = tuple(w for w in row[best_key] if w)
    if agg is None:
        return Ratio(None, winners)
    ci = tuple(agg["ci95"]) if agg["ci95"] else None
    return Ratio(agg["mean"], winners, None, ci)


def per_load(runs: Runs, policy: str, metric: Metric, baselines: Sequence[str]) -> tuple[Ratio, ...]:
    loads = sorted({u for by_load in runs.values() for u in by_load})
    out = []
    for u in loads:
        names = {policy, *baselines}
        avg = {p: _seed_avg(runs, u, p, metric) for p in names}
        best = _best(avg, baselines)
        ratio = _ratio(avg.get(policy), avg[best]) if best else None
        out.append(Ratio(ratio, (best,) if best else (), u))
    return tuple(out)


def _seed_avg(runs: Runs, u: float, policy: str, metric: Metric) -> float | None:
    """The policy's metric at load `u`, averaged over seeds (None if any seed lacks it)."""
    if not all(u in runs[s] and policy in runs[s][u] for s in runs):
        return None
    return _mean([runs[s][u][policy][metric] for s in sorted(runs)])


def baseline_floor(runs: Runs, baselines: Sequence[str]) -> dict[Metric, tuple[Ratio, ...]]:
    """metric -> one Ratio per load: the hindsight single-baseline pick (module docstring);
    `winners` names the baseline picked."""
    loads = sorted({u for by_load in runs.values() for u in by_load})
    out: dict[Metric, list[Ratio]] = {m: [] for m in METRICS}
    for u in loads:
        avg = {(b, m): _seed_avg(runs, u, b, m) for b in baselines for m in METRICS}
        known = [b for b in baselines if all(avg[b, m] is not None for m in METRICS)]
        best = {m: min((avg[b, m] for b in known), default=None) for m in METRICS}
        if not known or not all(best.values()):
            for m in METRICS:
                out[m].append(Ratio(None, (), u))
            continue
        pick = min(known, key=lambda b: max(avg[b, m] / best[m] for m in METRICS))  # type: ignore[operator]
        for m in METRICS:
            out[m].append(Ratio(_ratio(avg[pick, m], best[m]), (pick,), u))
    return {m: tuple(v) for m, v in out.items()}


def worst_load(ratios: Sequence[Ratio]) -> Ratio | None:
    """The load with the highest ratio (None-valued loads are skipped)."""
    known = [r for r in ratios if r.ratio is not None]
    return max(known, key=lambda r: r.ratio) if known else None  # type: ignore[arg-type,return-value]
