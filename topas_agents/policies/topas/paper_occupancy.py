"""topas-paper's options `backfill` and `advance`: `topas`'s EASY head reservation (occupancy.py)
on the paper's valuation.

The oldest task's first waiting request (the head), once it has waited `backfill` x the mean
request service, gets a reservation: if it fits now (its prefix counted unless resident, idle
prefixes counted as free), every GreedyPack state admits it first; if not, the running
requests, ending in order of remaining service, and the prefixes they leave idle free its KV
in `start_s`, and an admission that would still run then may only use the KV left over after
the head (`extra`). With `advance`, a state that starts a waiting head now by preempting only
requests of younger tasks gains advance x g(head task) x `start_s` in the head's admission
credit (so J_revoke charges it back if a later decision preempts the head).

The paper has no remaining service of a request: here it is D_r (before option horizon's cap)
less the service the request has attained, at least 5% of D_r (the paper core's floor for an
exhausted residual).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...snapshot import RequestView
from .occupancy import Reservation, head_reservation

if TYPE_CHECKING:
    from .paper_pack import Index

_FLOOR = 0.05  # remaining service of a request past its mean: 5% of D_r (see the module docstring)


def remaining_s(ix: Index, r: RequestView) -> float:
    d = ix.uncapped.get(r.rid, ix.service[r.rid])
    return max(d - r.service_s, _FLOOR * d)


def reserve_head(ix: Index, mean_request_s: float) -> Reservation | None:
    """The reservation of the oldest task's first waiting request (None before it has waited
    `backfill` x `mean_request_s`, or when nothing waits)."""
    if ix.cfg.backfill <= 0.0:
        return None
    return head_reservation(ix.snap, ix.cfg.backfill * mean_request_s, ix.resident, ix.tokens, ix.running,
                            lambda r: remaining_s(ix, r), order=lambda r: (remaining_s(ix, r), r.rid))


def delays_head(ix: Index, r: RequestView, spare: int) -> bool:
    """Admitting `r` (not the head) would delay the head's start: it still runs then and needs
    more than the `spare` KV left after the head."""
    res = ix.reservation
    if res is None or r.rid == res.rid or r.kv_tokens <= spare:
        return False
    return remaining_s(ix, r) > res.start_s


def uses_spare(ix: Index, r: RequestView) -> bool:
    res = ix.reservation
    return res is not None and r.rid != res.rid and remaining_s(ix, r) > res.start_s


def head_advance(ix: Index, preempt: tuple[RequestView, ...]) -> float:
    """Option `advance`: the credit a state earns by admitting the waiting head now (0 when the
    head fits now, can never start, or an older task's request, or its own, would be preempted)."""
    res = ix.reservation
    if res is None or res.now or not math.isfinite(res.start_s) or ix.cfg.advance <= 0.0:
        return 0.0
    head = next(r for r in ix.waiting[res.agent] if r.rid == res.rid)
    age = (head.task_arrival_s, head.task_id)
    if any((p.task_arrival_s, p.task_id) <= age for p in preempt):
        return 0.0
    return ix.cfg.advance * ix.gain_weight[head.task_id] * res.start_s
