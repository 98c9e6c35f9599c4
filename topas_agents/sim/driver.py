"""Workflow traces and the offline driver: tasks -> stages -> ReAct rounds -> engine requests."""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from ..costmodel import Profile
from ..engine import EngineRequest
from ..errors import ConfigError
from ..percentile import percentile
from ..policies import Policy
from ..workflow import TaskPlan, Workflow, sample_task
from .engine import SimEngine
from .record import TimelineRecorder
from .types import RunResult, StallError, TaskResult


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """The arrival times of `n` tasks of a Poisson process at `rate` tasks/s (the first one gap
    after 0), from the stream of `seed` that every arrival process here draws from: the
    simulator's traces, a recorded trace redrawn at a rate, and the real-engine evaluation,
    so one seed means one arrival process everywhere."""
    gaps = random.Random(f"arrivals-{seed}")
    t, times = 0.0, []
    for _ in range(n):
        t += gaps.expovariate(rate)
        times.append(t)
    return times


def make_trace(workflow: Workflow, n_tasks: int, rate: float, seed: int) -> tuple[TaskPlan, ...]:
    """`n_tasks` tasks with Poisson arrivals at `rate` tasks/s, ids f"{wf.name}-{i}".

    Arrival gaps and task contents use separate seeded streams, so the same seed at another
    rate yields the same tasks arriving at other times (loads are comparable).
    """
    if isinstance(n_tasks, bool) or not isinstance(n_tasks, numbers.Integral) or n_tasks < 0:
        raise ConfigError(f"n_tasks must be an integer >= 0, got {n_tasks!r}")
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0 < rate < math.inf:
        raise ConfigError(f"arrival rate must be a finite number > 0 tasks/s, got {rate!r}")
    sizes = random.Random(seed)
    return tuple(sample_task(workflow, f"{workflow.name}-{i}", t, sizes)
                 for i, t in enumerate(poisson_arrivals(n_tasks, rate, seed)))


class FrontEnd:
    """One FIFO front end charging `call_overhead_s` per call (why FIFO: `_Driver`'s docstring).

    The single-engine driver has one; the simulated cluster one per replica (each replica is
    its own server, with its own HTTP server and tokenizer: cluster/cosim.py)."""

    __slots__ = ("overhead_s", "free_s")

    def __init__(self, overhead_s: float) -> None:
        self.overhead_s = overhead_s
        self.free_s = 0.0  # when the front end finishes the calls issued so far

    def admit(self, now: float) -> float | None:
        """When a call issued at `now` reaches the engine: after the calls ahead of it, plus
        its own overhead. None without overhead: it reaches the engine now, and the caller
        adds no event (so runs stay bit-identical to a driver without the term)."""
        if self.overhead_s <= 0:
            return None
        self.free_s = max(now, self.free_s) + self.overhead_s
        return self.free_s


class _TaskRun:
    __slots__ = ("plan", "done", "finish_s")

    def __init__(self, plan: TaskPlan) -> None:
        self.plan = plan
        self.done: set[str] = set()
        self.finish_s: float | None = None


class _Driver:
    """Releases stages as their predecessors finish and rounds as tool waits elapse.

    The driver plays the client, so it also charges the profile's per-call overhead
    (`call_overhead_s`: HTTP, tokenization, detokenization, client work) on one FIFO
    front-end: a call waits for the front-end, holds it `call_overhead_s`, then reaches the
    engine. One server, because that work is serial in a real deployment (SGLang's tokenizer
    manager and detokenizer are one process each by default, the HTTP server one worker, a
    benchmark client one event loop), so under load calls queue for it (docs/sglang.md
    measures a pure delay predicting a seventh to a tenth of the real JCT on CPU, a FIFO
    front-end 68-76%). All of it is charged
    before the engine queue, the side the scheduler sees (it gets a request only once it is
    tokenized); the part a real call spends after its last token only delays the task's next
    call, which that call's own term covers, so a chain of n calls pays n terms either way.
    With 0 (the shipped profiles) no event is added: runs are bit-identical to a driver
    without the term.
    """

    def __init__(self, engine: SimEngine, trace: Sequence[TaskPlan],
                 progress: Callable[[int, int], None] | None) -> None:
        self.engine = engine
        self.front = FrontEnd(engine.profile.call_overhead_s)
        self.runs = [_TaskRun(tp) for tp in trace]
        self.progress = progress
        self.completed = 0
        self.requests = 0
        self.inflight: dict[str, tuple[_TaskRun, str, int]] = {}
        engine.on_finish = self._on_finish
        for tr in self.runs:
            engine.call_at(tr.plan.arrival_s, partial(self._arrive, tr))

    def _arrive(self, tr: _TaskRun) -> None:
        for stage in tr.plan.workflow.roots:
            self._submit(tr, stage, 0)

    def _submit(self, tr: _TaskRun, stage: str, k: int) -> None:
        """The client issues round `k` of `stage` now; the engine sees it once the front-end
        has served it (FIFO, `call_overhead_s` per call)."""
        enter_s = self.front.admit(self.engine.now)
        if enter_s is None:
            self._enter(tr, stage, k)
        else:
            self.engine.call_at(enter_s, partial(self._enter, tr, stage, k))

    def _enter(self, tr: _TaskRun, stage: str, k: int) -> None:
        req = round_request(tr.plan, stage, k)
        self.inflight[req.rid] = (tr, stage, k)
        self.engine.submit(req)

    def _on_finish(self, rid: str, t: float) -> None:
        tr, stage, k = self.inflight.pop(rid)
        self.requests += 1
        wf = tr.plan.workflow
        if k + 1 < len(tr.plan.rounds[stage]):
            wait = wf.stage(stage).tool_wait_s
            if wait > 0:
                self.engine.call_at(t + wait, partial(self._submit, tr, stage, k + 1))
            else:
                self._submit(tr, stage, k + 1)
            return
        self.engine.stage_done(tr.plan.task_id, stage)
        tr.done.add(stage)
        for succ in ready_successors(wf, tr.done, stage):
            self._submit(tr, succ, 0)
        if len(tr.done) == len(wf.stages):
            tr.finish_s = t
            self.engine.task_done(tr.plan.task_id)
            self.completed += 1
            if self.progress is not None:
                self.progress(self.completed, len(self.runs))


