"""Baseline policies: order the waiting queue by a key, admit greedily, evict prefixes LRU.

None of them preempts or loads prefixes proactively; residency is whatever LRU eviction
leaves, as in a stock engine. Every key ends with the request id, so orders are total and
runs deterministic.

| name   | order (smallest key first)                                                    |
|--------|-------------------------------------------------------------------------------|
| fcfs   | request arrival                                                               |
| lpm    | most prefix tokens already on GPU (or loading) first, then arrival; never     |
|        | falls back to FCFS (SGLang silently does above 128 waiting requests)          |
| parrot | task arrival, then request arrival (Parrot's application-level FCFS)          |
| las    | least attained task service (Autellix), then arrival                          |
| spf    | deepest workflow stage first (unlabelled = depth 0), then arrival             |

The order is kept incrementally in a `SortedWaiting` (see greedy.py), so a decision costs
O(changes), not O(W log W): the same order as `sorted(snap.waiting, key=policy.sort_key(snap))`,
which the tests check.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from operator import attrgetter
from typing import Any

from ..snapshot import NOOP, Decision, RequestView, Snapshot
from .greedy import SortedWaiting, greedy_admit

_TASK_ID = attrgetter("task_id")
_ATTAINED = attrgetter("attained_s")


def _by_arrival(r: RequestView) -> tuple:
    return (r.arrival_s, r.rid)


class OrderedGreedy:
    """Greedy head-of-line admission in a key order; subclasses define the key."""

    name = "ordered"

    def __init__(self) -> None:
        self._queue = SortedWaiting(self.static_key, self.group_of())

    # --- the order: (group value, *static key); override these
    def static_key(self, r: RequestView) -> tuple:
        return _by_arrival(r)

    def group_of(self) -> Callable[[RequestView], Hashable] | None:
        return None

    default = 0  # group value of a group missing from group_values()

    def group_values(self, snap: Snapshot) -> Mapping[Hashable, Any] | None:
        return None

    def sort_key(self, snap: Snapshot) -> Callable[[RequestView], tuple]:
        """The full order as a plain sort key (reference for tests and other engines)."""
        group_of, values = self.group_of(), self.group_values(snap) or {}
        if group_of is None:
            return lambda r: (self.default, *self.static_key(r))
        return lambda r: (values.get(group_of(r), self.default), *self.static_key(r))

    def decide(self, snap: Snapshot) -> Decision:
        self._queue.sync(snap.waiting, self.group_values(snap), self.default)
        if not snap.waiting:
            return NOOP
        decision = greedy_admit(snap, iter(self._queue))
        self._queue.note_admitted(decision.admit)
        return decision

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FCFS(OrderedGreedy):
    name = "fcfs"


class LPM(OrderedGreedy):
    """Longest prefix match: requests whose agent prefix is on GPU (or loading) first."""

    name = "lpm"

    def group_of(self) -> Callable[[RequestView], Hashable] | None:
        return _agent

    def group_values(self, snap: Snapshot) -> Mapping[Hashable, Any] | None:
        return {p.agent: -p.tokens for p in snap.prefixes if p.on_gpu}


class ParrotFCFS(OrderedGreedy):
    name = "parrot"

    def static_key(self, r: RequestView) -> tuple:
        return (r.task_arrival_s, r.arrival_s, r.rid)


class AutellixLAS(OrderedGreedy):
    """Least attained service of the request's task first (Autellix's PLAS)."""

    name = "las"

    def group_of(self) -> Callable[[RequestView], Hashable] | None:
        return _task

    default = 0.0

    def group_values(self, snap: Snapshot) -> Mapping[Hashable, Any] | None:
        tasks = snap.tasks
        return dict(zip(map(_TASK_ID, tasks), map(_ATTAINED, tasks), strict=True))


class SPF(OrderedGreedy):
    """Stage-position first: deeper stages (closer to finishing their task) first."""

    name = "spf"

    def __init__(self) -> None:
        self._depth: dict[tuple[str | None, str], int] = {}
        self._workflows: Any = {}
        super().__init__()

    def decide(self, snap: Snapshot) -> Decision:
        self._workflows = snap.workflows
        return super().decide(snap)

    def static_key(self, r: RequestView) -> tuple:
        return (-self._stage_depth(r), r.arrival_s, r.rid)

    def _stage_depth(self, r: RequestView) -> int:
        k = (r.workflow, r.stage)
        d = self._depth.get(k)
        if d is None:
            wf = self._workflows.get(r.workflow) if r.workflow is not None else None
            if wf is None:
                return 0  # unlabelled or unknown workflow (not cached: it may be registered later)
            d = self._depth[k] = wf.depth.get(r.stage, 0)
        return d


def _agent(r: RequestView) -> Hashable:
    return r.agent


def _task(r: RequestView) -> Hashable:
    return r.task_id
