"""What the Topas policy carries from one decision to the next (one owner, one prune rule).

Every entry is validated on use by object identity: engines hand the same view object for an
unchanged request or task, so an entry built for that object is still exact. Decisions with
these caches equal decisions without them (tests/test_topas_caches.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from ...snapshot import RequestView, Snapshot, TaskView
from .longest_path import TaskPaths, WorkflowModel

if TYPE_CHECKING:
    from .valuation import Item, TaskCtx


class Remaining(NamedTuple):
    """A cached remaining-service estimate, valid while the engine hands the same view."""

    view: RequestView
    seconds: float


class TaskMemo(NamedTuple):
    """A task's path matrix and the state it was built for (see `Context._paths`)."""

    view: TaskView | None
    model: WorkflowModel
    done: frozenset[str]
    active: tuple[tuple[str, float], ...]  # attained service on the grid
    paths: TaskPaths
    quantum_s: float


@dataclass(slots=True)
class DecisionCaches:
    """The policy's cross-decision caches, each validated on use by object identity (engines
    hand the same view object for an unchanged request or task), pruned by one rule."""

    remaining: dict[str, Remaining] = field(default_factory=dict)  # rid -> estimate
    task_memo: dict[str, TaskMemo] = field(default_factory=dict)  # task_id -> path matrix
    tasks: dict[str, TaskCtx] = field(default_factory=dict)  # task_id -> last valuation
    items: dict[str, Item] = field(default_factory=dict)  # rid -> last waiting valuation

    def prune(self, snap: Snapshot) -> None:
        """Drop dead entries once a cache outgrows _CACHE_GROWTH x (live + _CACHE_SLACK):
        amortised O(1) per decision."""
        live_reqs = len(snap.waiting) + len(snap.running) + _CACHE_SLACK
        live_tasks = len(snap.tasks) + _CACHE_SLACK
        if len(self.remaining) > _CACHE_GROWTH * live_reqs or len(self.items) > _CACHE_GROWTH * live_reqs:
            rids = {r.rid for r in snap.waiting} | {r.rid for r in snap.running}
            self.remaining = {k: v for k, v in self.remaining.items() if k in rids}
            self.items = {k: v for k, v in self.items.items() if k in rids}
        if len(self.task_memo) > _CACHE_GROWTH * live_tasks or len(self.tasks) > _CACHE_GROWTH * live_tasks:
            ids = {t.task_id for t in snap.tasks}
            self.task_memo = {k: v for k, v in self.task_memo.items() if k in ids}
            self.tasks = {k: v for k, v in self.tasks.items() if k in ids}


# DecisionCaches.prune: a cache is pruned to live entries past this factor x (live + slack).
_CACHE_GROWTH = 2
_CACHE_SLACK = 64
# The horizon is snapped to a geometric grid of this many steps per doubling (~9%): the
# observed mean it derives from moves with every completion, and an exact float would change
# the attained-service grid and every delta each decision, defeating the cross-decision
# caches of path matrices and gains. Within 9% the horizon is the same scale.
_HORIZON_STEPS_PER_DOUBLING = 8


def snap_to_grid(seconds: float) -> float:
    """`seconds` rounded to the nearest 2**(i / _HORIZON_STEPS_PER_DOUBLING)."""
    if seconds <= 0.0 or not math.isfinite(seconds):
        return seconds
    steps = round(math.log2(seconds) * _HORIZON_STEPS_PER_DOUBLING)
    return 2.0 ** (steps / _HORIZON_STEPS_PER_DOUBLING)
