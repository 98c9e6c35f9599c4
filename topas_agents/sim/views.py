"""Snapshot building, incremental: frozen views are cached per record and rebuilt only
when the record changed (waiting requests never change while they wait)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..snapshot import PrefixView, RequestView, Snapshot, StageDone, TaskView
from .state import Prefix, Req, Task

if TYPE_CHECKING:
    from .engine import SimEngine


class ViewsMixin:
    def _request_view(self: SimEngine, r: Req) -> RequestView:
        v = r.view
        if v is None:
            s = r.spec
            v = r.view = RequestView(
                rid=r.rid,
                task_id=s.task_id,
                workflow=s.workflow,
                stage=s.stage,
                agent=s.agent,
                prefix_tokens=r.prefix.tokens,
                input_tokens=r.input_tokens,
                max_new_tokens=s.max_new_tokens,
                generated=r.generated,
                arrival_s=r.arrival_s,
                task_arrival_s=r.task.arrival_s,
                round=s.round,
                service_s=r.service_s,
                preemptions=r.preemptions,
            )
        return v

    @staticmethod
    def _prefix_view(p: Prefix) -> PrefixView:
        v = p.view
        if v is None:
            v = p.view = PrefixView(p.agent, p.tokens, p.location, p.last_used_s, p.running)
        return v

    def _task_view(self: SimEngine, t: Task) -> TaskView:
        v = t.view
        if v is None:
            v = t.view = TaskView(
                task_id=t.task_id,
                workflow=t.workflow,
                arrival_s=t.arrival_s,
                done_stages=frozenset(t.done),
                active_stages=tuple(t.active.items()),
                attained_s=t.attained_s,
            )
            self._task_views[t.task_id] = v
        return v

    def _build_snapshot(self: SimEngine, events: tuple[StageDone, ...]) -> Snapshot:
        for t in self._task_dirty.values():
            if t.task_id in self._tasks:
                self._task_view(t)
        self._task_dirty.clear()
        return Snapshot(
            now=self.now,
            kv_budget=self.kv_budget,
            waiting=tuple(self._waiting_views.values()),
            running=tuple([self._request_view(r) for r in self._running.values()]),
            prefixes=tuple([self._prefix_view(p) for p in self._prefixes.values()]),
            tasks=tuple(self._task_views.values()),
            profile=self.profile,
            workflows=self.workflows,
            events=events,
        )

    def snapshot(self: SimEngine) -> Snapshot:
        """The current view (pending StageDone events included, not consumed)."""
        return self._build_snapshot(tuple(self._events))
