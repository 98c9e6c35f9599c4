"""The simulated serving engine: one GPU, continuous batching, a deterministic event heap.

The engine owns the clock. One heap keyed `(time, seq)` orders every event (external
callbacks, transfer completions, the end of the GPU work in flight). GPU work is either
one prefill step or a *jump* of k identical decode steps computed in closed form, so the
simulation costs O(events), not O(tokens). The policy is consulted only at scheduling
events (arrival, finish, transfer completion, cancel), at a step boundary or when the GPU
is idle, never mid-step. See docs/simulator.md for the model and its choices.

`SimEngine` owns the clock, the event heap and the request lifecycle, and composes small
managers that each own their state: `RequestTable` (who waits, who runs), `Residency`
(prefixes, KV, host link), `GpuWork` (prefill queue, decode batch, work in flight),
`Tasks` (stages, service, StageDone events) and `Views` (the policy's Snapshot).
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

from ..costmodel import Profile
from ..engine import EngineRequest, OverBudgetError, RequestError
from ..errors import ConfigError, DecisionError, TopasError
from ..policies import Policy
from ..snapshot import Decision, Snapshot, check_decision
from ..workflow import Workflow
from .decision_times import DecisionTimes
from .events import CALLBACK, TRANSFER, EventHeap
from .fills import PrefillQueue
from .integrity import check_engine
from .record import TimelineRecorder
from .requests import RequestTable
from .residency import PrefixCacheCount, Residency
from .runs import GpuWork
from .state import Req
from .tasks import Tasks
from .types import EngineStats
from .views import Views

# Prefix records kept before the engine forgets idle ones of agents that no workflow declares:
# a server whose clients name an agent per task (`coder-<task>`, labelled without a
# workflow) kept one per name for its whole life, and every decision looked at all of them
# (0.2 ms a decision with 1 prefix, 5 ms with 2000, 10 ms with 8000). Benchmarks declare
# every agent, and have far fewer.
FORGET_PREFIXES_PAST = 1024


class SimEngine:
    """Deterministic discrete-event model of one serving GPU driven by a `Policy`."""

    def __init__(self, profile: Profile, policy: Policy, *, kv_budget: int | None = None,
                 host_tier: bool | None = None, workflows: Mapping[str, Workflow] = MappingProxyType({}),
                 check: bool = False, max_jump_s: float | None = None,
                 recorder: TimelineRecorder | None = None) -> None:
        if max_jump_s is not None and max_jump_s <= 0:
            raise TopasError(f"max_jump_s must be > 0, got {max_jump_s}")
        self.profile = profile
        self.policy = policy
        self.kv_budget = profile.kv_budget_tokens if kv_budget is None else _budget(kv_budget)
        self.host_tier = profile.host_tier if host_tier is None else bool(host_tier)
        # A live read-only view (not a copy): workflows the caller registers later (the HTTP
        # server does) reach the policy; their agents' prefixes are created on first submit.
        self.workflows: Mapping[str, Workflow] = (
            workflows if isinstance(workflows, MappingProxyType) else MappingProxyType(workflows)  # type: ignore[arg-type]
        )
        self.check = check
        self.max_jump_s = max_jump_s
        self.now = 0.0
        self.on_finish: Callable[[str, float], None] | None = None
        self._dirty = False  # something happened since the last decision
        self._decision_s = DecisionTimes()
        self._forget_past = FORGET_PREFIXES_PAST
        self._heap = EventHeap()
        self._requests = RequestTable()
        self._tasks = Tasks()
        fills = PrefillQueue()
        self._residency = Residency(profile, self.host_tier, self._heap, fills)
        self._gpu = GpuWork(profile, max_jump_s, self._heap, fills, self._residency, self._tasks,
                            retire=self._finish, wake=self._wake)
        self._views = Views(profile, self.kv_budget, self._requests, self._residency.prefixes, self._tasks)
        for wf in self.workflows.values():
            for a in wf.agents:
                self._residency.register(a.name, a.prefix_tokens)
        self._rec: TimelineRecorder | None = None
        if recorder is not None:
            self.set_recorder(recorder)

    def set_recorder(self, recorder: TimelineRecorder | None) -> None:
        """Record request timelines from now on (None: stop). Off by default: recording
        costs a scan of the running requests per event batch (see sim/record.py)."""
        self._rec = recorder
        self._residency.on_transfer = None if recorder is None else recorder.transfer
        if recorder is not None:
            recorder.kv_budget = self.kv_budget

    @property
    def recorder(self) -> TimelineRecorder | None:
        return self._rec

    @property
    def on_token(self) -> Callable[[str, int], None] | None:
        """Called as `on_token(rid, tokens generated so far)` when a request gains tokens."""
        return self._gpu.on_token

    @on_token.setter
    def on_token(self, fn: Callable[[str, int], None] | None) -> None:
        self._gpu.on_token = fn

    # ------------------------------------------------------------------ external API

    def submit(self, req: EngineRequest) -> None:
        """The request arrives now. Raises OverBudgetError if it can never fit the budget."""
        p = self._residency.prefixes.get(req.agent)
        prefix_tokens = p.tokens if p is not None else req.prefix_tokens
        # A request claiming a longer prefix than its agent's registered one: the excess is
        # not shared, so it is dynamic input (uncached prefill, own KV).
        input_tokens = req.input_tokens + max(0, req.prefix_tokens - prefix_tokens)
        self._validate(req, prefix_tokens, input_tokens)
        if p is None:
            p = self._residency.register(req.agent, req.prefix_tokens)
        task = self._tasks.open(req, self.now)
        r = Req(req, task, p, input_tokens, self.now)
        self._requests.add(r)
        if self._rec is not None:
            self._rec.arrive(self.now, r)
        self._dirty = True
        self._gpu.interrupt(self.now)

    def _validate(self, req: EngineRequest, prefix_tokens: int, input_tokens: int) -> None:
        if req.rid in self._requests.live:
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
        r = self._requests.live.get(rid)
        if r is None:
            return False
        if r.state == "running":
            self._release(r)
        self._requests.retire(r, "cancelled")
        if self._rec is not None:
            self._rec.leave(self.now, r, "cancelled")
        self._dirty = True
        self._gpu.interrupt(self.now)
        return True

    def stage_done(self, task_id: str, stage: str) -> None:
        """Record that a stage finished (policies see it as a StageDone event)."""
        if not self._tasks.stage_done(task_id, stage, self.now):
            raise TopasError(f"stage_done: unknown or finished task '{task_id}'")

    def task_done(self, task_id: str) -> None:
        """Forget a finished task (it leaves the snapshot's task list)."""
        self._tasks.task_done(task_id)
        if self._rec is not None:
            self._rec.task_done(task_id)

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        """Run `fn` at time `t` (clamped to now) in the engine's event order."""
        if not math.isfinite(t):  # a NaN time never leaves the heap: the run would spin for ever
            raise ValueError(f"event time must be finite, got {t!r}")
        t = max(t, self.now)
        self._heap.push(t, CALLBACK, fn)
        self._gpu.interrupt(t)

    def next_event_time(self) -> float | None:
        """When something next happens; `now` if a decision is pending; None when idle."""
        if self._gpu.run is None and (self._dirty or self._gpu.has_work):
            return self.now
        return self._peek()

    def redecide(self) -> None:
        """Consult the policy at the next step even though nothing happened: a live engine
        whose policy left requests waiting with nothing scheduled asks it again (as the
        SGLang plugin re-decides every TOPAS_SGLANG_REDECIDE_S); a benchmark calls that state
        a stall instead (sim/driver.py StallError)."""
        self._dirty = True

    def advance(self, until: float) -> None:
        """Process every event with time <= `until`; the clock ends at `until` (if finite)."""
        while self.step(until):
            pass
        if until != math.inf and until > self.now:
            self.now = until

    def run(self) -> None:
        """Advance until nothing is left to happen."""
        self.advance(math.inf)

    # ------------------------------------------------------------------ the loop

    def step(self, until: float = math.inf) -> bool:
        """One turn of the loop. At a step boundary with the GPU free: decide if something
        happened, start the next GPU work. Then process every event at the next event time,
        if that is <= `until` (False, and the clock unchanged, if it is not)."""
        if self._gpu.run is None:
            if self._dirty:
                self._dirty = False
                self._decide()
                if self._rec is not None:
                    self._sync_recorder()
            self._gpu.start(self.now)
        t = self._peek()
        if t is None or t > until:
            return False
        self.now = max(self.now, t)
        while (t2 := self._peek()) is not None and t2 <= t:
            kind, obj = self._heap.pop()
            if kind == CALLBACK:
                obj()
            elif kind == TRANSFER:
                if self._residency.transfer_done(obj):
                    self._dirty = True
            else:
                self._gpu.finish(obj)
                if self.check:
                    self.check_integrity()
        if self._rec is not None:
            self._sync_recorder()
        return True

    def _sync_recorder(self) -> None:
        assert self._rec is not None
        self._rec.sync(self.now, self._requests.running.values(), self._residency.kv_used,
                       len(self._gpu.decoding))

    def _peek(self) -> float | None:
        return self._heap.peek(self._gpu.run)

    def _wake(self) -> None:
        self._dirty = True

    def _forget_idle_agents(self) -> None:
        """Forget the prefix records of agents no registered workflow declares whose prefix
        is not on GPU (nowhere, or only a host copy, which goes too) and that have no live
        request, once the records outgrow twice those kept the last time (amortised: one pass
        over prefixes and live requests)."""
        prefixes = self._residency.prefixes
        if len(prefixes) <= self._forget_past:
            return
        declared = {a.name for wf in self.workflows.values() for a in wf.agents}
        live = {r.prefix.agent for r in self._requests.live.values()}
        idle = {a for a, p in prefixes.items()
                if p.location in ("none", "cpu") and p.transfer is None and p.running == 0 and not p.waiters
                and p.filler is None and a not in live and a not in declared}
        self._residency.forget(idle)
        self._forget_past = max(FORGET_PREFIXES_PAST, 2 * len(prefixes))

    def _decide(self) -> None:
        self._forget_idle_agents()
        snap = self._views.snapshot(self.now, self._tasks.take_events(), self.workflows)
        t0 = time.perf_counter()
        decision = self.policy.decide(snap)
        self._decision_s.add(time.perf_counter() - t0)
        if not isinstance(decision, Decision):
            raise DecisionError(f"policy {self._policy_name()} returned {type(decision).__name__}, not a Decision")
        if not decision.empty:  # an empty decision keeps a valid state valid: nothing to check
            check_decision(self._views.for_check(snap, decision), decision)
            self._apply(decision)
        if self.check:
            self.check_integrity()

    def _policy_name(self) -> str:
        return repr(getattr(self.policy, "name", type(self.policy).__name__))

    def _apply(self, d: Decision) -> None:
        """Applied in the boundary's order: preempt, prefix_out, prefix_in, admit."""
        requests, residency, now = self._requests, self._residency, self.now
        rec = self._rec
        for rid in d.preempt:
            r = requests.running[rid]
            self._release(r)
            requests.requeue(r)
            if rec is not None:
                rec.preempt(now, r)
        for agent in d.prefix_out:
            residency.prefix_out(residency.prefixes[agent], now)
        for agent in d.prefix_in:
            residency.prefix_in(residency.prefixes[agent], now)
        for rid in d.admit:
            r = requests.admit(rid)
            residency.pin(r, now)
            if rec is not None:
                rec.admit(now, r)

    # ------------------------------------------------------------------ request lifecycle

    def _release(self, r: Req) -> None:
        """Take a running request off the GPU (finish, preemption, cancel): frees its KV."""
        self._requests.stop_running(r)
        self._gpu.drop(r)
        self._residency.unpin(r, self.now)
        r.phase = None
        r.computes_prefix = False
        r.view = None

    def _finish(self, r: Req) -> None:
        """`r` generated its last token."""
        self._release(r)
        self._requests.retire(r, "finished")
        if self._rec is not None:
            self._rec.leave(self.now, r, "finished")
        self._dirty = True
        if self.on_finish is not None:
            self.on_finish(r.rid, self.now)

    # ------------------------------------------------------------------ inspection

    def snapshot(self) -> Snapshot:
        """The current view (pending StageDone events included, not consumed)."""
        return self._views.snapshot(self.now, self._tasks.pending_events(), self.workflows)

    def check_integrity(self) -> None:
        """Raise AssertionError naming the first broken engine invariant."""
        check_engine(self._requests, self._gpu, self._residency, kv_budget=self.kv_budget,
                     host_tier=self.host_tier)

    def stats(self) -> EngineStats:
        times = self._decision_s
        gpu, res, reqs = self._gpu, self._residency, self._requests
        return EngineStats(
            decisions=times.count,
            decision_ms_mean=times.mean_ms(),
            decision_ms_p99=times.p99_ms(),  # over the last KEPT_DECISIONS
            mean_batch=gpu.batch_time / gpu.decode_time if gpu.decode_time else 0.0,
            prefix_swaps_in=res.swaps_in,
            prefix_swaps_out=res.swaps_out,
            prefix_recomputes=res.recomputes,
            preemptions=reqs.preempted,
            busy_s=gpu.busy_s,
            tokens_generated=gpu.tokens,
            requests_finished=reqs.finished,
            requests_cancelled=reqs.cancelled,
            prefill_steps=gpu.prefill_steps,
            decode_steps=gpu.decode_steps,
            prefill_tokens=gpu.prefill_tokens,
            runs=gpu.runs,
            now=self.now,
        )

    def decision_times_s(self, start: int = 0) -> list[float]:
        """Wall-clock seconds of each policy decision from the `start`-th on, of the last
        KEPT_DECISIONS (a reader keeps its place with `decision_count`: /metrics observes each
        one once)."""
        return self._decision_s.since(start)

    @property
    def decision_count(self) -> int:
        return self._decision_s.count

    def prefix_cache_counts(self) -> dict[str, PrefixCacheCount]:
        """Per agent prefix: cumulative prefix-cache queries and hits in tokens."""
        res = self._residency
        counts = dict(res.forgotten_counts)
        for a, p in res.prefixes.items():
            old = counts.get(a, PrefixCacheCount(0, 0))
            counts[a] = PrefixCacheCount(old.queries + p.cache_queries, old.hits + p.cache_hits)
        return counts

    @property
    def kv_used(self) -> int:
        return self._residency.kv_used

    @property
    def idle(self) -> bool:
        """Nothing running, nothing in flight, nothing scheduled."""
        return self._gpu.run is None and not self._requests.running and self._peek() is None

    @property
    def waiting_count(self) -> int:
        return len(self._requests.waiting)

    @property
    def running_count(self) -> int:
        return len(self._requests.running)


def _budget(kv_budget: object) -> int:
    """A KV budget given in code: a whole number of tokens (NaN raised a bare ValueError from
    int(), and 1000.7 was cut to 1000)."""
    if isinstance(kv_budget, bool) or not isinstance(kv_budget, numbers.Real) or not math.isfinite(kv_budget) \
            or kv_budget != int(kv_budget):
        raise ConfigError(f"kv_budget must be a whole number of tokens, got {kv_budget!r}")
    return int(kv_budget)