def round_request(plan: TaskPlan, stage: str, k: int) -> EngineRequest:
    """The engine request of round `k` of `stage` in a task (one definition for every driver)."""
    wf = plan.workflow
    spec, rnd = wf.stage(stage), plan.rounds[stage][k]
    return EngineRequest(
        rid=f"{plan.task_id}/{stage}/{k}", task_id=plan.task_id, workflow=wf.name, stage=stage,
        agent=spec.agent, prefix_tokens=wf.prefix_tokens(spec.agent), input_tokens=rnd.input_tokens,
        output_tokens=rnd.output_tokens,
        # The client's limit is the stage's declared upper bound: KV is reserved for it.
        max_new_tokens=max(spec.output_tokens.hi, rnd.output_tokens),
        round=k, task_arrival_s=plan.arrival_s,
    )


def ready_successors(wf: Workflow, done: set[str], stage: str) -> list[str]:
    """Successors of `stage` (just added to `done`) whose every predecessor is done."""
    return [succ for succ in wf.successors[stage] if all(d in done for d in wf.stage(succ).after)]


def simulate(trace: Sequence[TaskPlan], policy: Policy, profile: Profile, *, kv_budget: int | None = None,
             host_tier: bool | None = None, check: bool = False,
             progress: Callable[[int, int], None] | None = None,
             recorder: TimelineRecorder | None = None) -> RunResult:
    """Run `trace` to completion on a fresh SimEngine under `policy` (`recorder`: record
    request timelines, see sim/record.py; off by default)."""
    trace = tuple(trace)  # a generator would be spent by the loop below (a silent empty run)
    workflows: dict[str, Workflow] = {}
    for tp in trace:
        known = workflows.setdefault(tp.workflow.name, tp.workflow)
        if known is not tp.workflow and (known.agents, known.stages) != (tp.workflow.agents, tp.workflow.stages):
            # the engine and the policy would see the first definition, the driver run the other
            raise ConfigError(f"two different workflows are named {tp.workflow.name!r} in one trace")
    engine = SimEngine(profile, policy, kv_budget=kv_budget, host_tier=host_tier, workflows=workflows,
                       check=check, recorder=recorder)
    driver = _Driver(engine, trace, progress)
    engine.run()
    if driver.completed < len(driver.runs):
        raise StallError(
            f"simulation stalled at t={engine.now:.3f}s: policy {getattr(policy, 'name', policy)!r} left "
            f"{engine.waiting_count} requests waiting and {engine.running_count} running, "
            f"{len(driver.runs) - driver.completed} of {len(driver.runs)} tasks unfinished"
        )
    return _result(getattr(policy, "name", type(policy).__name__), driver, engine)


def _result(policy: str, driver: _Driver, engine: SimEngine) -> RunResult:
    stats = engine.stats()
    tasks = tuple(
        TaskResult(tr.plan.task_id, tr.plan.workflow.name, tr.plan.arrival_s, tr.finish_s,
                   tr.finish_s - tr.plan.arrival_s)
        for tr in driver.runs if tr.finish_s is not None
    )
    jct = np.array([t.jct_s for t in tasks], dtype=float)
    if len(tasks):
        start = min(t.arrival_s for t in tasks)
        makespan = max(t.finish_s for t in tasks) - start
        first = min(t.finish_s for t in tasks) - start
    else:
        makespan = first = 0.0
    return RunResult(
        policy=policy,
        tasks=tasks,
        makespan_s=makespan,
        mean_jct=float(jct.mean()) if len(jct) else 0.0,
        p99_jct=percentile(jct, 99) if len(jct) else 0.0,
        first_task_s=first,
        throughput_rps=driver.requests / makespan if makespan > 0 else 0.0,
        mean_batch=stats.mean_batch,
        prefix_swaps=stats.prefix_swaps_in + stats.prefix_swaps_out,
        prefix_recomputes=stats.prefix_recomputes,
        preemptions=stats.preemptions,
        decision_ms_mean=stats.decision_ms_mean,
        decision_ms_p99=stats.decision_ms_p99,
        requests=driver.requests,
        stats=stats,
    )
