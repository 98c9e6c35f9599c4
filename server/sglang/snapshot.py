"""SGLang scheduler state -> the frozen `Snapshot` the policies read.

| Snapshot field | from SGLang                                                                 |
|----------------|-----------------------------------------------------------------------------|
| waiting        | `Scheduler.waiting_queue` (unfinished `Req`s)                               |
| running        | the running `ScheduleBatch.reqs` (unfinished) + `Scheduler.chunked_req`     |
| kv_budget      | `Scheduler.max_total_num_tokens` (KV pool size), or the configured budget  |
| prefixes       | agent prefixes (residency.py): pinned = "gpu", admitted-but-not-in-tree =   |
|                | "loading", host copy = "cpu", else "none"                                   |
| tasks / events | `RequestBook` (label-driven task and stage progress)                        |

A request's `prefix_tokens` is its agent's learned prefix, `input_tokens` the rest of its
prompt, `generated` = len(output_ids), `preemptions` = SGLang's `retraction_count`, and
`max_new_tokens` is clipped like SGLang's own admission estimate
(SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION, default 4096) so a request without a limit does not
reserve the whole context in the model. Views of unchanged requests are reused (policies
key caches on view identity).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...costmodel import Profile
from ...snapshot import PrefixView, RequestView, Snapshot, StageDone
from ...workflow import Workflow
from .residency import PrefixResidency
from .tasks import ReqMeta, RequestBook


class ViewCache:
    def __init__(self, clip_max_new_tokens: int = 4096) -> None:
        self.clip = clip_max_new_tokens
        self._views: dict[str, tuple[tuple, RequestView]] = {}

    def view(self, meta: ReqMeta, req: Any, prefix_tokens: int, now: float) -> RequestView:
        generated = len(req.output_ids)
        max_new = req.sampling_params.max_new_tokens
        max_new = self.clip if max_new is None else min(int(max_new), max(self.clip, generated))
        service = meta.service_at(now)
        key = (prefix_tokens, generated, req.retraction_count, service, max_new)
        hit = self._views.get(meta.rid)
        if hit is not None and hit[0] == key:
            return hit[1]
        v = RequestView(
            rid=meta.rid, task_id=meta.task_id, workflow=meta.workflow, stage=meta.stage,
            agent=meta.agent, prefix_tokens=prefix_tokens,
            input_tokens=max(0, len(req.origin_input_ids) - prefix_tokens),
            max_new_tokens=max_new, generated=min(generated, max_new), arrival_s=meta.arrival_s,
            task_arrival_s=meta.task_arrival_s, round=meta.round, service_s=service,
            preemptions=req.retraction_count,
        )
        self._views[meta.rid] = (key, v)
        return v

    def forget(self, rid: str) -> None:
        self._views.pop(rid, None)


def build_snapshot(*, now: float, kv_budget: int, waiting: Sequence[Any], running: Sequence[Any],
                   book: RequestBook, residency: PrefixResidency, views: ViewCache, profile: Profile,
                   workflows: Mapping[str, Workflow], events: tuple[StageDone, ...]) -> Snapshot:
    """The policy's view of the scheduler now (requests unknown to the book are skipped)."""
    def views_of(reqs: Sequence[Any]) -> tuple[RequestView, ...]:
        out = []
        for req in reqs:
            meta = book.meta.get(req.rid)
            if meta is not None:
                out.append(views.view(meta, req, residency.tokens(meta.agent), now))
        return tuple(out)

    waiting_views = tuple(sorted(views_of(waiting), key=lambda v: (v.arrival_s, v.rid)))
    running_views = views_of(running)
    in_use: dict[str, int] = {}
    for v in running_views:
        in_use[v.agent] = in_use.get(v.agent, 0) + 1
    prefixes = tuple(
        PrefixView(p.agent, p.tokens, residency.location(p.agent), p.last_used_s, in_use.get(p.agent, 0))
        for p in residency.agents.values())
    return Snapshot(now=now, kv_budget=kv_budget, waiting=waiting_views, running=running_views,
                    prefixes=prefixes, tasks=book.task_views(now), profile=profile,
                    workflows=workflows, events=events)
