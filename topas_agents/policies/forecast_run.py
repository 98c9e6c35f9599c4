"""One forecast of the guard (`policies/forecast.py`): the synthetic traces it simulates from
the observed arrival rates, and how it scores the policies on them. A forecast runs inline
in `decide` or in a worker process (live engines), so what it needs travels as one picklable
`ForecastJob`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..costmodel import Profile
from ..errors import TopasError
from ..workflow import TaskPlan, Workflow
from . import make_policy

if TYPE_CHECKING:
    from .forecast import ForecastConfig


# ForecastConfig.max_calls keeps at least this many tasks of a trace: fewer would rank
# policies on a handful of tasks' queueing.
MIN_FORECAST_TASKS = 16


class JctPair(NamedTuple):
    """One simulated run's mean and p99 JCT (seconds); infinities where it failed."""

    mean: float
    p99: float


class Rate(NamedTuple):
    """An arrival rate (tasks/s) and the number of gaps it was estimated from."""

    per_s: float
    gaps: int


def forecast_trace(workflows: Mapping[str, Workflow], rates: Mapping[str, float], tasks: int,
                   seed: int) -> tuple[TaskPlan, ...]:
    """`tasks` tasks in all, split across workflows by rate, each workflow Poisson at its rate
    (tasks/s), merged in arrival order (ids stay unique: they carry the workflow's name)."""
    from ..sim.driver import make_trace

    total = sum(rates.values())
    plans: list[TaskPlan] = []
    for name, wf in sorted(workflows.items()):
        n = max(1, round(tasks * rates[name] / total))
        plans += make_trace(wf, n, rates[name], seed)
    return tuple(sorted(plans, key=lambda p: (p.arrival_s, p.task_id)))


def bounded_trace(trace: tuple[TaskPlan, ...], max_calls: int) -> tuple[TaskPlan, ...]:
    """The first tasks of `trace` whose calls fit `max_calls`, and at least MIN_FORECAST_TASKS
    (ForecastConfig.max_calls); `trace` itself when it fits."""
    calls = 0
    for k, plan in enumerate(trace):
        calls += sum(len(rounds) for rounds in plan.rounds.values())
        if calls > max_calls and k >= MIN_FORECAST_TASKS:
            return trace[:k]
    return trace


def trace_rates(rates: Mapping[str, Rate], i: int, config: ForecastConfig) -> dict[str, float]:
    """The rates trace `i` runs at (ForecastConfig.spread)."""
    z = NormalDist().inv_cdf((i + 0.5) / len(config.seeds))
    return {name: r.per_s * float(np.exp(config.spread * z / np.sqrt(r.gaps))) for name, r in rates.items()}


class Stint(NamedTuple):
    """A policy the guard ran, from the labelled arrival count at which it started."""

    start: int
    policy: str


class ForecastJob(NamedTuple):
    """What one forecast simulates (picklable: background forecasts run in a worker process)."""

    workflows: Mapping[str, Workflow]
    rates: Mapping[str, Rate]
    profile: Profile
    kv_budget: int
    policies: tuple[str, ...]  # Topas first: the scores are relative to it
    topas_options: Mapping[str, Any]
    config: ForecastConfig
    stints: tuple[Stint, ...] = ()  # what the guard ran so far (ForecastConfig.switch="modelled")
    at: int = 0  # the labelled arrivals so far: where a modelled switch takes over


class ScheduledPolicy:
    """Runs each stint's policy from its arrival count on, in one simulation: a forecast of
    the guard's schedule so far followed by a candidate (ForecastConfig.switch="modelled").
    Like the guard, the one Topas instance keeps learning while another policy runs."""

    def __init__(self, stints: tuple[Stint, ...], topas: str, topas_options: Mapping[str, Any] | None) -> None:
        from .forecast import _Arrivals  # the guard's own count (forecast imports this module)

        self.name = "+".join(f"{s.policy}@{s.start}" for s in stints)
        self._stints = tuple(sorted(stints, key=lambda s: s.start))
        self._topas_name = topas
        self._topas = make_policy(topas, topas_options)
        self._arrivals = _Arrivals()
        self._index = -1
        self.active: Any = None
        self._advance()

    def _advance(self) -> None:
        while self._index + 1 < len(self._stints) and self._stints[self._index + 1].start <= self._arrivals.count:
            self._index += 1
            name = self._stints[self._index].policy
            if self.active is None or name != self._stints[self._index - 1].policy:
                self.active = self._topas if name == self._topas_name else make_policy(name)

    def decide(self, snap: Any) -> Any:
        self._arrivals.observe(snap, window=3)
        self._advance()
        if self.active is not self._topas:
            self._topas.profiles.observe(snap.events)
        return self.active.decide(snap)


