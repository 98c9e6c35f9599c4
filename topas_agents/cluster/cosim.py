"""N simulated engines (one per replica) behind a router, advanced in lockstep.

The driver plays the client as `sim.driver` does: tasks release stages as predecessors
finish and rounds after tool waits; here every call is routed when it is released, to the
replica the router picks. Stage and task completions are reported to every replica that
served the task (a policy only knows what its replica saw: the cost of splitting a task is in
the result).

One global clock. Each turn, every engine takes one step to the earliest next event of any
engine or of the client (`SimEngine.step`: decide at the boundary, start GPU work, process
the events at that time), then the client's own events at that time run. A finish is handled
when the engine reports it, as `sim.driver` does: a successor released to the same replica
reaches it before that replica decides, and one released to another replica reaches it at the
same instant (directly if its clock is there, else as an event at that time on its heap, so
it never arrives in that replica's past). So a 1-replica cluster is the single engine, event
for event (tests/test_cluster_sim_equivalence.py).

Each replica is its own server, so each has its own front end (`sim.driver.FrontEnd`: HTTP,
tokenizer, detokenizer; FIFO, `call_overhead_s` a call): a call is routed when the client
issues it and queues at the front end of the replica it was routed to.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import numpy as np

from ..costmodel import Profile
from ..engine import EngineRequest
from ..errors import TopasError
from ..percentile import percentile
from ..policies import Policy
from ..sim import SimEngine
from ..sim.driver import FrontEnd, ready_successors, round_request
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
    # each task's JCT, in trace order (the bench's JSON leaves them out: a number per task
    # per pair per load)
    task_jcts: tuple[float, ...] = field(default=(), repr=False)

    def as_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__slots__ if k != "task_jcts"}


class _Task:
    __slots__ = ("plan", "done", "finish_s", "replicas")

    def __init__(self, plan: TaskPlan) -> None:
        self.plan = plan
        self.done: set[str] = set()
        self.finish_s: float | None = None
        self.replicas: dict[str, set[int]] = {}  # stage -> replicas that served it


class _Call(NamedTuple):
    """A call in flight: its task, stage, round and the replica it was routed to."""

    task: _Task
    stage: str
    round: int
    replica: int


class _ClusterDriver:
    def __init__(self, engines: Sequence[SimEngine], router: Router, trace: Sequence[TaskPlan]) -> None:
        self.engines = list(engines)
        self.router = router
        self.fronts = [FrontEnd(e.profile.call_overhead_s) for e in self.engines]
        self.tasks = [_Task(tp) for tp in trace]
        self.inflight: dict[str, _Call] = {}
        self.outstanding = [0] * len(engines)  # routed and not finished: the router's view of load
        self.calls = [0] * len(engines)
        self.completed = 0
        self.now = 0.0  # the global clock: every engine's clock is at or behind it
        self._heap: list[tuple[float, int, Callable[[], None]]] = []  # the client's events
        self._seq = itertools.count()
        for i, e in enumerate(self.engines):
            e.on_finish = partial(self._on_finish, i)
        for t in self.tasks:
            self.at(t.plan.arrival_s, partial(self._arrive, t))

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), fn))

    def on_replica(self, i: int, fn: Callable[[], None]) -> None:
        """Run `fn` on replica `i` at the global now: at once if its clock is there (it decides
        only at its next step, after this), else as an event at now on its own heap (its
        clock is behind: called directly, `fn` would happen in its past)."""
        e = self.engines[i]
        if e.now >= self.now:
            fn()
        else:
            e.call_at(self.now, fn)

    def _arrive(self, t: _Task) -> None:
        for stage in t.plan.workflow.roots:
            self._submit(t, stage, 0)

    def _submit(self, t: _Task, stage: str, k: int) -> None:
        """The client issues round `k` of `stage` now: it is routed now and reaches the
        replica's front end now."""
        req = round_request(t.plan, stage, k)
        i = self.router.route(CallInfo(req.task_id, req.agent, req.prefix_tokens, req.input_tokens),
                              self.outstanding)
        self.inflight[req.rid] = _Call(t, stage, k, i)
        self.outstanding[i] += 1
        self.calls[i] += 1
        t.replicas.setdefault(stage, set()).add(i)
        # An event on the replica even when the front end will hold the call: the single
        # engine has the client's events on its heap, which end a decode jump there, so the
        # replica's clock steps as the single engine's does (a jump cut elsewhere differs in
        # the last bits).
        self.on_replica(i, partial(self._reach_front, i, req))

    def _reach_front(self, i: int, req: EngineRequest) -> None:
        """Replica `i`'s front end takes the call: the engine gets it after the calls ahead
        of it and its own `call_overhead_s` (at once without overhead)."""
        e = self.engines[i]
        enter_s = self.fronts[i].admit(e.now)
        if enter_s is None:
            e.submit(req)
        else:
            e.call_at(enter_s, partial(e.submit, req))

    def _on_finish(self, replica: int, rid: str, now: float) -> None:
        """Replica `replica` finished `rid` at `now` (the global now: it is in this turn's step)."""
        self.outstanding[replica] -= 1
        t, stage, k, _ = self.inflight.pop(rid)
        wf = t.plan.workflow
        if k + 1 < len(t.plan.rounds[stage]):
            wait = wf.stage(stage).tool_wait_s
            if wait > 0:
                self.at(now + wait, partial(self._submit, t, stage, k + 1))
            else:
                self._submit(t, stage, k + 1)
            return
        task_id = t.plan.task_id
        for i in sorted(t.replicas[stage]):
            self.on_replica(i, partial(self.engines[i].stage_done, task_id, stage))
        t.done.add(stage)
        for succ in ready_successors(wf, t.done, stage):
            self._submit(t, succ, 0)
        if len(t.done) == len(wf.stages):
            t.finish_s = now
            for i in sorted(set().union(*t.replicas.values())):
                self.on_replica(i, partial(self.engines[i].task_done, task_id))
            if isinstance(self.router, Pinned):
                self.router.forget(task_id)
            self.completed += 1

    def _next_time(self) -> float | None:
        times = [e.next_event_time() for e in self.engines]
        times.append(self._heap[0][0] if self._heap else None)
        return min((x for x in times if x is not None), default=None)

    def run(self) -> None:
        while (now := self._next_time()) is not None:
            self.now = now
            for e in self.engines:
                e.step(now)
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
        preemptions=sum(s.preemptions for s in stats), task_jcts=tuple(jct.tolist()))
