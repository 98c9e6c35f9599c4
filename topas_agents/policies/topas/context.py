"""Per-decision precomputation shared by GreedyPack and the state search.

Waiting requests are grouped by agent and valued lazily: an agent's candidate list (sorted by
weighted progress per extra KV token) is built only when a search step touches it; a running
request is turned into an Item only when a state would preempt it, its task is valued, or it
may release downstream stages (V_reuse). Remaining-service estimates, task path matrices, task
valuations and waiting requests' gains are carried across decisions in the policy's
`DecisionCaches` (caches.py; see `Context.task` and `Context.candidates`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...snapshot import PrefixView, RequestView, Snapshot, TaskView
from ...workflow import Workflow
from .caches import DecisionCaches, Remaining, TaskMemo
from .config import TopasConfig
from .longest_path import PathEstimator, TaskPaths, WorkflowModel
from .profiles import ServiceProfiles, remaining_service_s
from .terms import CreditStore, aging, j_redo, load_cost, reload_cost
from .valuation import Item, TaskCtx, TaskState, priority

if TYPE_CHECKING:
    from .occupancy import Reservation

_EMPTY: frozenset = frozenset()


# demand(): an agent's queue counts up to this many requests (a long queue should not
# dominate the greedy ranking; it only orders which outsiders are tried first).
_DEMAND_QUEUE_CAP = 8
# min_kv() scans this many candidates of a list.
MIN_KV_SCAN = 64


@dataclass(slots=True)
class Context:
    snap: Snapshot
    cfg: TopasConfig
    credits: CreditStore
    profiles: ServiceProfiles
    paths: PathEstimator
    horizon_s: float = 0.0
    quantum_s: float = 1.0  # grid of attained service in task-state keys (one horizon)
    age_scale_s: float = 1.0
    gpu: frozenset[str] = _EMPTY
    prefix: dict[str, PrefixView] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    tasks: dict[str, TaskCtx] = field(default_factory=dict)
    running_reqs: dict[str, list[RequestView]] = field(default_factory=dict)  # by agent
    running_kv: dict[str, int] = field(default_factory=dict)  # by agent
    running_by_task: dict[str, list[RequestView]] = field(default_factory=dict)
    reuse_pairs: dict[tuple[str, str], float] = field(default_factory=dict)  # (src, child) -> value
    _running: dict[str, list[Item]] = field(default_factory=dict)  # by agent, built lazily
    waiting: dict[str, list[RequestView]] = field(default_factory=dict)  # by agent
    oldest: dict[str, float] = field(default_factory=dict)  # earliest task arrival per agent
    views: dict[str, TaskView] = field(default_factory=dict)
    models: dict[str, WorkflowModel] = field(default_factory=dict)
    caches: DecisionCaches = field(default_factory=DecisionCaches)  # the policy's, across decisions
    _cands: dict[str, list[Item]] = field(default_factory=dict)
    _min_kv: dict[str, int] = field(default_factory=dict)
    _load: dict[str, tuple[float, bool]] = field(default_factory=dict)
    _preempt_cost: dict[str, float] = field(default_factory=dict)
    _shut_out_kv: dict[str, int] = field(default_factory=dict)  # see occupancy.py
    _shut_out_weight: dict[str, float] = field(default_factory=dict)
    reservation: Reservation | None = None  # EASY backfilling of the head (occupancy.py)
    _by_rid: dict[str, RequestView] | None = None  # waiting requests by rid, built on first use

    # ------------------------------------------------------------------ costs
    def load(self, agent: str) -> tuple[float, bool]:
        hit = self._load.get(agent)
        if hit is None:
            hit = self._load[agent] = load_cost(self.prefix.get(agent), self.tokens[agent], self.snap.profile)
        return hit

    def preempt_cost(self, item: Item) -> float:
        """J_redo + J_revoke of preempting a running request."""
        rid = item.req.rid
        hit = self._preempt_cost.get(rid)
        if hit is None:
            redo = item.task.g * j_redo(item.req, self.snap.profile)
            hit = self._preempt_cost[rid] = redo + self.credits.get(rid)
        return hit

    def reuse(self, item: Item) -> tuple[tuple[str, float], ...]:
        """V_reuse items of serving `item`: (agent of a released child, saved load x imminence)."""
        if item.reuse is None:
            task = item.task
            item.reuse = self._reuse_values(task.wf, item.req.stage, task.done, task.paths, task.g) \
                if item.col >= 0 else ()
        return item.reuse

    def _reuse_values(self, wf: Workflow, stage: str, done: frozenset[str], paths: TaskPaths,
                      g: float) -> tuple[tuple[str, float], ...]:
        children = self.paths.released(wf, stage, done)
        if not children:
            return ()
        imm = paths.imminence(stage, self.horizon_s)
        if imm <= 0.0:
            return ()
        out: list[tuple[str, float]] = []
        for child in children:
            agent = wf.stage(child).agent
            # Lookahead only keeps a prefix or swaps it in: a speculative recompute would stall
            # the whole batch (prefill runs before decode).
            if agent not in self.gpu and (agent not in self.prefix or not self.load(agent)[1]):
                continue
            tokens = self.tokens.get(agent, wf.prefix_tokens(agent))
            out.append((agent, g * imm * reload_cost(tokens, self.snap.profile)))
        return tuple(out)

    def running_reuse(self, req: RequestView) -> tuple[tuple[str, float], ...]:
        """`reuse` of a running request. A task not valued yet in this decision is not valued
        for it: its weight and path matrix suffice (most such tasks are touched only here)."""
        if req.task_id in self.tasks:
            return self.reuse(self._running_item(req))
        wf = self.snap.workflows.get(req.workflow) if req.workflow is not None else None
        if wf is None or not wf.has_stage(req.stage):
            return ()
        view = self.views.get(req.task_id)
        if not self.paths.released(wf, req.stage, view.done_stages if view is not None else _EMPTY):
            return ()  # nothing to look ahead to: the task need not be valued for it
        state = self._task_state(req)
        if state.paths is None or req.stage not in state.paths.index:
            return ()
        return self._reuse_values(state.wf, req.stage, state.done, state.paths, state.g)

    # ------------------------------------------------------------------ running requests
    def running_items(self, agent: str) -> list[Item]:
        """Items of the running requests of `agent` (built on first use)."""
        hit = self._running.get(agent)
        if hit is None:
            hit = self._running[agent] = [self._running_item(r) for r in self.running_reqs.get(agent, ())]
        return hit

    def _running_item(self, req: RequestView) -> Item:
        task = self.task(req)
        return next(it for it in task.running if it.req.rid == req.rid)

    def waiting_by_rid(self) -> dict[str, RequestView]:
        """The waiting requests by rid (built once per decision: each rival looks up its admits)."""
        if self._by_rid is None:
            self._by_rid = {r.rid: r for r in self.snap.waiting}
        return self._by_rid

    # ------------------------------------------------------------------ candidates
    def candidates(self, agent: str) -> list[Item]:
        """Waiting requests of `agent`, best age-weighted progress per KV token first."""
        hit = self._cands.get(agent)
        if hit is not None:
            return hit
        items = []
        kv_exp = self.cfg.kv_exp
        cached = self.caches.items
        valued = self.tasks
        for req in self.waiting.get(agent, ()):
            task = valued.get(req.task_id) or self.task(req)  # inlined hit: the hot loop
            item = cached.get(req.rid)
            if item is not None and item.req is req and item.task is task:
                item.reuse = None  # its gain is unchanged (same view, same task state)
            else:
                item = cached[req.rid] = self.item(req, task)
                base = task.base
                if item.col >= 0:
                    if base:
                        item.gain = task.progress(base | {item.red}) - task.progress(base)
                    else:
                        item.gain = task.progress1(item.col, item.delta)
                else:
                    item.gain = item.delta
            # priority(), inlined at the default kv_exp 0: this loop runs per waiting request
            item.prio = priority(task.g, item.gain, req.kv_tokens, kv_exp) if kv_exp else task.g * item.gain
            items.append(item)
        items.sort(key=_candidate_order)
        for i, it in enumerate(items):
            it.order = i
        self._cands[agent] = items
        return items

    def min_kv(self, agent: str) -> int:
        """Smallest KV claim among `agent`'s first `MIN_KV_SCAN` candidates (the fill ends when
        no request that small fits); the lists are sorted by priority, not size, so this is a
        cheap bound, exact on uniform sizes. 0 for an empty list."""
        hit = self._min_kv.get(agent)
        if hit is None:
            items = self.candidates(agent)
            hit = self._min_kv[agent] = min((it.req.kv_tokens for it in items[:MIN_KV_SCAN]), default=0)
        return hit

    def item(self, req: RequestView, task: TaskCtx) -> Item:
        col = -1
        if task.paths is not None:
            col = task.paths.index.get(req.stage, -1)
        return Item(req, task, col, min(self.remaining(req), self.horizon_s))

    def remaining(self, req: RequestView) -> float:
        hit = self.caches.remaining.get(req.rid)
        # engines reuse the view object of an unchanged request: identity validates the entry
        if hit is not None and hit.view is req:
            return hit.seconds
        remaining = remaining_service_s(req, self.snap)
        self.caches.remaining[req.rid] = Remaining(req, remaining)
        return remaining

    def _paths(self, task_id: str, view: TaskView | None, model: WorkflowModel, done: frozenset[str]) -> TaskPaths:
        """The task's path matrix, reused while its state is unchanged: same view object (engines
        cache views of unchanged tasks), or same done set and attained service on the grid."""
        memo = self.caches.task_memo.get(task_id)
        if memo is not None and memo.view is view and memo.model is model and memo.quantum_s == self.quantum_s:
            return memo.paths
        active = view.active_stages if view is not None else ()
        if active:  # attained service on a grid: running tasks keep their cache entry
            q = self.quantum_s
            active = tuple((st, (e // q) * q) for st, e in active)
        if memo is not None and memo.model is model and memo.done == done and memo.active == active:
            paths = memo.paths
        else:
            paths = self.paths.task(model, done, dict(active))
        self.caches.task_memo[task_id] = TaskMemo(view, model, done, active, paths, self.quantum_s)
        return paths

    def demand(self, agent: str) -> float:
        """Cheap ranking proxy for adding an agent: aging of its oldest task x its queue."""
        age = self.snap.now - self.oldest.get(agent, self.snap.now)
        return aging(age, self.age_scale_s, max(self.cfg.rho, 1.0)) * min(len(self.waiting.get(agent, ())), _DEMAND_QUEUE_CAP)

    def _task_state(self, req: RequestView) -> TaskState:
        """What the task of `req` is valued from (shared by `task` and `running_reuse`)."""
        snap = self.snap
        view = self.views.get(req.task_id)
        arrival = view.arrival_s if view is not None else req.task_arrival_s
        wf = snap.workflows.get(req.workflow) if req.workflow is not None else None
        model = paths = None
        done: frozenset[str] = _EMPTY
        task = self.caches.tasks.get(req.task_id)
        if wf is not None and wf.has_stage(req.stage):
            done = view.done_stages if view is not None else _EMPTY
            model = self._model(wf)
            if task is not None and view is not None and task.view is view and task.model is model \
                    and task.horizon_s == self.horizon_s:
                paths = task.paths  # what _paths would return: its memo holds this view
            else:
                paths = self._paths(req.task_id, view, model, done)
        else:
            wf = None
        work = paths.work if paths is not None else self.remaining(req)
        return TaskState(view, wf, model, paths, done, self._weight(arrival, work), task)

    def _model(self, wf: Workflow) -> WorkflowModel:
        """The workflow's model in this decision (built once per decision and workflow)."""
        model = self.models.get(wf.name)
        if model is None:
            model = self.models[wf.name] = self.paths.model(wf, self.snap.profile)
        return model

    def _weight(self, arrival_s: float, work: float) -> float:
        """A task's weight g: log aging since `arrival_s` x the size weight of its remaining
        `work` (SRPT-like: smaller remaining work, larger weight)."""
        g = aging(self.snap.now - arrival_s, self.age_scale_s, self.cfg.rho)
        if self.cfg.size_weight > 0.0:
            g *= (self.age_scale_s / max(work, 1e-3 * self.age_scale_s)) ** self.cfg.size_weight
        return g

    def _carried_idle(self, req: RequestView) -> TaskCtx | None:
        """The previous decision's TaskCtx of an idle task (nothing of it running, now or
        then) whose view object is unchanged, its weight refreshed; None otherwise. What
        `task` would do for it, without rebuilding its state: the same view, model and
        horizon select the same path matrix (`_task_state`), and no running request means
        the same (empty) running key. Most waiting tasks are such tasks, every decision."""
        task = self.caches.tasks.get(req.task_id)
        if task is None or task.running_key or task.paths is None or task.horizon_s != self.horizon_s \
                or req.task_id in self.running_by_task:
            return None
        view = self.views.get(req.task_id)
        wf = task.wf
        if view is None or task.view is not view or req.workflow != wf.name \
                or self.snap.workflows.get(req.workflow) is not wf or not wf.has_stage(req.stage):
            return None
        if task.model is not self._model(wf):
            return None
        task.g = self._weight(view.arrival_s, task.paths.work)
        task._run_value = None
        self.tasks[req.task_id] = task
        return task

    def task(self, req: RequestView) -> TaskCtx:
        """The task of `req` (valued once per decision). The TaskCtx of the previous decision
        is carried over, with only its weight refreshed, while its path matrix (same object),
        the horizon and its running requests' (rid, delta, pinned) are unchanged: its base,
        running items (their views updated) and its waiting items' gains then still hold."""
        task = self.tasks.get(req.task_id)
        if task is not None:
            return task
        task = self._carried_idle(req)
        if task is not None:
            return task
        view, wf, model, paths, done, g, task = self._task_state(req)
        running = tuple(self.running_by_task.get(req.task_id, ()))
        horizon = self.horizon_s
        running_key = tuple(_running_key(r, min(self.remaining(r), horizon), horizon, wf) for r in running)
        if task is not None and task.paths is paths and task.wf is wf and task.horizon_s == horizon \
                and task.running_key == running_key:
            task.g = g
            task._run_value = None
            task.view = view
            task.model = model  # a refreshed model that left its path matrix as it was
            for item, r in zip(task.running, running, strict=True):
                item.req = r  # same request, same (delta, pinned): only its view moved on
                item.reuse = None  # depends on this decision's resident set
            self.tasks[req.task_id] = task
            return task
        task = self.tasks[req.task_id] = TaskCtx(req.task_id, g, paths, wf, done, self.cfg.work_floor,
                                                 horizon_s=horizon, running_key=running_key,
                                                 view=view, model=model)
        self.caches.tasks[req.task_id] = task
        for r, (_, _delta, pinned) in zip(running, running_key, strict=True):
            item = self.item(r, task)
            item.pinned = pinned
            task.running.append(item)
            if item.col >= 0:
                task.base = task.base | {item.red}
        return task


def _candidate_order(it: Item) -> tuple[float, float, float, str]:
    """Best priority first; ties by task arrival, request arrival, then rid."""
    req = it.req
    return -it.prio, req.task_arrival_s, req.arrival_s, req.rid


def _running_key(req: RequestView, delta: float, horizon_s: float, wf: Workflow | None) -> tuple[str, float, bool]:
    """What a running request contributes to its task's valuation: (rid, delta, pinned).
    Pinned: it may finish within the interval (its KV frees itself soon, and preempting it
    wastes all its work): its remaining service is under the horizon, or it has generated at
    least the stage's smallest declared output (it may stop at any token)."""
    if delta < horizon_s:
        return req.rid, delta, True
    pinned = wf is not None and wf.has_stage(req.stage) and req.generated + 1 >= wf.stage(req.stage).output_tokens.lo
    return req.rid, delta, pinned
