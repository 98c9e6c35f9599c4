"""Decision -> SGLang actions on the scheduler's own data structures.

- admit: `run_restricted` runs SGLang's prefill step (`get_new_batch_prefill`) with
  `Scheduler.waiting_queue` restricted to the admitted requests in the decision's order, then
  restores the others. SGLang's `PrefillAdder` still enforces the real memory, token and
  batch-size limits, so it admits a head of that list (never anything else).
- order: `reorder` re-sorts a queue in place by the decision's rank (used AFTER
  `SchedulePolicy.calc_priority`, which may have re-sorted the restricted queue, e.g. LPM).
- preempt: `preempt` retracts the chosen running requests exactly as SGLang's own
  `PrefillAdder.preempt_to_schedule` does: `ScheduleBatch.release_req` (frees the KV, does
  not insert it into the tree, resets the request for recompute), `filter_batch`, then
  `Scheduler._add_request_to_queue(req, is_retracted=True)`.
- retraction order: `retraction_order` re-ranks SGLang's own decode-OOM retraction list.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")


def run_restricted(sched: Any, admitted: Sequence[Any], call: Callable[[], T]) -> tuple[T, list[Any]]:
    """Run `call()` while the scheduler's waiting queue holds only `admitted` (in order).

    Returns the call's result and the admitted requests that left the queue (SGLang ran
    them). Requests SGLang appended meanwhile (re-queued preemptions, grammar-ready ones)
    are kept; everything else returns in its original order.
    """
    full = sched.waiting_queue
    sched.waiting_queue = list(admitted)
    try:
        result = call()
    finally:
        after = sched.waiting_queue
        left, before = set(after), set(full)
        ran = [r for r in admitted if r not in left]
        gone = set(ran)
        sched.waiting_queue = [r for r in full if r not in gone] + [r for r in after if r not in before]
    return result, ran


def reorder(queue: list[Any], rank: Mapping[str, int]) -> None:
    """Stable in-place sort: ranked requests first by rank, the rest after in their order."""
    last = len(rank)
    queue.sort(key=lambda r: rank.get(r.rid, last))


def retraction_order(order: Sequence[int], reqs: Sequence[Any], rank: Mapping[str, int]) -> list[int]:
    """SGLang's keep-preference list (most preferred first, retracted from the end), re-ranked:
    requests admitted earlier by the policy are kept first; unranked ones (admitted outside
    the plugin) are retracted first, in SGLang's own order."""
    inf = float("inf")
    return sorted(order, key=lambda i: rank.get(reqs[i].rid, inf))


def preempt(sched: Any, running_batch: Any, rids: Iterable[str]) -> tuple[list[Any], list[str]]:
    """Retract the running requests named in `rids`; returns (retracted, skipped rids).

    Skipped: finished requests (KV already released, as preempt_to_schedule skips them), the
    in-flight chunked prefill, and ids not in the batch.
    """
    wanted = set(rids)
    chunked = getattr(sched, "chunked_req", None)
    reqs = list(running_batch.reqs)
    victims = [i for i, r in enumerate(reqs) if r.rid in wanted and not r.finished() and r is not chunked]
    if not victims:
        return [], sorted(wanted)
    drop = set(victims)
    retracted = []
    for n, i in enumerate(victims, 1):
        if not running_batch.release_req(i, len(reqs) - n):
            logger.warning("topas: KV backup failed while preempting %s", reqs[i].rid)
        retracted.append(reqs[i])
    running_batch.filter_batch(keep_indices=[i for i in range(len(reqs)) if i not in drop])
    running_batch.batch_is_full = False
    for req in retracted:
        sched._add_request_to_queue(req, is_retracted=True)
    return retracted, sorted(wanted - {r.rid for r in retracted})


# Why SGLang's prefill step left an admitted request waiting (logged per decision).
DEFER_REASONS = {
    "NO_TOKEN": "kv_full",  # PrefillAdder: not enough free + evictable KV for this request
    "OTHER": "prefill_budget",  # PrefillAdder: this pass's prefill-token / chunk / batch budget is spent
}


def deferred_reasons(admitted: Sequence[Any], ran: Sequence[Any], adds: Sequence[Any],
                     running_batch: Any) -> dict[str, str]:
    """rid -> reason for each admitted request SGLang's prefill step did not run.

    The first one left behind gets the reason the step stopped: the last non-CONTINUE
    `AddReqResult` of `PrefillAdder.add_one_req` (`adds`), else `batch_full` (the running
    batch is at its request limit) or `not_attempted` (the step returned before admission,
    e.g. while a chunked prefill is in flight). The rest queue behind it: `head_of_line`.
    """
    gone = {id(r) for r in ran}
    left = [r.rid for r in admitted if id(r) not in gone]
    if not left:
        return {}
    stops = [getattr(a, "name", str(a)) for a in adds if getattr(a, "name", "") != "CONTINUE"]
    if stops:
        first = DEFER_REASONS.get(stops[-1], stops[-1].lower())
    else:
        first = "batch_full" if getattr(running_batch, "batch_is_full", False) else "not_attempted"
    return {rid: first if i == 0 else "head_of_line" for i, rid in enumerate(left)}
