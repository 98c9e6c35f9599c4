"""GreedyPack: the best request set Q' for one prefix set R' (every intermediate is a state).

For a prefix set P: running requests whose prefix is in P are retained, the others are
preempted (more than k_preempt makes P infeasible). Then, under the KV budget and k_admit:
  1. reserve: each prefix in P not covered by a retained request first gets its best
     waiting request (a prefix is only worth its KV if something runs on it);
  2. fill: waiting requests of P's agents by age-weighted progress per extra KV token, with
     same-task sequential marginals re-evaluated lazily (a sibling's admission changes them);
  3. zero-gain picks (off the critical path) continue the fill, tasks already represented
     first, so a task whose branches only pay off together still progresses.
Each admission yields a candidate state; `scores[k]` is the score after k admissions.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .context import Context
from .occupancy import delays_head, head_advance, stranded_cost, uses_spare
from .terms import j_move
from .valuation import Item, TaskCtx, priority

_EPS = 1e-12
# Reserve: an uncovered prefix gets the best fitting of its first few candidates (a fitting
# one is almost always among them; scanning the whole list costs O(waiting) per prefix set).
_RESERVE_LOOKAHEAD = 4
# Fill heap pops per decision: a few per admission plus a couple per list bounds the work of
# stale re-queues (a sibling's admission changes a marginal) on large queues.
_POPS_PER_ADMIT = 4
_POPS_PER_LIST = 2


@dataclass(slots=True)
class PackResult:
    agents: frozenset[str]
    preempt: tuple[Item, ...]
    admits: list[Item] = field(default_factory=list)
    credit: list[float] = field(default_factory=list)  # aged marginal value of each admission
    scores: list[float] = field(default_factory=list)  # after k admissions, k = 0..len(admits)

    def best(self, nonempty: bool = False) -> tuple[float, int]:
        """(score, k) of the best intermediate (k >= 1 when `nonempty`); ties: fewer admits."""
        start = 1 if nonempty else 0
        if start >= len(self.scores):
            return float("-inf"), -1
        k = max(range(start, len(self.scores)), key=lambda i: (self.scores[i], -i))
        return self.scores[k], k


class _Packer:
    """Mutable state of one GreedyPack run."""

    def __init__(self, ctx: Context, agents: frozenset[str], used: int, preempt: list[Item]) -> None:
        self.ctx = ctx
        self.agents = agents
        self.free = ctx.snap.kv_budget - used
        self.result = PackResult(agents, tuple(preempt))
        self.served: dict[str, frozenset] = {}
        self.represented: set[str] = set()
        self.admitted: set[str] = set()
        self.spare = ctx.reservation.extra if ctx.reservation is not None else 0  # see occupancy.py
        self.incoming = {a: [*ctx.load(a), {}] for a in agents if a not in ctx.gpu}
        # J_admit covers every request of Q': retained running requests keep their progress,
        # so a preemption forfeits it (on top of J_redo and J_revoke). The progress of all
        # running requests is the same in every state, so only what is forfeited is counted.
        self.gain = 0.0
        hit = {it.task.task_id: it.task for it in preempt}
        for task in hit.values():
            kept = [it for it in task.running if it.req.agent in agents]
            self.gain -= task.run_value - task.served_value(kept)
        self.loss = sum(ctx.preempt_cost(it) for it in preempt)
        self.beta = ctx.cfg.beta
        for it in preempt:
            if it.col >= 0:
                task = it.task
                self.served[task.task_id] = self._served(task) - {it.red}
        self.reuse = sum(v for (src, child), v in ctx.reuse_pairs.items() if src in agents and child in agents)
        self.move = 0.0
        self.result.scores.append(self.score())

    def _served(self, task: TaskCtx) -> frozenset:
        return self.served.get(task.task_id, task.base)

    def _reuse(self, it: Item) -> float:
        return sum(v for a, v in self.ctx.reuse(it) if a in self.agents)

    def score(self) -> float:
        return self.gain - self.move - self.loss + self.beta * self.reuse

    def marginal(self, it: Item) -> float:
        task = it.task
        if it.col < 0:
            return it.gain
        served = self._served(task)
        if served is task.base and task.task_id not in self.served:
            return it.gain
        return task.progress(served | {it.red}) - task.progress(served)

    def fits(self, it: Item) -> bool:
        if it.req.kv_tokens > self.free or it.req.rid in self.admitted:
            return False
        return not delays_head(self.ctx, it, self.spare)

    def admit(self, it: Item, m: float) -> None:
        task = it.task
        value = task.g * m
        self.free -= it.req.kv_tokens
        if uses_spare(self.ctx, it):
            self.spare -= it.req.kv_tokens
        self.admitted.add(it.req.rid)
        self.represented.add(task.task_id)
        if it.col >= 0:
            self.served[task.task_id] = self._served(task) | {it.red}
        self.result.admits.append(it)
        self.result.credit.append(value)
        self.gain += value
        inc = self.incoming.get(it.req.agent)
        if inc is not None and task.task_id not in inc[2]:
            inc[2][task.task_id] = task.g  # each waiting task charged once, at its weight
            stall = len(self.ctx.snap.running)  # a recompute is a prefill: the running batch waits too
            self.move = j_move([(s, link, sum(t.values()) + (0 if link or not t else stall))
                                for s, link, t in self.incoming.values()])
        if self.beta > 0.0:
            self.reuse += self._reuse(it)
        self.result.scores.append(self.score())


def greedy_pack(ctx: Context, agents: frozenset[str]) -> PackResult | None:
    """Pack prefix set `agents`; None when it is infeasible (budget or preemption cap)."""
    budget = ctx.snap.kv_budget
    used = sum(ctx.tokens[a] for a in agents)
    if used > budget:
        return None
    dropped = []
    n_preempt = 0
    for agent, kv in ctx.running_kv.items():
        if agent in agents:
            used += kv
        else:
            dropped.append(agent)
            n_preempt += len(ctx.running_reqs[agent])
    if used > budget or n_preempt > ctx.cfg.k_preempt:
        return None
    preempt = [it for agent in dropped for it in ctx.running_items(agent)]
    if any(it.pinned for it in preempt):  # about to finish: frees its KV anyway
        return None
    preempt.sort(key=lambda it: it.req.rid)
    res = ctx.reservation
    if res is not None and res.now and (res.agent not in agents or dropped):
        return None  # the head fits without preempting anyone: it runs in every state
    pk = _Packer(ctx, agents, used, preempt)
    if res is not None and res.now:
        head = next(it for it in ctx.candidates(res.agent) if it.req.rid == res.rid)
        if not pk.fits(head):
            return None
        pk.admit(head, max(pk.marginal(head), 0.0))
    order = sorted(agents)
    lists = [ctx.candidates(a) for a in order]
    if any(lists):
        min_kv = min(ctx.min_kv(a) for a, items in zip(order, lists, strict=True) if items)
        _reserve(pk, order, lists)
        deferred = _fill(pk, lists, min_kv)
        _zero_gain(pk, deferred, min_kv)
    return _charge_commitments(pk)


def pack_requests(ctx: Context, agents: frozenset[str], requests: list[Item]) -> PackResult | None:
    """The state with prefix set `agents` that keeps every running request and admits exactly
    `requests`, in order (how another policy's decision is scored); None when it does not fit."""
    used = sum(ctx.tokens[a] for a in agents) + sum(ctx.running_kv.values())
    if used + sum(it.req.kv_tokens for it in requests) > ctx.snap.kv_budget:
        return None
    pk = _Packer(ctx, agents, used, [])
    for it in requests:  # not through fits(): the other policy need not honour the head's reservation
        pk.admit(it, max(pk.marginal(it), 0.0))
    return _charge_commitments(pk)


def _charge_commitments(pk: _Packer) -> PackResult:
    """J_block (occupancy.py) is one commitment per state: charged alike to every k >= 1. The
    head's advance (occupancy.py) is credited from its admission on, and joins its credit."""
    result = pk.result
    advance = head_advance(pk.ctx, result)
    if advance is not None:
        i, value = advance
        result.credit[i] += value
        result.scores[i + 1:] = [v + value for v in result.scores[i + 1:]]
    if pk.ctx.cfg.block > 0.0:
        cost = stranded_cost(pk.ctx, result, pk.free)
        if cost > 0.0:
            result.scores[1:] = [v - cost for v in result.scores[1:]]
    return result


def _reserve(pk: _Packer, order: list[str], lists: list[list[Item]]) -> None:
    covered = {a for a in order if pk.ctx.running_reqs.get(a)}
    heads = []
    for agent, items in zip(order, lists, strict=True):
        if agent in covered or not items:
            continue
        head = next((it for it in items[:_RESERVE_LOOKAHEAD] if pk.fits(it)), None)
        if head is not None:
            heads.append(head)
    heads.sort(key=lambda it: (-it.prio, it.order, it.req.rid))
    for it in heads:
        if len(pk.result.admits) >= pk.ctx.cfg.k_admit:
            return
        if pk.fits(it):
            m = pk.marginal(it)
            pk.admit(it, max(m, 0.0))


def _fill(pk: _Packer, lists: list[list[Item]], min_kv: int) -> list[Item]:
    k_admit = pk.ctx.cfg.k_admit
    heap = [(-items[0].prio, items[0].order, i, 0) for i, items in enumerate(lists) if items]
    heapq.heapify(heap)
    deferred: list[Item] = []
    budget_pops = _POPS_PER_ADMIT * k_admit + _POPS_PER_LIST * len(lists)
    while heap and len(pk.result.admits) < k_admit and pk.free >= min_kv and budget_pops > 0:
        budget_pops -= 1
        neg, order, li, pos = heapq.heappop(heap)
        if pos >= 0 and pos + 1 < len(lists[li]):
            nxt = lists[li][pos + 1]
            heapq.heappush(heap, (-nxt.prio, nxt.order, li, pos + 1))
        it = lists[li][pos] if pos >= 0 else lists[li][-pos - 1]
        if not pk.fits(it):
            continue
        m = pk.marginal(it)
        if m <= _EPS:
            deferred.append(it)
            continue
        prio = priority(it.task.g, m, it.req.kv_tokens, pk.ctx.cfg.kv_exp)
        if prio < -neg * (1 - 1e-9) - _EPS:  # stale (a sibling was admitted): re-queue
            heapq.heappush(heap, (-prio, order, li, -it.order - 1))
            continue
        pk.admit(it, m)
    return deferred


def _zero_gain(pk: _Packer, deferred: list[Item], min_kv: int) -> None:
    k_admit = pk.ctx.cfg.k_admit
    pending = sorted(deferred, key=lambda it: (-it.task.g, it.order, it.req.rid))
    while pending and len(pk.result.admits) < k_admit and pk.free >= min_kv:
        # tasks already represented first (their other branches may be waiting on these)
        pick = next((it for it in pending if (it.task.running or it.task.task_id in pk.represented)
                     and pk.fits(it)), None)
        if pick is None:
            pick = next((it for it in pending if pk.fits(it)), None)
        if pick is None:
            return
        pending.remove(pick)
        pk.admit(pick, max(pk.marginal(pick), 0.0))
