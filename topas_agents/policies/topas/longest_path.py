"""L_i = E[LP(G_i, Z_i)]: expected longest remaining LLM-service path of a task.

The expectation is taken OUTSIDE the longest path (E[max], not max of means). The sources of
a task's remaining DAG are exactly its ready stages (a stage is ready once all predecessors
are done), and every descendant of a source has not started, so its service is unconditioned.
Hence, per sample k:

    LP_k = max over sources j of F[k, j],   F[k, j] = Z_j[k] + Tail_j[k]
    Tail_j = max over successors c of (X_c + Tail_c)     (reverse topological order)

`Tail_j` depends only on the workflow and the stage distributions, so it is computed once per
workflow (per distribution epoch); only the residual source columns Z_j = X_j - e_j | X_j > e_j
are per task. Serving source j for delta seconds lowers F[:, j] by min(delta, Z_j), exactly,
so the gain of any set of admitted requests of one task (sequential marginals included) is a
cheap operation on a (samples x sources) matrix.

Exactness: a task with a single source whose tail is a simple chain (every chain workflow, and
a DAG after its last fork) uses exact means (sum of means, E[min(delta, Z)] over the exact
residual support); with only point masses all samples coincide and one row is used. Otherwise
the estimate uses the fixed sample budget with common random numbers (error: docs/topas.md).
"""

from __future__ import annotations

import numpy as np

from ...costmodel import Profile
from ...workflow import Workflow
from .profiles import ServiceProfiles, StageDist
from .terms import imminence, released_children

# Task path matrices kept across decisions (LRU), trimmed at each decision to this many per
# live task plus a floor. Entries are exact (keyed by the task state), so the bound only trades
# hits for memory: a state another task shares (a fresh workflow, a done set on the same grid)
# stays while it is in use, and the rest is garbage the collector would otherwise walk at every
# full collection (measured: 8192 matrices and their gain memos held two thirds of the objects
# of an H200 decision-cost run, and each full collection took about 100 ms).
_TASK_CACHE_PER_LIVE = 2
_TASK_CACHE_FLOOR = 256
# The ready-set and released-children memos (workflow structure) are cleared past this size.
_READY_CACHE = 4096
# A path matrix's gain memo is cleared past this many entries: a task with a running request
# near its end is asked for new reductions every decision, and they would pile up.
_GAIN_MEMO_CAP = 128


class WorkflowModel:
    """Per-workflow sample tails, rebuilt when any of its stage distributions changes."""

    __slots__ = ("wf", "dists", "point", "tail", "tail_mean", "tail_chain", "version", "_live")

    def __init__(self, wf: Workflow, dists: dict[str, StageDist], version: tuple[int, ...]) -> None:
        self.wf = wf
        self.dists = dists
        self.version = version
        self._live: dict[frozenset[str], tuple[int, ...]] = {}
        self.point = all(d.point for d in dists.values())
        rows = 1 if self.point else len(next(iter(dists.values())).column)
        self.tail: dict[str, np.ndarray] = {}
        self.tail_mean: dict[str, float] = {}
        self.tail_chain: dict[str, bool] = {}
        through: dict[str, np.ndarray] = {}  # X_s + Tail_s
        for name in reversed(wf.topo_order):
            succ = wf.successors[name]
            if not succ:
                tail = np.zeros(rows)
            elif len(succ) == 1:
                tail = through[succ[0]]
            else:
                tail = np.max(np.stack([through[c] for c in succ]), axis=0)
            self.tail[name] = tail
            through[name] = dists[name].column[:rows] + tail
            chain = len(succ) == 0 or (len(succ) == 1 and self.tail_chain[succ[0]])
            self.tail_chain[name] = chain
            if chain and succ:
                c = succ[0]
                self.tail_mean[name] = dists[c].mean + self.tail_mean[c]
            else:
                self.tail_mean[name] = float(tail.mean()) if succ else 0.0

    def live_version(self, done: frozenset[str]) -> tuple[int, ...]:
        """The distribution serials of the stages not in `done`. A task's path matrix depends
        only on those stages (its sources and their descendants; every stage not done is one)
        and on `point`, so it survives a refresh of a stage the task has finished."""
        hit = self._live.get(done)
        if hit is None:
            hit = self._live[done] = tuple(d.serial for s, d in self.dists.items() if s not in done)
        return hit


