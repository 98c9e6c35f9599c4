"""Losing cells rechecked at more arrival seeds (`topas bench --suite random ... --recheck S,...`).

A suite judges each (workflow, load) cell on the mean of a few seeds' runs, and a heavily
loaded run can be very sensitive to its first decisions (docs/suite.md: a few tasks of
different decisions moved one run's mean JCT by up to 42%). So a cell that loses on two seeds
may not lose on average. The recheck runs every policy of the suite again, at the losing cells'
loads only, at the given extra seeds, and judges each losing cell by the same per-load rule
over the suite's seeds and the extra ones together. Cells that did not lose are not rechecked
(a cell just inside the line may cross it on more seeds: the recheck confirms or clears
losses, it does not re-judge the suite).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..bench.aggregate import mean_ci
from ..errors import ConfigError
from .ratios import METRICS, Metric, per_load
from .report import LOSS_THRESHOLD, fmt_value
from .runner import Job, SuiteConfig, WorkflowResult, run_jobs


@dataclass(frozen=True, slots=True)
class Recheck:
    """One losing (workflow, load, policy) cell over the suite's seeds plus the extra ones."""

    workflow: str
    load: float
    policy: str
    suite_ratio: Mapping[Metric, float | None]  # per-load ratio on the suite's seeds
    ratio: Mapping[Metric, float | None]  # the same rule over every seed
    winner: Mapping[Metric, str | None]  # the comparator baseline over every seed
    ci95: Mapping[Metric, tuple[float, float] | None]  # t interval of per-seed ratios to it
    seeds: tuple[int, ...]

    @property
    def holds(self) -> bool:
        """Still a loss over every seed (either metric above LOSS_THRESHOLD)."""
        return any(r is not None and r > LOSS_THRESHOLD for r in self.ratio.values())

    def as_dict(self) -> dict[str, Any]:
        return {"workflow": self.workflow, "load": self.load, "policy": self.policy, "seeds": list(self.seeds),
                "holds": self.holds, **{m: {"suite_ratio": self.suite_ratio[m], "ratio": self.ratio[m],
                                            "winner": self.winner[m],
                                            "ci95": list(self.ci95[m]) if self.ci95[m] else None}
                                        for m in METRICS}}


def losing_cells(result: WorkflowResult) -> dict[float, tuple[str, ...]]:
    """load -> the judged policies that lose there on either metric (suite seeds)."""
    out: dict[float, list[str]] = {}
    for policy, by_metric in result.per_load.items():
        for m in METRICS:
            for r in by_metric[m]:
                if r.ratio is not None and r.ratio > LOSS_THRESHOLD and policy not in out.get(r.load, []):
                    out.setdefault(r.load, []).append(policy)  # type: ignore[arg-type]
    return {u: tuple(p) for u, p in sorted(out.items())}


def check_recheck(config: SuiteConfig, seeds: Sequence[int]) -> None:
    """Before the suite runs: the extra seeds must be new (a seed counted twice would weigh
    its runs twice)."""
    clash = sorted(set(seeds) & set(config.seeds))
    if clash:
        raise ConfigError(f"--recheck seeds must differ from --seeds (both have {', '.join(map(str, clash))})")


def run_recheck(results: Sequence[WorkflowResult], config: SuiteConfig, seeds: Sequence[int]) -> list[Recheck]:
    """Rerun every losing cell at `seeds` (every policy, only the losing loads) and judge it
    over the suite's seeds and `seeds` together."""
    check_recheck(config, seeds)
    cells = {r.gen.index: losing_cells(r) for r in results}
    groups: dict[tuple[float, ...], list[Job]] = {}  # jobs that share their losing loads run together
    for r in results:
        if cells[r.gen.index]:
            loads = tuple(cells[r.gen.index])
            groups.setdefault(loads, []).extend(Job(r.gen.index, s, r.gen.workflow) for s in seeds)
    extra: dict[tuple[int, int], Any] = {}
    for loads, jobs in groups.items():
        extra.update(run_jobs(jobs, replace(config, loads=loads, seeds=tuple(seeds), reuse=None)))
    out = []
    for r in results:
        for load, policies in cells[r.gen.index].items():
            runs = {s: {load: r.runs[s][load]} for s in r.runs}
            runs.update({s: {load: extra[r.gen.index, s][load]} for s in seeds})
            out.extend(_judge(r, load, p, runs, config) for p in policies)
    return out


def _judge(r: WorkflowResult, load: float, policy: str, runs: Mapping[int, Any], config: SuiteConfig) -> Recheck:
    suite_ratio = {m: next(x.ratio for x in r.per_load[policy][m] if x.load == load) for m in METRICS}
    ratio, winner, ci = {}, {}, {}
    for m in METRICS:
        (x,) = per_load(runs, policy, m, config.baselines)
        ratio[m], winner[m] = x.ratio, x.winner
        per_seed = [runs[s][load][policy][m] / runs[s][load][x.winner][m] for s in sorted(runs)] \
            if x.ratio is not None and x.winner is not None else []
        interval = mean_ci(per_seed) if len(per_seed) >= 2 else None
        ci[m] = (interval.low, interval.high) if interval is not None and interval.low is not None else None
    return Recheck(r.gen.workflow.name, load, policy, suite_ratio, ratio, winner, ci, tuple(sorted(runs)))


def format_recheck(rechecks: Sequence[Recheck], seeds: Sequence[int]) -> str:
    """The report's recheck section: one line per losing cell, then how many hold."""
    if not rechecks:
        return f"recheck at seeds {','.join(map(str, seeds))}: no losing cell to recheck"
    lines = [f"losing cells rechecked at {len(seeds)} more seeds ({','.join(map(str, seeds))}); per-load ratio "
             "on the suite's seeds -> on every seed [95% CI of per-seed ratios]:"]
    for c in rechecks:
        parts = []
        for m in METRICS:
            ci = c.ci95[m]
            band = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
            parts.append(f"{m} {fmt_value(c.suite_ratio[m])} -> {fmt_value(c.ratio[m])}{band} vs {c.winner[m]}")
        lines.append(f"  {c.workflow}@{c.load:g} {c.policy}: " + "; ".join(parts) + ("  HOLDS" if c.holds else ""))
    held = sum(c.holds for c in rechecks)
    lines.append(f"{held} of {len(rechecks)} losing cells still lose over every seed (ratio > {LOSS_THRESHOLD})")
    return "\n".join(lines)
