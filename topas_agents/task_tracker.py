"""Task and stage bookkeeping: which stages are done, when a task is done (pure logic).

Rules (docs/server.md "Stage inference"):
- With a registered workflow, a call for stage S implies every ancestor of S is done.
- A workflow stage with a fixed request count `requests: k` (or a range's upper bound) is done
  once that many of its calls have finished.
- A stage marked done while it still has calls in flight is closed when the last one ends.
- A task is done when: the client says so (`POST .../done`; closed once nothing is in
  flight); or its workflow's stages are all done with nothing in flight; or it is an
  unlabelled single call that ended; or it saw no call for `idle_timeout_s` wall seconds.
- Without a workflow nothing is inferred: stages finish explicitly or with their task.

The tracker never touches the engine: mutating methods return the engine actions to apply.
One thread calls it (the embedded server's engine-loop task; the SGLang scheduler process).
It raises `TaskError` subclasses (topas_agents.errors); servers map them to their own
statuses (the embedded server: server/api_errors.py `from_task_error`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from .errors import TaskClosedError, TaskWorkflowMismatchError, UnknownStageError, UnknownTaskError
from .workflow import Workflow

# "abandoned": it ended without one call that finished (every call cancelled or failed: a
# client that gave up). Its span is no JCT: counting it made timeouts under overload read as
# short tasks. "failed": the client's done call said the task failed (`?outcome=failed`: a
# MetaGPT run that raised, a `task()` scope left by an exception). No JCT either: a failed
# or interrupted run was counted as a finished, short task.
DoneReason = Literal["explicit", "workflow", "single", "idle", "abandoned", "failed"]
NO_JCT: frozenset[DoneReason] = frozenset({"abandoned", "failed"})


@dataclass(frozen=True, slots=True)
class StageDoneAction:
    task_id: str
    stage: str


@dataclass(frozen=True, slots=True)
class TaskDoneAction:
    task_id: str


Action = StageDoneAction | TaskDoneAction


class ConcludedJct(NamedTuple):
    """One concluded task's JCT in the recent history (stats' percentiles)."""

    task_id: str
    jct_s: float


@dataclass(slots=True)
class StageState:
    calls: int = 0
    finished: int = 0
    in_flight: int = 0
    done: bool = False
    closing: bool = False  # marked done while calls were in flight


@dataclass(slots=True)
class TaskState:
    task_id: str
    workflow: Workflow | None
    workflow_name: str | None  # as labelled, registered or not
    arrival_s: float
    unlabelled: bool
    last_activity_wall: float
    stages: dict[str, StageState] = field(default_factory=dict)
    in_flight: int = 0
    last_finish_s: float | None = None
    closing: bool = False  # explicit task done, waiting for in-flight calls
    failed: bool = False  # the done call said the task failed
    closed_by_client: bool = False  # a done call came: later calls are refused (409)
    done_reason: DoneReason | None = None
    finish_s: float | None = None
    reopened: int = 0

    @property
    def jct_s(self) -> float | None:
        """None until it concludes, and for a task that ended without a JCT (NO_JCT)."""
        if self.finish_s is None or self.done_reason in NO_JCT:
            return None
        return self.finish_s - self.arrival_s

    def stage(self, name: str) -> StageState:
        if name not in self.stages:
            self.stages[name] = StageState()
        return self.stages[name]


def ancestors(wf: Workflow, stage: str) -> tuple[str, ...]:
    """All transitive predecessors of `stage`, in topological order."""
    seen: set[str] = set()
    todo = list(wf.stage(stage).after)
    while todo:
        s = todo.pop()
        if s not in seen:
            seen.add(s)
            todo.extend(wf.stage(s).after)
    return tuple(s for s in wf.topo_order if s in seen)


class StageKey(NamedTuple):
    """What the per-stage call and task counts are kept by."""

    owner: str | None
    workflow: str | None  # as labelled (None: labelled without one, or unlabelled)
    stage: str


class TaskTracker:
    def __init__(self, idle_timeout_s: float, max_history: int) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.active: dict[str, TaskState] = {}
        self.finished: collections.OrderedDict[str, TaskState] = collections.OrderedDict()
        self._max_history = max_history
        self.stage_calls: collections.Counter[StageKey] = collections.Counter()
        self.stage_tasks: collections.Counter[StageKey] = collections.Counter()
        self.jcts: collections.deque[ConcludedJct] = collections.deque(maxlen=max_history)
        self.jct_count = 0
        self.jct_sum = 0.0
        # For /metrics, which must never go down: every conclusion is reported to
        # `on_conclude` (a reopened task that ends again is reported again) and reopens are
        # counted, so conclusions - reopens_total == jct_count at any time.
        self.on_conclude: Callable[[TaskState], None] | None = None
        self.reopens_total = 0
        self.abandoned = 0  # tasks that ended "abandoned" since the start (no JCT), less reopened ones
        self.failed = 0  # tasks whose done call said they failed (no JCT)

    # ------------------------------------------------------------------ calls

    def check_call(self, task_id: str, workflow_name: str | None) -> tuple[float | None, TaskState | None]:
        """Validate a new call (no mutation): (the task's arrival if known, its state)."""
        task = self.active.get(task_id) or self.finished.get(task_id)
        if task is None:
            return None, None
        if task.closing or task.closed_by_client:  # the client said it is over
            raise TaskClosedError(f"task '{task_id}' was marked done; use a new task_id")
        if task.workflow_name != workflow_name:
            raise TaskWorkflowMismatchError(
                f"task '{task_id}' uses workflow {task.workflow_name!r}, got {workflow_name!r}")
        return task.arrival_s, task

    def served_without_dag(self, task_id: str) -> bool:
        """The task is known and labelled with a workflow it is served without (one that was
        not registered at its first call)."""
        task = self.active.get(task_id) or self.finished.get(task_id)
        return task is not None and task.workflow is None and task.workflow_name is not None

    def next_round(self, task_id: str, stage: str) -> int:
        task = self.active.get(task_id) or self.finished.get(task_id)
        if task is None or stage not in task.stages:
            return 0
        return task.stages[stage].calls

    def commit_call(self, task_id: str, stage: str, workflow: Workflow | None, workflow_name: str | None,
                    unlabelled: bool, now_s: float, now_wall: float, owner: str | None = None) -> list[Action]:
        """Record a submitted call; returns the stage completions it implies. `owner`: whose
        call it is where several clients share the tracker (the server's API keys), so the
        per-stage counts of a workflow they share stay each one's own."""
        task = self.active.get(task_id)
        if task is None:
            task = self.finished.pop(task_id, None)
            if task is not None and task.done_reason in NO_JCT:  # never counted as a JCT
                self._uncount(task.done_reason)
            elif task is not None:  # concluded by inference or idleness, but not done after all
                self._take_back_jct(task)
            if task is not None:
                task.done_reason, task.finish_s, task.reopened = None, None, task.reopened + 1
                task.failed = False
            else:
                task = TaskState(task_id, workflow, workflow_name, now_s, unlabelled, now_wall)
            self.active[task_id] = task
        actions: list[Action] = []
        if workflow is not None:
            for anc in ancestors(workflow, stage):
                actions += self._close_stage(task, anc)
        st = task.stage(stage)
        key = StageKey(owner, workflow_name, stage)
        if st.calls == 0:
            self.stage_tasks[key] += 1
        self.stage_calls[key] += 1
        st.calls += 1
        st.in_flight += 1
        task.in_flight += 1
        task.last_activity_wall = now_wall
        return actions

    def _uncount(self, reason: DoneReason) -> None:
        if reason == "abandoned":
            self.abandoned -= 1
        elif reason == "failed":
            self.failed -= 1

    def _take_back_jct(self, task: TaskState) -> None:
        """A concluded task's JCT out of the count, sum and recent ones: it was reopened, or
        the client said it failed. Counted with the reopened ones: the JCT histogram
        (`on_conclude`) observed it and never goes down, so count - reopens_total stays the
        number of tasks with a JCT. Call it before the task's done_reason changes (`jct_s`
        reads it)."""
        self.jct_count -= 1
        self.jct_sum -= task.jct_s or 0.0
        self._forget_jct(task.task_id)
        self.reopens_total += 1

    def _forget_jct(self, task_id: str) -> None:
        """Take a reopened task's JCT out of the recent ones (the percentiles), as out of the
        count and sum; its latest entry, if the bounded history still holds it."""
        for i in range(len(self.jcts) - 1, -1, -1):
            if self.jcts[i].task_id == task_id:
                del self.jcts[i]
                return

    def end_call(self, task_id: str, stage: str, ok: bool, now_s: float, now_wall: float) -> list[Action]:
        task = self.active.get(task_id)
        if task is None:
            return []
        st = task.stage(stage)
        st.in_flight -= 1
        task.in_flight -= 1
        st.finished += ok
        task.last_finish_s = now_s
        task.last_activity_wall = now_wall
        actions: list[Action] = []
        if st.closing and st.in_flight == 0:
            actions += self._close_stage(task, stage)
        wf = task.workflow
        if wf is not None and wf.has_stage(stage) and st.finished >= wf.stage(stage).requests.hi:
            actions += self._close_stage(task, stage)
        if task.unlabelled and task.in_flight == 0:
            task.closing = True
            return actions + self._conclude(task, "single", now_s)
        return actions + self._maybe_finish(task, now_s)

    # ------------------------------------------------------------------ explicit

    def _known(self, task_id: str) -> TaskState:
        task = self.active.get(task_id) or self.finished.get(task_id)
        if task is None:
            raise UnknownTaskError(f"unknown task '{task_id[:80]}'")  # ids in URLs are unbounded: quoted briefly, as all user input
        return task

    def stage_done(self, task_id: str, stage: str, now_s: float, now_wall: float) -> list[Action]:
        task = self._known(task_id)
        wf = task.workflow
        if wf is not None and not wf.has_stage(stage):
            raise UnknownStageError(f"workflow '{wf.name}' has no stage '{stage[:80]}'")
        if task.task_id not in self.active:
            return []  # already concluded: every stage is done
        task.last_activity_wall = now_wall
        actions: list[Action] = []
        if wf is not None:
            for anc in ancestors(wf, stage):
                actions += self._close_stage(task, anc)
        actions += self._close_stage(task, stage)
        return actions + self._maybe_finish(task, now_s)

    def task_done(self, task_id: str, now_s: float, now_wall: float, failed: bool = False) -> list[Action]:
        """The client says the task is over; `failed`: it failed (no JCT, counted in `failed`)."""
        task = self._known(task_id)
        closed_before = task.closed_by_client
        task.closed_by_client = True  # whatever it ended as: an abandoned task stayed open to reuse
        if task.task_id not in self.active:
            if closed_before or task.done_reason in NO_JCT:
                # the client's first word on an ended task stands: a later failed done call (a
                # reused task id's run, refused with 409, closing its block) took the JCT of
                # the run that had finished under that id
                return []
            if failed:  # concluded by inference, then failed in the client: no JCT after all
                self._take_back_jct(task)
                task.done_reason, task.failed = "failed", True
                self.failed += 1
                return []
            task.done_reason = "explicit"  # no reopening after the client said done
            return []
        task.closing = True
        task.failed = task.failed or failed
        task.last_activity_wall = now_wall
        return self._maybe_finish(task, now_s)

    def expire_idle(self, now_s: float, now_wall: float) -> list[Action]:
        if self.idle_timeout_s <= 0:
            return []
        actions: list[Action] = []
        for task in list(self.active.values()):
            if task.in_flight == 0 and now_wall - task.last_activity_wall >= self.idle_timeout_s:
                finish = task.last_finish_s if task.last_finish_s is not None else task.arrival_s
                actions += self._conclude(task, "idle", finish)
        return actions

    # ------------------------------------------------------------------ internals

    def _close_stage(self, task: TaskState, stage: str) -> list[Action]:
        st = task.stage(stage)
        if st.done:
            return []
        if st.in_flight > 0:
            st.closing = True
            return []
        st.done, st.closing = True, False
        return [StageDoneAction(task.task_id, stage)]

    def _maybe_finish(self, task: TaskState, now_s: float) -> list[Action]:
        if task.in_flight > 0:
            return []
        if task.closing:
            return self._conclude(task, "failed" if task.failed else "explicit", now_s)
        wf = task.workflow
        if wf is not None and all(task.stage(s.name).done for s in wf.stages):
            return self._conclude(task, "workflow", now_s)
        return []

    def _conclude(self, task: TaskState, reason: DoneReason, finish_s: float) -> list[Action]:
        order = task.workflow.topo_order if task.workflow is not None else ()
        names = [s for s in order if s in task.stages] + [s for s in task.stages if s not in order]
        actions: list[Action] = []
        for name in names:
            st = task.stages[name]
            if not st.done and st.calls > 0:
                actions.append(StageDoneAction(task.task_id, name))
            st.done, st.closing = True, False
        if reason != "failed" and not any(st.finished for st in task.stages.values()):
            reason = "abandoned"
        task.done_reason, task.finish_s, task.closing = reason, finish_s, False
        del self.active[task.task_id]
        self.finished[task.task_id] = task
        while len(self.finished) > self._max_history:
            self.finished.popitem(last=False)
        if reason in NO_JCT:
            if reason == "abandoned":
                self.abandoned += 1
            else:
                self.failed += 1
            return actions + [TaskDoneAction(task.task_id)]
        self.jcts.append(ConcludedJct(task.task_id, finish_s - task.arrival_s))
        self.jct_count += 1
        self.jct_sum += finish_s - task.arrival_s
        if self.on_conclude is not None:
            self.on_conclude(task)
        return actions + [TaskDoneAction(task.task_id)]
