"""The score terms of a candidate post-decision state S' = (R', Q').

    score(S') = J_admit^age - J_move - J_redo - J_revoke + beta * V_reuse

All terms are in task-seconds: J_admit is the (aged) expected reduction of tasks' longest
remaining paths, the costs are delays or lost work charged to the tasks that suffer them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ...costmodel import Profile
from ...snapshot import PrefixView, RequestView
from ...workflow import Workflow


def aging(age_s: float, scale_s: float, rho: float) -> float:
    """Task-level log aging g = 1 + rho * log(1 + age / H_age)."""
    if rho <= 0.0 or age_s <= 0.0:
        return 1.0
    return 1.0 + rho * math.log1p(age_s / max(scale_s, 1e-9))


def load_cost(prefix: PrefixView | None, tokens: int, profile: Profile) -> tuple[float, bool]:
    """(seconds to make a prefix GPU-resident, whether it uses the serialized host link).

    Resident or loading: free. On CPU with a host tier: a swap-in over the link. Otherwise
    (dropped, never cached, or no host tier): recompute its prefill.
    """
    if prefix is not None and prefix.on_gpu:
        return 0.0, False
    if profile.host_tier and prefix is not None and prefix.location == "cpu":
        return profile.swap_s(tokens), True
    return profile.prefill_s(tokens), False


def reload_cost(tokens: int, profile: Profile) -> float:
    """What a prefix evicted now costs to bring back later (swap-in if a host tier exists)."""
    return profile.swap_s(tokens) if profile.host_tier else profile.prefill_s(tokens)


def j_move(incoming: Sequence[tuple[float, bool, float]]) -> float:
    """Delay charged to admitted tasks waiting for incoming prefixes.

    `incoming`: (load seconds, uses the serialized link, admitted tasks waiting for it -- a
    count, or the sum of those tasks' weights).
    Link transfers are serialized: the k-th waits for all earlier ones; they are ordered by
    Smith's rule (seconds / tasks ascending), which minimises the total. Recomputes are not
    on the link; each waiting task is charged the recompute once.
    """
    total = 0.0
    link = []
    for seconds, on_link, tasks in incoming:
        if tasks <= 0:
            continue
        if on_link:
            link.append((seconds / tasks, seconds, tasks))
        else:
            total += seconds * tasks
    clock = 0.0
    for _, seconds, tasks in sorted(link):
        clock += seconds
        total += clock * tasks
    return total


def j_redo(req: RequestView, profile: Profile) -> float:
    """Work lost by preempting `req`: on resume the engine re-prefills input + generated."""
    return profile.prefill_s(req.input_tokens + req.generated, req.prefix_tokens)


class CreditStore:
    """J_revoke: the admission credit (J_admit at admission time) of each admitted request."""

    __slots__ = ("_credit",)

    def __init__(self) -> None:
        self._credit: dict[str, float] = {}

    def grant(self, rid: str, value: float) -> None:
        self._credit[rid] = value

    def get(self, rid: str) -> float:
        return self._credit.get(rid, 0.0)

    def revoke(self, rid: str) -> float:
        """Remove and return the credit of a preempted request."""
        return self._credit.pop(rid, 0.0)

    def sweep(self, running: Iterable[str]) -> None:
        """Clear credits of requests that completed (no longer running)."""
        live = set(running)
        for rid in [r for r in self._credit if r not in live]:
            del self._credit[rid]

    def __len__(self) -> int:
        return len(self._credit)

    def __contains__(self, rid: str) -> bool:
        return rid in self._credit


def released_children(wf: Workflow, stage: str, done: frozenset[str]) -> tuple[str, ...]:
    """Stages newly released when `stage` completes (V_reuse's one-hop lookahead).

    Each fork child counts separately; a join only when all its other predecessors are done.
    """
    out = []
    for child in wf.successors[stage]:
        if child in done:
            continue
        if all(p == stage or p in done for p in wf.stage(child).after):
            out.append(child)
    return tuple(out)


def imminence(residual_support, horizon_s: float) -> float:
    """Probability that a stage with this residual service finishes within the horizon."""
    n = len(residual_support)
    if n == 0:
        return 0.0
    # support is sorted ascending
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if residual_support[mid] <= horizon_s:
            lo = mid + 1
        else:
            hi = mid
    return lo / n
