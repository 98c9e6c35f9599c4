"""N simulated engines (one per replica) behind a router, advanced in lockstep.

The driver is the simulator's (`sim.driver`): tasks release stages as predecessors finish
and rounds after tool waits; here every call is routed when it is released, to the replica
the router picks. One global clock: each turn advances every engine to the earliest next
event of any engine or of the driver, so a finish on one replica can release a call to
another at the same simulated instant. Stage and task completions are reported to every
replica that served the task (a policy only knows what its replica saw: the cost of
splitting a task is in the result).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..costmodel import Profile
from ..errors import TopasError
from ..percentile import percentile
from ..policies import Policy
from ..sim import SimEngine
from ..sim.driver import ready_successors, round_request
from ..sim.types import StallError
from ..workflow import TaskPlan, Workflow
from .routing import CallInfo, Pinned, Router


@dataclass(frozen=True, slots=True)
class ClusterRun:
    """One simulated cluster run (times in simulated seconds)."""

    policy: str
    router: str
    replicas: int
    mean_jct: float
    p99_jct: float
    throughput_rps: float  # tasks finished per second of makespan
    makespan_s: float
    split_tasks: int  # tasks whose calls ran on more than one replica
    calls_per_replica: tuple[int, ...]
    prefix_swaps: int
    preemptions: int

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__slots__}


class _Task:
    __slots__ = ("plan", "done", "finish_s", "replicas")

    def __init__(self, plan: TaskPlan) -> None:
        self.plan = plan
        self.done: set[str] = set()
        self.finish_s: float | None = None
        self.replicas: dict[str, set[int]] = {}  # stage -> replicas that served it


class _ClusterDriver:
    def __init__(self, engines: Sequence[SimEngine], router: Router, trace: Sequence[TaskPlan]) -> None:
        self.engines = list(engines)
        self.router = router
        self.tasks = [_Task(tp) for tp in trace]
        self.inflight: dict[str, tuple[_Task, str, int, int]] = {}
        self.outstanding = [0] * len(engines)
        self.calls = [0] * len(engines)
        self.completed = 0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        for i, e in enumerate(self.engines):
            e.on_finish = partial(self._on_finish, i)
        for t in self.tasks:
            self.at(t.plan.arrival_s, partial(self._arrive, t))

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), fn))

    def _arrive(self, t: _Task) -> None:
        for stage in t.plan.workflow.roots:
            self._submit(t, stage, 0)

    def _submit(self, t: _Task, stage: str, k: int) -> None:
        req = round_request(t.plan, stage, k)
        i = self.router.route(CallInfo(req.task_id, req.agent, req.prefix_tokens, req.input_tokens),
                              self.outstanding)
        self.inflight[req.rid] = (t, stage, k, i)
        self.outstanding[i] += 1
        self.calls[i] += 1
        t.replicas.setdefault(stage, set()).add(i)
        self.engines[i].submit(req)

    def _on_finish(self, replica: int, rid: str, now: float) -> None:
        self.outstanding[replica] -= 1
        self.at(now, partial(self._finished, rid, now))

    def _finished(self, rid: str, now: float) -> None:
        t, stage, k, _ = self.inflight.pop(rid)
        wf = t.plan.workflow
        if k + 1 < len(t.plan.rounds[stage]):
            self.at(now + wf.stage(stage).tool_wait_s, partial(self._submit, t, stage, k + 1))
            return
        for i in t.replicas[stage]:
            self.engines[i].stage_done(t.plan.task_id, stage)
        t.done.add(stage)
        for succ in ready_successors(wf, t.done, stage):
            self._submit(t, succ, 0)
        if len(t.done) == len(wf.stages):
            t.finish_s = now
            for i in set().union(*t.replicas.values()):
                self.engines[i].task_done(t.plan.task_id)
            if isinstance(self.router, Pinned):
                self.router.forget(t.plan.task_id)
            self.completed += 1

    def run(self) -> None:
        while True:
            times = [e.next_event_time() for e in self.engines]
            times.append(self._heap[0][0] if self._heap else None)
            now = min((x for x in times if x is not None), default=None)
            if now is None:
                return
            for e in self.engines:
                e.advance(now)
            while self._heap and self._heap[0][0] <= now:
                heapq.heappop(self._heap)[2]()


def simulate_cluster(trace: Sequence[TaskPlan], make_policy: Callable[[], Policy], replicas: int,
                     router: Router, profile: Profile, *, kv_budget: int | None = None,
                     host_tier: bool | None = None) -> ClusterRun:
    """Run `trace` to completion on `replicas` fresh engines, each with its own policy."""
    if replicas < 1:
        raise TopasError(f"replicas must be >= 1, got {replicas}")
    workflows: dict[str, Workflow] = {}
    for tp in trace:
        workflows.setdefault(tp.workflow.name, tp.workflow)
    policies = [make_policy() for _ in range(replicas)]
    engines = [SimEngine(profile, p, kv_budget=kv_budget, host_tier=host_tier, workflows=workflows)
               for p in policies]
    driver = _ClusterDriver(engines, router, trace)
    driver.run()
    if driver.completed < len(driver.tasks):
        raise StallError(f"cluster simulation stalled: {len(driver.tasks) - driver.completed} of "
                         f"{len(driver.tasks)} tasks unfinished")
    done = [t for t in driver.tasks if t.finish_s is not None]
    jct = np.array([t.finish_s - t.plan.arrival_s for t in done], dtype=float)
    start = min(t.plan.arrival_s for t in done) if done else 0.0
    makespan = max(t.finish_s for t in done) - start if done else 0.0
    stats = [e.stats() for e in engines]
    return ClusterRun(
        policy=getattr(policies[0], "name", type(policies[0]).__name__), router=router.name, replicas=replicas,
        mean_jct=float(jct.mean()) if len(jct) else math.nan,
        p99_jct=percentile(jct, 99),
        throughput_rps=len(done) / makespan if makespan > 0 else math.nan, makespan_s=makespan,
        split_tasks=sum(1 for t in done if len(set().union(*t.replicas.values())) > 1),
        calls_per_replica=tuple(driver.calls),
        prefix_swaps=sum(s.prefix_swaps_in + s.prefix_swaps_out for s in stats),
        preemptions=sum(s.preemptions for s in stats))
