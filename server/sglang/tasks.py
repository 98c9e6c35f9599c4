"""Scheduler process: per-request labels, service time and task/stage progress.

SGLang knows requests, not tasks. `RequestBook` keeps, per request id, the label-derived
facts a `RequestView` needs (task, stage, agent, round, arrival), the LLM service each
request attained (time spent in the running batch), and drives the core task tracker
(`topas_agents.task_tracker`, the embedded server's stage inference rules, docs/server.md)
to produce `TaskView`s and `StageDone` events. It never touches SGLang objects beyond
reading `Req` fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...labels import UNLABELLED_AGENT, UNLABELLED_STAGE, Label, unlabelled_task_id
from ...snapshot import StageDone, TaskView
from ...task_tracker import Action, StageDoneAction, TaskDoneAction, TaskTracker
from ...workflow import Workflow

ReqState = Literal["new", "waiting", "running"]


@dataclass(slots=True)
class ReqMeta:
    rid: str
    task_id: str
    workflow: str | None  # as labelled
    stage: str
    agent: str
    arrival_s: float
    task_arrival_s: float
    round: int
    labelled: bool
    state: ReqState = "new"
    service_s: float = 0.0  # attained before the current running interval
    run_since: float | None = None

    def service_at(self, now: float) -> float:
        return self.service_s + (now - self.run_since if self.run_since is not None else 0.0)


class RequestBook:
    def __init__(self, workflows: dict[str, Workflow], task_idle_s: float) -> None:
        self.workflows = workflows
        self.tracker = TaskTracker(task_idle_s, max_history=1000)
        self.meta: dict[str, ReqMeta] = {}
        # task -> stage -> service attained by finished running intervals / the stage's agent
        self._service: dict[str, dict[str, float]] = {}
        self._agent: dict[str, dict[str, str]] = {}
        self._events: list[StageDone] = []

    # ------------------------------------------------------------------ lifecycle

    def arrive(self, rid: str, label: Label | None, now: float) -> ReqMeta:
        if label is None:
            task_id, stage, agent, wf_name = unlabelled_task_id(rid), UNLABELLED_STAGE, UNLABELLED_AGENT, None
        else:
            task_id, stage, agent, wf_name = label.task_id, label.stage, label.agent, label.workflow
        wf = self.workflows.get(wf_name) if wf_name is not None else None
        if wf is not None and not wf.has_stage(stage):
            wf = None  # the HTTP side rejects this; a hand-made routing key is served workflow-less
        round_ = self.tracker.next_round(task_id, stage)
        actions = self.tracker.commit_call(task_id, stage, wf, wf_name, label is None, now, now)
        self._agent.setdefault(task_id, {})[stage] = agent
        task = self.tracker.active[task_id]
        meta = ReqMeta(rid, task_id, wf_name, stage, agent, now, task.arrival_s, round_, label is not None)
        self.meta[rid] = meta
        self._apply(actions, now)
        return meta

    def observe(self, waiting: set[str], running: set[str], now: float) -> list[str]:
        """Update request states from the scheduler's queues; returns the rids that ended.

        A request ends when it was seen queued or running and is now in neither (finished,
        aborted or dropped); requests never seen yet (e.g. in SGLang's grammar queue) wait.
        """
        ended = []
        for rid, m in self.meta.items():
            if rid in running:
                if m.state != "running":
                    m.state, m.run_since = "running", now
            elif rid in waiting:
                self._stop(m, now)
                m.state = "waiting"
            elif m.state != "new":
                ended.append(rid)
        return ended

    def mark(self, rid: str, state: ReqState, now: float) -> None:
        """Record a transition the adapter caused itself (admission, preemption) right away."""
        m = self.meta.get(rid)
        if m is None:
            return
        if state == "running" and m.state != "running":
            m.state, m.run_since = "running", now
        elif state == "waiting":
            self._stop(m, now)
            m.state = "waiting"

    def end(self, rid: str, ok: bool, now: float) -> None:
        m = self.meta.pop(rid, None)
        if m is None:
            return
        self._stop(m, now)
        self._apply(self.tracker.end_call(m.task_id, m.stage, ok, now, now), now)

    def expire(self, now: float) -> None:
        self._apply(self.tracker.expire_idle(now, now), now)

    def _stop(self, m: ReqMeta, now: float) -> None:
        if m.run_since is not None:
            service = now - m.run_since
            m.service_s += service
            m.run_since = None
            stages = self._service.setdefault(m.task_id, {})
            stages[m.stage] = stages.get(m.stage, 0.0) + service

    def _apply(self, actions: list[Action], now: float) -> None:
        for act in actions:
            if isinstance(act, StageDoneAction):
                tid, stage = act.task_id, act.stage
                task = self.tracker.active.get(tid) or self.tracker.finished.get(tid)
                rounds = task.stages[stage].calls if task is not None and stage in task.stages else 0
                self._events.append(StageDone(
                    tid, task.workflow_name if task is not None else None, stage,
                    self._agent.get(tid, {}).get(stage, ""), self._service.get(tid, {}).get(stage, 0.0),
                    rounds, now))
            elif isinstance(act, TaskDoneAction):
                self._service.pop(act.task_id, None)
                self._agent.pop(act.task_id, None)

    # ------------------------------------------------------------------ views

    @property
    def pending_events(self) -> bool:
        return bool(self._events)

    def events(self) -> tuple[StageDone, ...]:
        return tuple(self._events)

    def consume_events(self, n: int) -> None:
        del self._events[:n]

    def task_views(self, now: float) -> tuple[TaskView, ...]:
        running: dict[str, dict[str, float]] = {}
        for m in self.meta.values():
            if m.run_since is not None:
                stages = running.setdefault(m.task_id, {})
                stages[m.stage] = stages.get(m.stage, 0.0) + now - m.run_since
        views = []
        for task in self.tracker.active.values():
            tid = task.task_id
            done_s, run_s = self._service.get(tid, {}), running.get(tid, {})
            done = frozenset(s for s, st in task.stages.items() if st.done)
            active = tuple((s, done_s.get(s, 0.0) + run_s.get(s, 0.0))
                           for s, st in task.stages.items() if not st.done and st.in_flight > 0)
            attained = sum(done_s.values()) + sum(run_s.values())
            views.append(TaskView(tid, task.workflow_name, task.arrival_s, done, active, attained))
        return tuple(views)
