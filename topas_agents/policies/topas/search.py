"""Hierarchical state search over prefix sets R' (each packed by GreedyPack).

Small pools (<= M agents) are enumerated exhaustively; larger ones start from the incumbent
(the current resident set) with greedy single additions, one pair test at the first stall,
then drop and swap repairs. The incumbent's own pack is always a candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from ...snapshot import Decision
from .context import Context
from .pack import PackResult, greedy_pack, pack_requests


@dataclass(slots=True)
class Choice:
    pack: PackResult
    k: int  # admissions taken from pack.admits
    score: float
    changes: int  # prefixes that change residency (tie-breaker: fewer moves win)


def better(score: float, changes: int, best_score: float, best_changes: int) -> bool:
    """Strictly better score, or an equal one (to rounding) with fewer prefix changes."""
    tol = 1e-9 * max(1.0, abs(score), abs(best_score))
    if score > best_score + tol:
        return True
    return score >= best_score - tol and changes < best_changes


class Search:
    """Memoised packs of one decision; tracks the best state and the best non-empty one."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.packs: dict[frozenset[str], PackResult | None] = {}
        self.best: Choice | None = None
        self.best_nonempty: Choice | None = None

    def evaluate(self, agents: frozenset[str]) -> float:
        """Score of the best state with prefix set `agents` (-inf when infeasible)."""
        if agents in self.packs:
            pack = self.packs[agents]
            return pack.best()[0] if pack is not None else float("-inf")
        pack = self.packs[agents] = greedy_pack(self.ctx, agents)
        if pack is None:
            return float("-inf")
        changes = len(agents ^ self.ctx.gpu)
        for nonempty in (False, True):
            if nonempty and pack.preempt:
                continue  # the fallback must add work, not trade it
            score, k = pack.best(nonempty)
            if k < 0:
                continue
            incumbent = self.best_nonempty if nonempty else self.best
            if incumbent is None or better(score, changes, incumbent.score, incumbent.changes):
                choice = Choice(pack, k, score, changes)
                if nonempty:
                    self.best_nonempty = choice
                else:
                    self.best = choice
        return pack.best()[0]

    def choice(self) -> Choice | None:
        """The best state. A state that admits nothing and preempts nothing (the empty
        incumbent) is dropped when a state exists that admits work without preempting any."""
        best = self.best
        if best is not None and best.k == 0 and not best.pack.preempt and self.best_nonempty is not None:
            return self.best_nonempty
        return best


def active_pool(ctx: Context) -> list[str]:
    """Agents with waiting or running requests, resident ones, and V_reuse targets."""
    pool = set(ctx.waiting) | set(ctx.running_reqs) | set(ctx.gpu)
    pool.update(child for _, child in ctx.reuse_pairs if child in ctx.prefix)
    return sorted(pool)


def search(ctx: Context) -> Choice | None:
    pool = active_pool(ctx)
    s = Search(ctx)
    incumbent = frozenset(ctx.gpu)
    s.evaluate(incumbent)
    res = ctx.reservation
    if res is not None and res.now:  # the head runs in every state: make sure one is tried
        s.evaluate(incumbent | {res.agent})
    if len(pool) <= ctx.cfg.enum_agents:
        _enumerate(s, pool)
    else:
        _greedy(s, pool, incumbent)
    return s.choice()


def _enumerate(s: Search, pool: list[str]) -> None:
    ctx = s.ctx
    budget = ctx.snap.kv_budget
    tokens = [ctx.tokens[a] for a in pool]
    useful = [bool(ctx.waiting.get(a)) or bool(ctx.running_reqs.get(a)) or a in ctx.gpu for a in pool]
    for mask in range(1 << len(pool)):
        total = 0
        ok = True
        for i in range(len(pool)):
            if mask >> i & 1:
                total += tokens[i]
                if not useful[i] and ctx.cfg.beta <= 0.0:
                    ok = False
        if ok and total <= budget:
            s.evaluate(frozenset(a for i, a in enumerate(pool) if mask >> i & 1))


def _greedy(s: Search, pool: list[str], incumbent: frozenset[str]) -> None:
    """Greedy single additions (best of the `width` highest-demand outside agents), one pair
    test at the first stall, then drop/swap repairs. At most `max_additions` additions per
    decision: on a large budget the set keeps growing over the next decisions instead."""
    ctx = s.ctx
    width = ctx.cfg.width
    demand = {a: ctx.demand(a) for a in pool if a not in incumbent and ctx.waiting.get(a)}
    ranked = sorted(demand, key=lambda a: (-demand[a], a))
    current, score = incumbent, s.evaluate(incumbent)
    pair_tested = False
    for _ in range(ctx.cfg.max_additions):
        outside = [a for a in ranked if a not in current][:width]
        trials = [(s.evaluate(current | {a}), -i, a) for i, a in enumerate(outside)]
        best = max(trials, default=None)
        if best is not None and best[0] > score:
            current, score = current | {best[2]}, best[0]
            continue
        if pair_tested:
            break
        pair_tested = True
        pairs = [(s.evaluate(current | {a, b}), -i, (a, b))
                 for i, (a, b) in enumerate(combinations(outside, 2))]
        best_pair = max(pairs, default=None)
        if best_pair is None or best_pair[0] <= score:
            break
        current, score = current | set(best_pair[2]), best_pair[0]
    _repair(s, ranked, current, score)


def _repair(s: Search, ranked: list[str], current: frozenset[str], score: float) -> None:
    """Drop or swap one member: the `width` weakest members (fewest running requests, least
    demand) against the `width` strongest outside agents; first improvement wins, twice."""
    ctx = s.ctx
    width = ctx.cfg.width
    for _ in range(2):
        outside = [a for a in ranked if a not in current][:width]
        weakest = sorted(current, key=lambda a: (len(ctx.running_reqs.get(a, ())), ctx.demand(a), a))[:width]
        improved = False
        for a in weakest:
            for trial in [current - {a}] + [(current - {a}) | {b} for b in outside]:
                value = s.evaluate(frozenset(trial))
                if value > score:
                    current, score, improved = frozenset(trial), value, True
            if improved:
                break
        if not improved:
            return


def rival_choice(ctx: Context, decision: Decision) -> Choice | None:
    """Another policy's decision on the same snapshot as a Topas state, scored with the same
    utility (TopasConfig.rivals), its admissions cut to k_admit. None when it does not map onto
    a state: it preempts, admits nothing, names an unknown request, or does not fit."""
    if decision.preempt or not decision.admit:
        return None
    by_rid = ctx.waiting_by_rid()
    reqs = [by_rid.get(rid) for rid in decision.admit[:ctx.cfg.k_admit]]
    if any(r is None for r in reqs):
        return None
    agents = (ctx.gpu - set(decision.prefix_out)) | {r.agent for r in reqs} | set(decision.prefix_in)
    agents = frozenset(a for a in agents if a in ctx.tokens)
    items = [next(it for it in ctx.candidates(r.agent) if it.req.rid == r.rid) for r in reqs]
    pack = pack_requests(ctx, agents, items)
    if pack is None:
        return None
    return Choice(pack, len(items), pack.scores[-1], len(agents ^ ctx.gpu))