def run_forecast(job: ForecastJob) -> dict[str, float]:
    """Each policy's forecast score (lower is better; ForecastConfig.score says how), from
    the same synthetic traces for every policy. A policy whose simulation fails scores
    infinity (never chosen); a trace on which the reference fails is scored relative to its
    best run. A trace on which every policy fails scores nothing finite (infinities and NaN)."""
    runs = [_simulate_trace(job, i, seed) for i, seed in enumerate(job.config.seeds)]
    if job.config.score == "regret":
        return _regret_scores(runs, job.policies[1:])
    return _combined_scores(runs, job.policies[0])


def _simulate_trace(job: ForecastJob, i: int, seed: int) -> dict[str, JctPair]:
    """Trace `i`: policy -> its JCTs, infinities where the simulation failed."""
    from ..sim.driver import simulate

    trace = bounded_trace(forecast_trace(job.workflows, trace_rates(job.rates, i, job.config), job.config.tasks,
                                         seed), job.config.max_calls)
    runs: dict[str, JctPair] = {}
    for name in job.policies:
        options = job.topas_options if name == job.policies[0] else None
        if job.config.switch == "modelled" and job.stints:
            policy: Any = ScheduledPolicy((*job.stints, Stint(job.at, name)), job.policies[0], job.topas_options)
        else:
            policy = make_policy(name, options)
        try:
            run = simulate(trace, policy, job.profile, kv_budget=job.kv_budget, host_tier=job.profile.host_tier)
        except TopasError:
            runs[name] = JctPair(np.inf, np.inf)
            continue
        runs[name] = JctPair(run.mean_jct, run.p99_jct)
    return runs


def _reference(runs: Mapping[str, JctPair], names: tuple[str, ...]) -> JctPair:
    """Each metric's best over `names`; over every run where none of `names` finished."""
    mean = min(runs[n].mean for n in names)
    p99 = min(runs[n].p99 for n in names)
    if not np.isfinite(mean):
        mean = min(r.mean for r in runs.values())
        p99 = min(r.p99 for r in runs.values())
    return JctPair(mean, p99)


def _combined_scores(runs: list[dict[str, JctPair]], topas: str) -> dict[str, float]:
    """Per trace the mean of mean-JCT and p99-JCT ratios to Topas, averaged over traces."""
    ratios: dict[str, list[float]] = {p: [] for p in runs[0]}
    for trace in runs:
        ref = _reference(trace, (topas,))
        for name, run in trace.items():
            ratios[name].append(0.5 * (_ratio(run.mean, ref.mean) + _ratio(run.p99, ref.p99)))
    return {name: float(np.mean(v)) for name, v in ratios.items()}


def _regret_scores(runs: list[dict[str, JctPair]], candidates: tuple[str, ...]) -> dict[str, float]:
    """The larger of the mean-JCT and p99-JCT ratios to each metric's best candidate, each
    ratio averaged over the traces first (the contract: per metric, averaged over seeds)."""
    means: dict[str, list[float]] = {p: [] for p in runs[0]}
    p99s: dict[str, list[float]] = {p: [] for p in runs[0]}
    for trace in runs:
        ref = _reference(trace, candidates)
        for name, run in trace.items():
            means[name].append(_ratio(run.mean, ref.mean))
            p99s[name].append(_ratio(run.p99, ref.p99))
    return {name: float(max(np.mean(means[name]), np.mean(p99s[name]))) for name in means}


def _ratio(value: float, reference: float) -> float:
    """value / reference; 1 when the reference is 0 (every task of a trace took no time on
    the clock's resolution, so every policy ties; a ZeroDivisionError ended the run)."""
    return value / reference if reference > 0 else (1.0 if value <= reference else math.inf)