class TaskPaths:
    """One task state's source matrix; `gain(reductions)` = L - E[LP after serving them]."""

    __slots__ = ("sources", "index", "expected_path", "work", "support", "_exact", "_support", "_Z", "_F", "_memo",
                 "_imminence")

    def __init__(self, model: WorkflowModel, sources: tuple[tuple[str, float], ...],
                 done: frozenset[str] = frozenset()) -> None:
        self.sources = tuple(s for s, _ in sources)
        self.index = {s: j for j, s in enumerate(self.sources)}
        self._memo: dict = {}  # frozenset of reductions (or one (j, delta)) -> gain
        self._imminence: dict[tuple[str, float], float] = {}  # (source, horizon) -> probability
        self.support: dict[str, np.ndarray] = {}  # residual support of each source (sorted)
        # W: expected remaining LLM work (every remaining stage, sources at their residual)
        self.work = sum(d.mean for s, d in model.dists.items() if s not in done and s not in self.index)
        rows = 1 if model.point else None
        if len(sources) == 1 and model.tail_chain[sources[0][0]]:
            stage, attained = sources[0]
            support, mean, _ = model.dists[stage].residual(attained)
            self.support[stage] = support
            self._exact = True
            self._support = support
            self._Z = self._F = None
            self.expected_path = mean + model.tail_mean[stage]
            self.work += mean
            return
        self._exact = False
        self._support = None
        cols_z, cols_f = [], []
        for stage, attained in sources:
            support, mean, col = model.dists[stage].residual(attained)
            self.support[stage] = support
            self.work += mean
            col = col[:rows] if rows else col
            cols_z.append(col)
            cols_f.append(col + model.tail[stage])
        self._Z = np.column_stack(cols_z)
        self._F = np.column_stack(cols_f)
        self.expected_path = float(self._F.max(axis=1).mean())

    def imminence(self, stage: str, horizon_s: float) -> float:
        """Probability that source `stage` finishes within `horizon_s` (memoised)."""
        key = (stage, horizon_s)
        hit = self._imminence.get(key)
        if hit is None:
            hit = self._imminence[key] = imminence(self.support[stage], horizon_s)
        return hit

    def gain1(self, j: int, delta: float) -> float:
        """`gain` of one reduction, memoised by (j, delta)."""
        key = (j, delta)
        hit = self._memo.get(key)
        if hit is None:
            if self._exact and len(self._support) == 1:
                hit = min(delta, float(self._support[0]))
            else:
                hit = self._compute((key,))
            self._remember(key, hit)
        return hit

    def gain(self, reductions: frozenset[tuple[int, float]]) -> float:
        """Expected reduction of L when source j receives delta seconds, for each (j, delta)."""
        if not reductions:
            return 0.0
        hit = self._memo.get(reductions)
        if hit is not None:
            return hit
        value = self._compute(reductions)
        self._remember(reductions, value)
        return value

    def _compute(self, reductions) -> float:
        if self._exact:
            delta = sum(d for _, d in reductions)  # a single source: all reductions hit it
            value = float(np.minimum(delta, self._support).mean())
        else:
            F = self._F.copy()
            for j, delta in reductions:
                F[:, j] -= np.minimum(delta, self._Z[:, j])
            value = self.expected_path - float(F.max(axis=1).mean())
        return max(0.0, value)

    def _remember(self, key, value: float) -> None:
        if len(self._memo) >= _GAIN_MEMO_CAP:
            self._memo.clear()
        self._memo[key] = value


class PathEstimator:
    """Caches workflow models and task path matrices across decisions (keyed by task state)."""

    def __init__(self, profiles: ServiceProfiles) -> None:
        self._profiles = profiles
        self._models: dict[str, WorkflowModel] = {}
        self._tasks: dict[tuple, TaskPaths] = {}  # insertion order = recency of last use
        self._ready: dict[tuple[str, frozenset[str]], tuple[str, ...]] = {}
        # (workflow name, stage, done) -> (workflow, stages released when the stage completes)
        self._released: dict[tuple[str, str, frozenset[str]], tuple[Workflow, tuple[str, ...]]] = {}

    def begin(self, live_tasks: int) -> None:
        """Start a decision with `live_tasks` tasks in the engine: trim the task cache to its
        capacity (least recently used first, a quarter below it so trims are rare)."""
        capacity = _TASK_CACHE_PER_LIVE * live_tasks + _TASK_CACHE_FLOOR
        excess = len(self._tasks) - capacity
        if excess > 0:
            for key in list(self._tasks)[: excess + capacity // 4]:
                del self._tasks[key]

    def model(self, wf: Workflow, profile: Profile) -> WorkflowModel:
        dists = {s.name: self._profiles.dist(wf, s.name, profile) for s in wf.stages}
        version = tuple(d.serial for d in dists.values())
        model = self._models.get(wf.name)
        if model is None or model.version != version or model.wf is not wf:
            model = self._models[wf.name] = WorkflowModel(wf, dists, version)
        return model

    def released(self, wf: Workflow, stage: str, done: frozenset[str]) -> tuple[str, ...]:
        """`released_children` of the stage, memoised like the ready sets (a running stage
        asks at every decision until it ends; the workflow object validates the entry)."""
        key = (wf.name, stage, done)
        hit = self._released.get(key)
        if hit is None or hit[0] is not wf:
            if len(self._released) > _READY_CACHE:
                self._released.clear()
            hit = self._released[key] = (wf, released_children(wf, stage, done))
        return hit[1]

    def task(self, model: WorkflowModel, done: frozenset[str], attained: dict[str, float]) -> TaskPaths:
        """Paths of a task whose `done` stages finished; `attained` = active stages' service."""
        rkey = (model.wf.name, done)
        ready = self._ready.get(rkey)
        if ready is None:
            if len(self._ready) > _READY_CACHE:
                self._ready.clear()
            ready = self._ready[rkey] = model.wf.ready_stages(done)
        sources = tuple((s, attained.get(s, 0.0)) for s in ready)
        key = (model.wf.name, model.point, model.live_version(done), done, sources)
        paths = self._tasks.pop(key, None)
        if paths is None:
            paths = TaskPaths(model, sources, done)
        self._tasks[key] = paths
        return paths
