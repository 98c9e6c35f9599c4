"""Snapshot building, incremental: frozen views are cached per record and rebuilt only
when the record changed (waiting requests never change while they wait)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from ..costmodel import Profile
from ..snapshot import Decision, PrefixView, RequestView, Snapshot, StageDone
from ..workflow import Workflow
from .state import Prefix, Req

if TYPE_CHECKING:
    from .requests import RequestTable
    from .tasks import Tasks


def request_view(r: Req) -> RequestView:
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


def prefix_view(p: Prefix) -> PrefixView:
    v = p.view
    if v is None:
        v = p.view = PrefixView(p.agent, p.tokens, p.location, p.last_used_s, p.running)
    return v


class Views:
    """Builds the policy's `Snapshot` from the engine's records (read only)."""

    __slots__ = ("_profile", "_kv_budget", "_requests", "_prefixes", "_tasks")

    def __init__(self, profile: Profile, kv_budget: int, requests: RequestTable, prefixes: Mapping[str, Prefix],
                 tasks: Tasks) -> None:
        self._profile = profile
        self._kv_budget = kv_budget
        self._requests = requests
        self._prefixes = prefixes
        self._tasks = tasks

    def snapshot(self, now: float, events: tuple[StageDone, ...], workflows: Mapping[str, Workflow]) -> Snapshot:
        """`workflows` is passed each time: the server swaps in a live registry view."""
        tasks = self._tasks.current_views()
        return Snapshot(
            now=now,
            kv_budget=self._kv_budget,
            waiting=tuple(self._requests.waiting_views.values()),
            running=tuple([request_view(r) for r in self._requests.running.values()]),
            prefixes=tuple([prefix_view(p) for p in self._prefixes.values()]),
            tasks=tasks,
            profile=self._profile,
            workflows=workflows,
            events=events,
        )

    def for_check(self, snap: Snapshot, decision: Decision) -> Snapshot:
        """`snap` with `waiting` cut to the admitted requests: check_decision reads waiting
        only to look up admitted ids, so its verdict is the same, in O(|admit|) not O(W).
        Ids that are not waiting are left out and still rejected."""
        views = self._requests.waiting_views
        return replace(snap, waiting=tuple(views[rid] for rid in decision.admit if rid in views))
