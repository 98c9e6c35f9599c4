"""What a state's new admissions commit the KV to: J_block and the EASY head reservation.

Topas scores a state by one horizon of progress, but an admission holds its KV until it ends.
Two consequences the per-horizon score does not see, each measured on random-suite workflows
(docs/suite.md):

* **Stranded KV (J_block).** A long request that runs beside a small prefix can leave KV free
  that no waiting agent can use (its smallest request, plus its prefix unless resident, does
  not fit), for the whole decode; a resident agent counts too while any of its requests is
  left waiting. `stranded_cost` charges the shut-out tasks' weights x the longest new admission's
  service x the stranded fraction of the budget, once per state (every k >= 1).
* **Large requests passed over (EASY backfilling).** The oldest task's first waiting request
  (the head), once it has waited `backfill` x the mean request service, gets a reservation:
  if it fits now, every state admits it first; if not, the running requests (and the prefixes
  they leave idle) free its KV in `start_s`, and a request that would still be running then
  may only use the KV left over after the head (`extra`). HPC schedulers call this EASY
  backfilling: short work fills the gaps and never delays the head, so nothing starves.
* **A drain that runs near empty (the head's advance).** Waiting for `start_s` can idle most
  of the KV: a head that needs the whole budget waits for the longest running request while
  nothing else may start (60 s at batch 1-2 on a random-suite loop, where LPM runs a batch of
  3). Preempting the requests in the head's way starts it `start_s` sooner, which one horizon
  of progress does not see: `head_advance` credits a state that admits the head now with
  the head task's weight x `start_s` (task-seconds, like every term). Only requests of younger
  tasks may be preempted for it, and the advance joins the head's admission credit (so
  J_revoke charges it back): preemptions for heads always go from older to younger tasks, and
  a later decision preempts the head only if that is worth more than its advance (without the
  credit a generated fan-out workflow cycled for ever: tests/test_topas_progress.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ...snapshot import RequestView, Snapshot
from ..baselines import task_fcfs_key

if TYPE_CHECKING:
    from .context import Context
    from .pack import PackResult
    from .valuation import Item


class Reservation(NamedTuple):
    """The head request `rid` can start in `start_s` (0: now) with `extra` KV tokens to spare."""

    rid: str
    agent: str
    start_s: float
    extra: int

    @property
    def now(self) -> bool:
        return self.start_s <= 0.0


def reserve_head(ctx: Context) -> Reservation | None:
    """The reservation of the oldest task's first waiting request, once it has waited
    `backfill` x the mean request service (None before, or when nothing waits).

    Its KV need includes its prefix unless resident; prefixes of agents with running requests
    (and the head's own) stay, idle ones count as free (the head may evict them)."""
    mean_request_s = ctx.horizon_s / ctx.cfg.horizon
    return head_reservation(ctx.snap, ctx.cfg.backfill * mean_request_s, ctx.gpu, ctx.tokens,
                            ctx.running_reqs, ctx.remaining)


def head_reservation(snap: Snapshot, patience_s: float, resident: Collection[str], tokens: Mapping[str, int],
                     running: Mapping[str, Sequence[RequestView]], remaining: Callable[[RequestView], float],
                     order: Callable[[RequestView], Any] | None = None) -> Reservation | None:
    """The head's reservation once it has waited `patience_s` (shared by `topas` and the paper
    core's option `backfill`): `resident` prefixes, `tokens` l_a, `running` requests by agent,
    `remaining` service of a running request; they end in `order` (default: `remaining`)."""
    if not snap.waiting:
        return None
    head = min(snap.waiting, key=task_fcfs_key)
    if snap.now - head.arrival_s < patience_s:
        return None  # not starving yet: Topas's own order stands
    busy = set(running) | {head.agent}
    pinned = sum(tokens[a] for a in resident if a in busy and a in tokens)
    need = head.kv_tokens + (0 if head.agent in resident else tokens.get(head.agent, head.prefix_tokens))
    free = snap.kv_budget - pinned - sum(r.kv_tokens for r in snap.running)
    if need <= free:
        return Reservation(head.rid, head.agent, 0.0, free - need)
    # Running requests end in order of remaining service; when an agent's last one ends, its
    # prefix is idle and the head may evict it too (a prefix kept pinned here would make a
    # head that needs the whole budget wait forever: start_s = inf reserves nothing).
    left = {agent: len(reqs) for agent, reqs in running.items()}
    for req in sorted(snap.running, key=order or remaining):
        free += req.kv_tokens
        left[req.agent] -= 1
        if not left[req.agent] and req.agent != head.agent and req.agent in resident:
            free += tokens.get(req.agent, 0)
        if free >= need:
            return Reservation(head.rid, head.agent, remaining(req), free - need)
    return Reservation(head.rid, head.agent, float("inf"), 0)


def head_advance(ctx: Context, result: PackResult) -> tuple[int, float] | None:
    """(index of the head among `result`'s admissions, its advance in task-seconds) when the
    state starts the reserved head before `start_s` by preempting only younger tasks."""
    res = ctx.reservation
    if res is None or res.now or not math.isfinite(res.start_s) or ctx.cfg.advance <= 0.0:
        return None
    for i, it in enumerate(result.admits):
        if it.req.rid == res.rid:
            age = (it.req.task_arrival_s, it.req.task_id)
            if any((p.req.task_arrival_s, p.req.task_id) <= age for p in result.preempt):
                return None  # an older task (or the head's own) would give way: not for the head
            return i, ctx.cfg.advance * it.task.g * res.start_s
    return None


def delays_head(ctx: Context, item: Item, spare: int) -> bool:
    """Whether admitting `item` (not the head) would delay the head's reserved start: it would
    still run then and needs more than the `spare` KV left after the head."""
    res = ctx.reservation
    if res is None or item.req.rid == res.rid or item.req.kv_tokens <= spare:
        return False
    return ctx.remaining(item.req) > res.start_s


def uses_spare(ctx: Context, item: Item) -> bool:
    """Whether `item` still runs at the head's start (so it occupies part of the spare)."""
    res = ctx.reservation
    return res is not None and item.req.rid != res.rid and ctx.remaining(item.req) > res.start_s


def _shut_out_kv(ctx: Context, agent: str) -> int:
    """KV of `agent`'s smallest waiting request."""
    hit = ctx._shut_out_kv.get(agent)
    if hit is None:
        hit = ctx._shut_out_kv[agent] = min((r.kv_tokens for r in ctx.waiting.get(agent, ())), default=0)
    return hit


def _shut_out_weight(ctx: Context, agent: str) -> float:
    """The summed weights of `agent`'s waiting tasks (valued only for an agent shut out of
    some state: most agents fit, and their tasks need no valuation here)."""
    hit = ctx._shut_out_weight.get(agent)
    if hit is None:
        valued = ctx.tasks
        weights = {r.task_id: (valued.get(r.task_id) or ctx.task(r)).g for r in ctx.waiting.get(agent, ())}
        hit = ctx._shut_out_weight[agent] = sum(weights.values())
    return hit


def stranded_cost(ctx: Context, result: PackResult, free: int) -> float:
    """J_block of a packed state that admits something and leaves `free` KV unused."""
    if not result.admits or free <= 0:
        return 0.0
    weight = 0.0
    admitted: dict[str, int] = {}
    for it in result.admits:
        admitted[it.req.agent] = admitted.get(it.req.agent, 0) + 1
    for agent, reqs in ctx.waiting.items():
        need = _shut_out_kv(ctx, agent)
        resident = agent in result.agents
        if not resident:
            need += ctx.tokens[agent]  # it would also need its prefix
        if need <= free or (resident and admitted.get(agent, 0) == len(reqs)):
            continue  # it fits, or nothing of it is left waiting
        weight += _shut_out_weight(ctx, agent)
    if weight <= 0.0:
        return 0.0
    longest = max(ctx.remaining(it.req) for it in result.admits)
    return ctx.cfg.block * weight * longest * free / max(1, ctx.snap.kv_budget)
