"""What a decision values: a task (`TaskCtx`) and a request (`Item`), and the GreedyPack order.

`Context` (context.py) builds them; the packs (pack.py) and the search read them; the policy's
`DecisionCaches` (caches.py) carry them to the next decision while their inputs are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ...snapshot import RequestView, TaskView
from ...workflow import Workflow
from .longest_path import TaskPaths, WorkflowModel

_EMPTY: frozenset = frozenset()


@dataclass(slots=True)
class TaskCtx:
    task_id: str
    g: float  # the task's weight: aging x size weight (every term charged to it is scaled)
    paths: TaskPaths | None  # None: a one-stage task (unlabelled / unknown workflow)
    wf: Workflow | None
    done: frozenset[str]
    kappa: float = 0.0  # work floor of progress (config.work_floor)
    base: frozenset = _EMPTY  # (source, delta) of its running requests (served if retained)
    running: list = field(default_factory=list)  # its running Items
    _run_value: float | None = None
    # what it was valued under (Context.task carries it to the next decision while unchanged)
    horizon_s: float = 0.0
    running_key: tuple = ()  # (rid, delta, pinned) of its running requests, in snapshot order
    view: TaskView | None = None
    model: WorkflowModel | None = None

    @property
    def run_value(self) -> float:
        """Weighted progress of all its running requests over the horizon."""
        if self._run_value is None:
            self._run_value = self.served_value(self.running)
        return self._run_value

    def progress(self, reds: frozenset) -> float:
        """Expected reduction of L when each source j in `reds` receives delta_j, floored at
        kappa x the service delivered (a request off the critical path still does work the
        task needs)."""
        if not reds:
            return 0.0
        gain = self.paths.gain(reds)
        if self.kappa > 0.0:
            gain = max(gain, self.kappa * sum(d for _, d in reds))
        return gain

    def progress1(self, j: int, delta: float) -> float:
        """`progress` of a single reduction (the common case, memoised without a set)."""
        gain = self.paths.gain1(j, delta)
        return max(gain, self.kappa * delta) if self.kappa > 0.0 else gain

    def served_value(self, items) -> float:
        """Weighted progress of serving `items` (a subset of its requests) over the horizon."""
        reds = frozenset(it.red for it in items if it.col >= 0)
        alone = sum(it.delta for it in items if it.col < 0)
        return self.g * (self.progress(reds) + alone)


def priority(weight: float, gain: float, kv_tokens: int, kv_exp: float) -> float:
    """The GreedyPack order: weight x gain / kv_tokens**kv_exp. At kv_exp 0 (the default) the
    power is skipped: dividing by 1.0 changes nothing, and this runs per candidate."""
    return weight * gain / max(1, kv_tokens) ** kv_exp if kv_exp else weight * gain


class TaskState(NamedTuple):
    """What a task is valued from in one decision (`Context._task_state`)."""

    view: TaskView | None
    wf: Workflow | None
    model: WorkflowModel | None
    paths: TaskPaths | None  # None: a one-stage task (unlabelled / unknown workflow)
    done: frozenset[str]
    g: float  # aging x size weight
    cached: TaskCtx | None  # the previous valuation, if any (DecisionCaches.tasks)


@dataclass(slots=True)
class Item:
    """A waiting candidate or a running request, with its progress over the horizon."""

    req: RequestView
    task: TaskCtx
    col: int  # source index in task.paths; -1 when valued alone
    delta: float  # service received in the next interval: min(remaining, horizon)
    gain: float = 0.0  # expected L reduction (given the task's running requests)
    prio: float = 0.0  # task weight x gain / kv_tokens**kv_exp (the GreedyPack order)
    order: int = 0  # deterministic tie-breaker
    reuse: tuple[tuple[str, float], ...] | None = None  # (child agent, value) lazily
    pinned: bool = False  # running and about to finish: never preempted

    @property
    def red(self) -> tuple[int, float]:
        return (self.col, self.delta)
