"""Algorithm 1 (hierarchical state search) of the paper, as printed.

|A_t| <= M: GreedyPack every subset of A_t. Otherwise: GreedyPack {R_t} and Repair(R_t);
from R_g = R_t take the best Phi-improving single addition over all outside agents; at the
first stall test all outside pairs once; Repair(R_g); add the incumbent S_t. Then remove the
empty incumbent if a nonempty state exists, and return the best score (deterministic ties:
the first state generated wins, equal scores prefer more admissions).

Named options (off by default, paper_config.py): `width` and `max_additions` bound the greedy
branch, `drop_incumbent` lets a waiting best state give way to one that admits without
preempting, `keep_idle`/`prefetch` add idle prefixes to A_t.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import combinations

from .paper_pack import Index, Pack, better, greedy_pack, idle_allowed
from .paper_value import v_reuse


@dataclass(frozen=True, slots=True)
class Choice:
    """A selected state: pack `pack` truncated to its first `k` admissions."""

    pack: Pack
    k: int
    score: float


class StateSet:
    """The generated states C_t: one GreedyPack per prefix set (memoised), best tracked."""

    def __init__(self, ix: Index) -> None:
        self.ix = ix
        self.phis: dict[frozenset[str], float] = {}
        self.best: Choice | None = None
        self.best_admitting: Choice | None = None  # option drop_incumbent: best with k >= 1, no preemption
        self.empty_incumbent: Choice | None = None
        self.evaluated: list[frozenset[str]] = []  # generation order (tests, diagnostics)

    def phi(self, agents: frozenset[str]) -> float:
        """Phi(R): best score GreedyPack emits for R (-inf if none); adds its states to C_t."""
        hit = self.phis.get(agents)
        if hit is not None:
            return hit
        self.evaluated.append(agents)
        pack = greedy_pack(self.ix, agents)
        best = pack.best() if pack is not None else None
        self.phis[agents] = best[0] if best is not None else float("-inf")
        if pack is not None:
            for k, score in pack.states:
                self.add(Choice(pack, k, score))
        return self.phis[agents]

    def add(self, c: Choice) -> None:
        if not self.ix.snap.running and c.k == 0 and not c.pack.agents:
            self.empty_incumbent = c  # Q_t empty: doing nothing is the empty incumbent
            return
        if self.best is None or better(c.score, c.k, self.best.score, self.best.k):
            self.best = c
        if c.k and not c.pack.preempt and (self.best_admitting is None or
                                           better(c.score, c.k, self.best_admitting.score, self.best_admitting.k)):
            self.best_admitting = c

    def choice(self) -> Choice | None:
        """argmax Score over C_t, the empty incumbent removed when a nonempty state exists. With
        option drop_incumbent, a best state that admits and preempts nothing gives way to the
        best state that admits without preempting (`topas`: waiting is never chosen over work
        that displaces nobody)."""
        best = self.best
        if (self.ix.cfg.drop_incumbent and best is not None and best.k == 0 and not best.pack.preempt
                and self.best_admitting is not None):
            return self.best_admitting
        return best if best is not None else self.empty_incumbent


def active_agents(ix: Index) -> list[str]:
    """A_t = {a(r) : r in W_t u Q_t} (options keep_idle/prefetch: plus prefixes with n_a > 0
    that may stay, or come, idle)."""
    pool = set(ix.waiting) | set(ix.running)
    pool |= {a for a in ix.counts if idle_allowed(ix, a)}
    return sorted(pool)


def repair(current: frozenset[str], pool: Iterable[str]) -> list[frozenset[str]]:
    """Repair(R): every single-agent drop and every single swap (member out, outsider in)."""
    members = sorted(current)
    outside = [a for a in sorted(pool) if a not in current]
    drops = [current - {a} for a in members]
    swaps = [(current - {a}) | {b} for a in members for b in outside]
    return drops + swaps


def search(ix: Index) -> tuple[Choice | None, StateSet]:
    pool = active_agents(ix)
    states = StateSet(ix)
    if len(pool) <= ix.cfg.M:
        for mask in range(1 << len(pool)):
            states.phi(frozenset(a for i, a in enumerate(pool) if mask >> i & 1))
    else:
        _greedy(states, pool)
    return states.choice(), states


def _demand(ix: Index, pool: list[str]) -> dict[str, float]:
    """Option width's ranking: an agent's waiting progress, sum of g_i Delta(r | {})."""
    return {a: sum(ix.gain_weight[r.task_id] * ix.first_delta(r) for r in ix.waiting.get(a, ())) for a in pool}


def _greedy(states: StateSet, pool: list[str]) -> None:
    ix = states.ix
    width, most = ix.cfg.width, ix.cfg.max_additions
    demand = _demand(ix, pool) if width else {}

    def outside_of(current: frozenset[str]) -> list[str]:
        """Every outside agent (the paper); with option width, the `width` of most demand."""
        out = [a for a in pool if a not in current]
        return sorted(out, key=lambda a: (-demand[a], a))[:width] if width else out

    # R_t restricted to A_t: an idle resident prefix can never be in R' (it has nothing to cover).
    r_t = frozenset(a for a in ix.resident if a in set(pool))
    r_g, phi_g = r_t, states.phi(r_t)
    for cand in repair(r_t, [*r_t, *outside_of(r_t)]):
        states.phi(cand)
    pair_tested = False
    additions = 0
    while not (most and additions >= most):
        outside = outside_of(r_g)
        best = _best(states, [r_g | {a} for a in outside])
        if best is not None and best[0] > phi_g:
            r_g, phi_g = best[1], best[0]
            additions += 1
            continue
        if pair_tested:
            break
        pair_tested = True
        best = _best(states, [r_g | {a, b} for a, b in combinations(outside, 2)])
        if best is None or best[0] <= phi_g:
            break
        r_g, phi_g = best[1], best[0]
        additions += 1
    for cand in repair(r_g, [*r_g, *outside_of(r_g)]):
        states.phi(cand)
    _add_incumbent(states)


def _best(states: StateSet, sets: list[frozenset[str]]) -> tuple[float, frozenset[str]] | None:
    """The best Phi among `sets` (the first in generation order on ties)."""
    best: tuple[float, frozenset[str]] | None = None
    for cand in sets:
        value = states.phi(cand)
        if best is None or value > best[0]:
            best = (value, cand)
    return best


def _add_incumbent(states: StateSet) -> None:
    """S_t itself: keep Q_t, admit nothing, R' = agents of Q_t (idle prefixes leave)."""
    ix = states.ix
    agents = frozenset(ix.running)
    pack = Pack(agents, ())
    score = v_reuse(agents, ix.counts, ix.tokens, ix.snap.profile, ix.cfg.beta)
    pack.states.append((0, score))
    states.add(Choice(pack, 0, score))
