"""The simulated serving engine: one GPU, continuous batching, a deterministic event heap.

The engine owns the clock. One heap keyed `(time, seq)` orders every event (external
callbacks, transfer completions, the end of the GPU work in flight). GPU work is either
one prefill step or a *jump* of k identical decode steps computed in closed form, so the
simulation costs O(events), not O(tokens). The policy is consulted only at scheduling
events (arrival, finish, transfer completion, cancel), at a step boundary or when the GPU
is idle, never mid-step. See docs/simulator.md for the model and its choices.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from heapq import heappop, heappush
from types import MappingProxyType
from typing import Any

import numpy as np

from ..costmodel import Profile
from ..errors import DecisionError, TopasError
from ..policies import Policy
from ..snapshot import Decision, RequestView, Snapshot, StageDone, TaskView, check_decision
from ..workflow import Workflow
from .integrity import check_engine
from .residency import ResidencyMixin
from .runs import RunsMixin
from .state import Prefix, PrefixFill, Req, Run, Task
from .types import EngineRequest, EngineStats, OverBudgetError, RequestError
from .views import ViewsMixin

CALLBACK, TRANSFER, RUN_END = 0, 1, 2


class SimEngine(ResidencyMixin, RunsMixin, ViewsMixin):
    """Deterministic discrete-event model of one serving GPU driven by a `Policy`."""

    def __init__(self, profile: Profile, policy: Policy, *, kv_budget: int | None = None,
                 host_tier: bool | None = None, workflows: Mapping[str, Workflow] = MappingProxyType({}),
                 check: bool = False, max_jump_s: float | None = None) -> None:
        if max_jump_s is not None and max_jump_s <= 0:
            raise TopasError(f"max_jump_s must be > 0, got {max_jump_s}")
        self.profile = profile
        self.policy = policy
        self.kv_budget = profile.kv_budget_tokens if kv_budget is None else int(kv_budget)
        self.host_tier = profile.host_tier if host_tier is None else bool(host_tier)
        # A live read-only view (not a copy): workflows the caller registers later (the HTTP
        # server does) reach the policy; their agents' prefixes are created on first submit.
        self.workflows: Mapping[str, Workflow] = (
            workflows if isinstance(workflows, MappingProxyType) else MappingProxyType(workflows)  # type: ignore[arg-type]
        )
        self.check = check
        self.max_jump_s = max_jump_s
        self.now = 0.0
        self.on_token: Callable[[str, int], None] | None = None
        self.on_finish: Callable[[str, float], None] | None = None
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._reqs: dict[str, Req] = {}  # live: waiting or running
        self._waiting: dict[str, Req] = {}
        self._waiting_views: dict[str, RequestView] = {}
        self._running: dict[str, Req] = {}
        self._decoding: dict[str, Req] = {}
        self._fills: list[Req | PrefixFill] = []  # prefill jobs ready to run, FIFO
        self._dec_ctx = 0  # sum of context over decoding requests
        self._prefixes: dict[str, Prefix] = {}
        self._tasks: dict[str, Task] = {}
        self._task_views: dict[str, TaskView] = {}
        self._task_dirty: dict[str, Task] = {}
        self._events: list[StageDone] = []
        self._kv_used = 0
        self._link_free_s = 0.0
        self._run: Run | None = None
        self._dirty = False
        self._decision_s: list[float] = []
        self._n_swaps_in = self._n_swaps_out = self._n_recomputes = self._n_preempt = 0
        self._n_finished = self._n_cancelled = self._n_runs = 0
        self._n_prefill_steps = self._n_decode_steps = self._n_prefill_tokens = 0
        self._tokens = self._finished_tokens = self._cancelled_tokens = 0
        self._busy_s = self._batch_time = self._decode_time = 0.0
        for wf in self.workflows.values():
            for a in wf.agents:
                self._prefixes.setdefault(a.name, Prefix(a.name, a.prefix_tokens))

    # ------------------------------------------------------------------ heap

    def _push(self, t: float, kind: int, obj: Any) -> None:
        self._seq += 1
        heappush(self._heap, (t, self._seq, kind, obj))

    def _peek(self) -> float | None:
        """Time of the next live event (stale jump ends are dropped)."""
        heap = self._heap
        while heap:
            t, _, kind, obj = heap[0]
            if kind == RUN_END and (obj is not self._run or obj.end_s != t):
                heappop(heap)
                continue
            return t
        return None

    # ------------------------------------------------------------------ external API

    def submit(self, req: EngineRequest) -> None:
        """The request arrives now. Raises OverBudgetError if it can never fit the budget."""
        p = self._prefixes.get(req.agent)
        prefix_tokens = p.tokens if p is not None else req.prefix_tokens
        # A request claiming a longer prefix than its agent's registered one: the excess is
        # not shared, so it is dynamic input (uncached prefill, own KV).
        input_tokens = req.input_tokens + max(0, req.prefix_tokens - prefix_tokens)
        self._validate(req, prefix_tokens, input_tokens)
        if p is None:
            p = self._prefixes[req.agent] = Prefix(req.agent, req.prefix_tokens)
        task = self._tasks.get(req.task_id)
        if task is None:
            arrival = self.now if req.task_arrival_s is None else req.task_arrival_s
            task = self._tasks[req.task_id] = Task(req.task_id, req.workflow, arrival)
        task.active.setdefault(req.stage, 0.0)
        task.rounds[req.stage] = task.rounds.get(req.stage, 0) + 1
        task.agents[req.stage] = req.agent
        task.view = None
        self._task_view(task)
        r = Req(req, task, p, input_tokens, self.now)
        self._reqs[r.rid] = r
        self._waiting[r.rid] = r
        self._waiting_views[r.rid] = self._request_view(r)
        self._dirty = True
        self._interrupt(self.now)

    def _validate(self, req: EngineRequest, prefix_tokens: int, input_tokens: int) -> None:
        if req.rid in self._reqs:
            raise RequestError(f"request id '{req.rid}' is already waiting or running")
        if min(req.prefix_tokens, req.input_tokens) < 0 or req.output_tokens < 1:
            raise RequestError(f"request '{req.rid}': token counts must be >= 0 and output_tokens >= 1")
        if req.output_tokens > req.max_new_tokens:
            raise RequestError(
                f"request '{req.rid}': output_tokens {req.output_tokens} > max_new_tokens {req.max_new_tokens}"
            )
        need = prefix_tokens + input_tokens + req.max_new_tokens
        if need > self.kv_budget:
            raise OverBudgetError(
                f"request '{req.rid}' needs {need} KV tokens (prefix {prefix_tokens} + input "
                f"{input_tokens} + max_new_tokens {req.max_new_tokens}) but the KV budget is "
                f"{self.kv_budget}: it can never run"
            )

    def cancel(self, rid: str) -> bool:
        """Remove a waiting or running request and free its KV; False if unknown/finished."""
        r = self._reqs.pop(rid, None)
        if r is None:
            return False
        if r.state == "waiting":
            del self._waiting[rid]
            del self._waiting_views[rid]
        else:
            self._release(r)
        r.state = "cancelled"
        self._cancelled_tokens += r.generated
        self._n_cancelled += 1
        self._dirty = True
        self._interrupt(self.now)
        return True

    def stage_done(self, task_id: str, stage: str) -> None:
        """Record that a stage finished (policies see it as a StageDone event)."""
        task = self._tasks.get(task_id)
        if task is None:
            raise TopasError(f"stage_done: unknown or finished task '{task_id}'")
        service = task.active.pop(stage, 0.0)
        task.done.add(stage)
        task.view = None
        self._task_view(task)
        self._events.append(StageDone(task_id, task.workflow, stage, task.agents.get(stage, ""), service,
                                      task.rounds.get(stage, 0), self.now))

    def task_done(self, task_id: str) -> None:
        """Forget a finished task (it leaves the snapshot's task list)."""
        self._tasks.pop(task_id, None)
        self._task_views.pop(task_id, None)
        self._task_dirty.pop(task_id, None)

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        """Run `fn` at time `t` (clamped to now) in the engine's event order."""
        t = max(t, self.now)
        self._push(t, CALLBACK, fn)
        self._interrupt(t)

    def next_event_time(self) -> float | None:
        """When something next happens; `now` if a decision is pending; None when idle."""
        if self._run is None and (self._dirty or self._fills or self._decoding):
            return self.now
        return self._peek()

    def advance(self, until: float) -> None:
        """Process every event with time <= `until`; the clock ends at `until` (if finite)."""
        while True:
            if self._run is None:
                self._settle()
            t = self._peek()
            if t is None or t > until:
                break
            self.now = max(self.now, t)
            while (t2 := self._peek()) is not None and t2 <= t:
                _, _, kind, obj = heappop(self._heap)
                self._handle(kind, obj)
        if until != math.inf and until > self.now:
            self.now = until

    def run(self) -> None:
        """Advance until nothing is left to happen."""
        self.advance(math.inf)

    # ------------------------------------------------------------------ loop internals

    def _handle(self, kind: int, obj: Any) -> None:
        if kind == CALLBACK:
            obj()
        elif kind == TRANSFER:
            self._transfer_done(obj)
        else:
            self._finish_run(obj)

    def _settle(self) -> None:
        """At a step boundary with the GPU free: decide if something happened, then run."""
        if self._dirty:
            self._dirty = False
            self._decide()
        self._start_run()

    def _decide(self) -> None:
        events, self._events = tuple(self._events), []
        snap = self._build_snapshot(events)
        t0 = time.perf_counter()
        decision = self.policy.decide(snap)
        self._decision_s.append(time.perf_counter() - t0)
        if not isinstance(decision, Decision):
            raise DecisionError(f"policy {self._policy_name()} returned {type(decision).__name__}, not a Decision")
        if not decision.empty:  # an empty decision keeps a valid state valid: nothing to check
            check_decision(self._check_view(snap, decision), decision)
            self._apply(decision)
        if self.check:
            self.check_integrity()

    def _check_view(self, snap: Snapshot, decision: Decision) -> Snapshot:
        """`snap` with `waiting` cut to the admitted requests: check_decision reads waiting
        only to look up admitted ids, so its verdict is the same, in O(|admit|) not O(W).
        Ids that are not waiting are left out and still rejected."""
        views = self._waiting_views
        return replace(snap, waiting=tuple(views[rid] for rid in decision.admit if rid in views))

    def _policy_name(self) -> str:
        return repr(getattr(self.policy, "name", type(self.policy).__name__))

    def _apply(self, d: Decision) -> None:
        for rid in d.preempt:
            r = self._running[rid]
            self._release(r)
            r.preemptions += 1
            self._n_preempt += 1
            self._requeue(r)
        for agent in d.prefix_out:
            self._prefix_out(self._prefixes[agent])
        for agent in d.prefix_in:
            self._prefix_in(self._prefixes[agent])
        for rid in d.admit:
            self._admit(self._waiting[rid])

    # ------------------------------------------------------------------ inspection

    def check_integrity(self) -> None:
        """Raise AssertionError naming the first broken engine invariant."""
        check_engine(self)

    def stats(self) -> EngineStats:
        ms = np.asarray(self._decision_s) * 1e3
        return EngineStats(
            decisions=len(ms),
            decision_ms_mean=float(ms.mean()) if len(ms) else 0.0,
            decision_ms_p99=float(np.percentile(ms, 99)) if len(ms) else 0.0,
            mean_batch=self._batch_time / self._decode_time if self._decode_time else 0.0,
            prefix_swaps_in=self._n_swaps_in,
            prefix_swaps_out=self._n_swaps_out,
            prefix_recomputes=self._n_recomputes,
            preemptions=self._n_preempt,
            busy_s=self._busy_s,
            tokens_generated=self._tokens,
            requests_finished=self._n_finished,
            requests_cancelled=self._n_cancelled,
            prefill_steps=self._n_prefill_steps,
            decode_steps=self._n_decode_steps,
            prefill_tokens=self._n_prefill_tokens,
            runs=self._n_runs,
            now=self.now,
        )

    @property
    def kv_used(self) -> int:
        return self._kv_used

    @property
    def idle(self) -> bool:
        """Nothing running, nothing in flight, nothing scheduled."""
        return self._run is None and not self._running and self._peek() is None

    @property
    def waiting_count(self) -> int:
        return len(self._waiting)

    @property
    def running_count(self) -> int:
        return len(self._running)

