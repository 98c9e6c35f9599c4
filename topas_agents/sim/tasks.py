"""Tasks as the engine sees them: stages started and done, attained service, StageDone events.

`Tasks` also keeps each live task's frozen `TaskView`, rebuilt only when the task changed:
at once for a submit or stage end, lazily (at the next snapshot) for service accounting,
which happens for every request of every GPU run.
"""

from __future__ import annotations

from ..engine import EngineRequest
from ..snapshot import StageDone, TaskView
from .state import Req, Task


class Tasks:
    __slots__ = ("records", "views", "_dirty", "_events")

    def __init__(self) -> None:
        self.records: dict[str, Task] = {}
        self.views: dict[str, TaskView] = {}  # insertion order is the snapshot's task order
        self._dirty: dict[str, Task] = {}  # served since their view was built
        self._events: list[StageDone] = []  # since the last decision

    def open(self, spec: EngineRequest, now: float) -> Task:
        """A request of `spec`'s task and stage arrives: the task (created if new) notes it."""
        task = self.records.get(spec.task_id)
        if task is None:
            arrival = now if spec.task_arrival_s is None else spec.task_arrival_s
            task = self.records[spec.task_id] = Task(spec.task_id, spec.workflow, arrival)
        task.active.setdefault(spec.stage, 0.0)
        task.rounds[spec.stage] = task.rounds.get(spec.stage, 0) + 1
        task.agents[spec.stage] = spec.agent
        task.view = None
        self._view(task)
        return task

    def serve(self, r: Req, dur: float) -> None:
        """`r` took part in `dur` seconds of GPU work: its service and its task's."""
        r.service_s += dur
        task = r.task
        task.attained_s += dur
        stage = r.spec.stage
        if stage in task.active:
            task.active[stage] += dur
        task.view = None
        self._dirty[task.task_id] = task

    def stage_done(self, task_id: str, stage: str, now: float) -> bool:
        """Record a StageDone for the next decision; False if the task is unknown."""
        task = self.records.get(task_id)
        if task is None:
            return False
        service = task.active.pop(stage, 0.0)
        task.done.add(stage)
        task.view = None
        self._view(task)
        self._events.append(StageDone(task_id, task.workflow, stage, task.agents.get(stage, ""), service,
                                      task.rounds.get(stage, 0), now))
        return True

    def task_done(self, task_id: str) -> None:
        self.records.pop(task_id, None)
        self.views.pop(task_id, None)
        self._dirty.pop(task_id, None)

    def take_events(self) -> tuple[StageDone, ...]:
        """The StageDone events since the last call (consumed: delivered once)."""
        events, self._events = tuple(self._events), []
        return events

    def pending_events(self) -> tuple[StageDone, ...]:
        return tuple(self._events)

    def current_views(self) -> tuple[TaskView, ...]:
        """Every live task's view, stale ones rebuilt."""
        for t in self._dirty.values():
            if t.task_id in self.records:
                self._view(t)
        self._dirty.clear()
        return tuple(self.views.values())

    def _view(self, t: Task) -> TaskView:
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
            self.views[t.task_id] = v
        return v
