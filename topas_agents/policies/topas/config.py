"""Topas configuration: every knob in one frozen dataclass, one default for all workloads.

Factories and the CLI pass options as keyword arguments whose values may be strings
(`--policy-opt beta=0.5`) or numbers; `make_config` validates and converts them and raises
`ConfigError` naming the offending option.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from ...errors import ConfigError


@dataclass(frozen=True, slots=True)
class TopasConfig:
    """Defaults are the single configuration used for every workload (no per-workload tuning).

    beta        weight of V_reuse, the one-hop lookahead value of keeping prefixes that
                newly released downstream stages will need (0 disables it).
    rho         strength of task-level log aging g = 1 + rho*log(1 + age/H) (0 disables it).
    enum_agents M: enumerate every prefix subset when the active agent pool has <= M agents,
                else greedy additions + one pair test + drop/swap repairs.
    k_admit     most admissions per decision.
    k_preempt   most preemptions per decision (states needing more are infeasible).
    samples     Monte Carlo sample budget for E[longest path] on DAGs (common random numbers,
                Latin-hypercube strata; chains and point masses are computed exactly).
    history     completed executions kept per (workflow, stage) for the empirical profile.
    refresh     rebuild a stage's empirical distribution after this many new samples
                (bounds cache churn; the first samples are folded in at once, see profiles.py).
    horizon     the scheduling interval, as a multiple of the observed mean request
                service: progress credited to a request is min(its remaining service,
                horizon * mean request service).
    width       greedy search: outside agents tried per step (ranked by demand), and members
                tried by the drop/swap repairs.
    max_additions  greedy search: most agents added per decision (bounds the cost on large
                budgets; the set keeps growing at the next decisions).
    size_weight SRPT-like task weight (H/W)^size_weight, W = expected remaining work of the task
                (0: the weight is aging alone).
    work_floor  progress of a request is at least work_floor x the service it receives, also
                off the critical path (0: pure critical-path gain; 1: pure work).
    kv_exp      GreedyPack fills by task weight x progress / kv_tokens**kv_exp (kv_tokens is
                the full decode reservation). 0 (default): by weighted progress alone; 1 (the
                earlier default, knapsack density) ranked long-output stages, often on the
                critical path, behind short ones.
    block       weight of J_block (occupancy.py): KV a state leaves free that no shut-out agent
                (its smallest waiting request, plus its prefix unless resident) can use stays
                stranded until its longest new admission ends; charged block x the shut-out
                tasks' weights x that service x the stranded fraction of the budget. Without it,
                a long request that pins a small prefix keeps large-prefix agents out for its
                whole decode (5-7x LPM on a random-suite ReAct workflow; 2x on a loop whose
                large agent's request needs the whole budget). 0 disables it.
    backfill    EASY backfilling for the oldest task's first waiting request (the head) once it
                has waited backfill x the mean request service: when it fits it is admitted in
                every state; when it does not, a request that would still run when the running
                ones have freed the head's KV may only use the KV left over after the head.
                Without it, large requests of old tasks are passed over by smaller ones for
                ever (1.5x Parrot on random-suite loops); applied at once (0 wait) it turns
                Topas into task FCFS with prefix thrash (chain3 1.2x Parrot). 0 disables it.
    advance     weight of the head's advance (occupancy.py): a state that starts the reserved
                head now, preempting only requests of younger tasks, gains advance x the head
                task's weight x the reservation's start_s. Without it the drain before a head
                that needs the whole budget runs near empty (1.46x LPM on a random-suite loop,
                1.33x with it). 0 disables it.
    rivals      1: the decisions LPM and Parrot would take on the same snapshot are scored as
                states with the same utility, and the best state wins (the search only visits
                a few prefix sets; the baselines' states are cheap extra candidates). 0: off.
    seed        seed of the sample matrix (decisions are deterministic given it).
    """

    beta: float = 1.0
    rho: float = 1.0
    enum_agents: int = 6
    k_admit: int = 32
    k_preempt: int = 4
    samples: int = 64
    history: int = 64
    refresh: int = 8
    horizon: float = 0.3
    width: int = 4
    max_additions: int = 8
    size_weight: float = 1.0
    work_floor: float = 0.25
    kv_exp: float = 0.0
    block: float = 0.5
    backfill: float = 4.0
    advance: float = 1.0
    rivals: int = 1
    seed: int = 0


# Upper bounds where a huge value is not "more of the same" but overflow. size_weight: the
# weight is (H/W)**size_weight with H/W up to 1000, so 400 overflowed a float (a traceback
# mid-run); by 16 the order is already strict shortest-remaining-work first. beta: V_reuse x
# 1e6 already outranks every other term; topas-paper at 1e200 overflowed its values and its
# search never ended.
MAX_SIZE_WEIGHT = 16.0
MAX_BETA = 1e6

class OptionLimit(NamedTuple):
    """What an option accepts: its kind and its range (`hi` None: unbounded above)."""

    kind: type
    lo: float
    hi: float | None


_LIMITS: dict[str, OptionLimit] = {
    "beta": OptionLimit(float, 0.0, MAX_BETA),
    "rho": OptionLimit(float, 0.0, None),
    "enum_agents": OptionLimit(int, 0, 16),
    "k_admit": OptionLimit(int, 1, None),
    "k_preempt": OptionLimit(int, 0, None),
    "samples": OptionLimit(int, 1, 4096),
    "history": OptionLimit(int, 1, 100_000),
    "refresh": OptionLimit(int, 1, None),
    "horizon": OptionLimit(float, 1e-6, None),
    "width": OptionLimit(int, 1, 64),
    "max_additions": OptionLimit(int, 1, 1024),
    "size_weight": OptionLimit(float, 0.0, MAX_SIZE_WEIGHT),
    "work_floor": OptionLimit(float, 0.0, 1.0),
    "kv_exp": OptionLimit(float, 0.0, 2.0),
    "block": OptionLimit(float, 0.0, None),
    "backfill": OptionLimit(float, 0.0, None),
    "advance": OptionLimit(float, 0.0, None),
    "rivals": OptionLimit(int, 0, 1),
    "seed": OptionLimit(int, 0, None),
}
assert set(_LIMITS) == {f.name for f in dataclasses.fields(TopasConfig)}


def option_number(kind: type, value: Any) -> int | float:
    """An option value (a number or its text) as `kind`: an int must be integral (8.9 is not
    8), a float finite (no option means anything at infinity), a bool neither. ValueError,
    TypeError or OverflowError otherwise."""
    if isinstance(value, bool):
        raise ValueError
    if kind is int:
        num = float(value) if isinstance(value, str) else value
        if not isinstance(num, int | float) or num != int(num):
            raise ValueError
        return int(num)
    out = float(value)
    if not math.isfinite(out):
        raise ValueError
    return out


def _convert(name: str, value: Any, limits: dict[str, OptionLimit] | None = None) -> Any:
    kind, lo, hi = (limits or _LIMITS)[name]
    try:
        out = option_number(kind, value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"topas option '{name}' must be {'a finite number' if kind is float else 'an integer'}, got {value!r}") from None
    if out < lo or (hi is not None and out > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ConfigError(f"topas option '{name}' must be {bound}, got {value!r}")
    return out


def make_config(base: TopasConfig | None = None, **options: Any) -> TopasConfig:
    """`base` (default `TopasConfig()`) with `options` validated, converted and applied."""
    base = base or TopasConfig()
    unknown = sorted(set(options) - set(_LIMITS))
    if unknown:
        raise ConfigError(f"unknown topas option '{unknown[0]}' (known: {', '.join(_LIMITS)})")
    return replace(base, **{k: _convert(k, v) for k, v in options.items()}) if options else base
