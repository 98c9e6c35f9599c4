"""Baseline policies: order the waiting queue by a key, admit greedily, evict prefixes LRU.

None of them preempts or loads prefixes proactively; residency is whatever LRU eviction
leaves, as in a stock engine. Every key ends with the request id, so orders are total and
runs deterministic.

| name   | order (smallest key first)                                                    |
|--------|-------------------------------------------------------------------------------|
| fcfs   | request arrival                                                               |
| lpm    | most prefix tokens already on GPU (or loading) first, then arrival; never     |
|        | falls back to FCFS (SGLang silently does above 128 waiting requests)          |
| parrot | task arrival, then request arrival (Parrot's application-level FCFS)          |
| las    | least attained task service (Autellix), then arrival                          |
| spf    | deepest workflow stage first (unlabelled = depth 0), then arrival             |

Peer (outside the paper's five; see `PEERS` in the registry):

| lpm-gated | LPM, except that a gated stage's requests go first while its gate is open   |
|           | (the paper's Diagnostic 2, section II / Fig. 1; `LPMGated` below)           |

The order is kept incrementally in a `SortedWaiting` (see greedy.py), so a decision costs
O(changes), not O(W log W): the same order as `sorted(snap.waiting, key=policy.sort_key(snap))`,
which the tests check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Literal

from ..errors import ConfigError
from ..snapshot import NOOP, Decision, RequestView, Snapshot
from .greedy import SortedWaiting, greedy_admit

_TASK_ID = attrgetter("task_id")
_ATTAINED = attrgetter("attained_s")


def _by_arrival(r: RequestView) -> tuple:
    return (r.arrival_s, r.rid)


class OrderedGreedy:
    """Greedy head-of-line admission in a key order; subclasses define the key."""

    name = "ordered"

    def __init__(self) -> None:
        self._queue = SortedWaiting(self.static_key, self.group_of(), self.default)

    # --- the order: (group value, *static key); override these
    def static_key(self, r: RequestView) -> tuple:
        return _by_arrival(r)

    def group_of(self) -> Callable[[RequestView], Hashable] | None:
        return None

    default = 0  # group value of a group missing from group_values()

    def group_values(self, snap: Snapshot) -> Mapping[Hashable, Any] | None:
        return None

    def sort_key(self, snap: Snapshot) -> Callable[[RequestView], tuple]:
        """The full order as a plain sort key (reference for tests and other engines)."""
        group_of, values = self.group_of(), self.group_values(snap) or {}
        if group_of is None:
            return lambda r: (self.default, *self.static_key(r))
        return lambda r: (values.get(group_of(r), self.default), *self.static_key(r))

    def decide(self, snap: Snapshot) -> Decision:
        self._queue.sync(snap.waiting, self.group_values(snap), self.default)
        if not snap.waiting:
            return NOOP
        decision = greedy_admit(snap, iter(self._queue))
        self._queue.note_admitted(decision.admit)
        return decision

    def note_applied(self, admitted: Sequence[str]) -> None:
        """When another policy decided (this one only proposed, see Topas's `rivals`): the
        requests that engine admitted instead of ours, so the next sync stays incremental."""
        self._queue.note_admitted(admitted)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FCFS(OrderedGreedy):
    name = "fcfs"


class LPM(OrderedGreedy):
    """Longest prefix match: requests whose agent prefix is on GPU (or loading) first."""

    name = "lpm"

    def group_of(self) -> Callable[[RequestView], Hashable] | None:
        return _agent

    def group_values(self, snap: Snapshot) -> Mapping[Hashable, Any] | None:
        return {p.agent: -p.tokens for p in snap.prefixes if p.on_gpu}


def task_fcfs_key(r: RequestView) -> tuple[float, float, str]:
    """Oldest task first, then oldest request (Parrot's order; Topas's EASY head and its
    work-conserving fallback use the same one)."""
    return (r.task_arrival_s, r.arrival_s, r.rid)


class ParrotFCFS(OrderedGreedy):
    name = "parrot"

    def static_key(self, r: RequestView) -> tuple:
        return task_fcfs_key(r)


class AutellixLAS(OrderedGreedy):
    """Least attained service of the request's task first (Autellix's PLAS)."""

    name = "las"

    def group_of(self) -> Callable[[RequestView], Hashable] | None:
        return _task

    default = 0.0

    def group_values(self, snap: Snapshot) -> Mapping[Hashable, Any] | None:
        tasks = snap.tasks
        return dict(zip(map(_TASK_ID, tasks), map(_ATTAINED, tasks), strict=True))


class SPF(OrderedGreedy):
    """Stage-position first: deeper stages (closer to finishing their task) first."""

    name = "spf"

    def __init__(self) -> None:
        self._depth: dict[tuple[str | None, str], int] = {}
        self._workflows: Any = {}
        super().__init__()

    def decide(self, snap: Snapshot) -> Decision:
        self._workflows = snap.workflows
        return super().decide(snap)

    def static_key(self, r: RequestView) -> tuple:
        return (-self._stage_depth(r), r.arrival_s, r.rid)

    def _stage_depth(self, r: RequestView) -> int:
        k = (r.workflow, r.stage)
        d = self._depth.get(k)
        if d is None:
            wf = self._workflows.get(r.workflow) if r.workflow is not None else None
            if wf is None:
                return 0  # unlabelled or unknown workflow (not cached: it may be registered later)
            d = self._depth[k] = wf.depth.get(r.stage, 0)
        return d


GateTarget = Literal["sink", "deepest"]


@dataclass(frozen=True, slots=True)
class GateConfig:
    """The downstream gate of `lpm-gated`; each default with its reason.

    threshold: waiting requests of a gated stage that open its gate. The paper gates C "once
      its backlog accumulates" without giving a number. 2 is the smallest backlog that is a
      batch (with 1, the gate is plain last-stage-first for single requests, i.e. SPF's churn
      on the exit stage). Measured on Chain-3 at 0.15 task/s (A100 profile, 10 seeds x 300
      tasks, host tier), mean JCT: LPM 53.8 s, SPF 78.3 s, gated with threshold 1: 49.7,
      2: 49.7, 3: 50.0, 4: 50.6, 6: 52.2; without a host tier LPM 56.5, SPF 80.3, gated
      52.9 / 52.9 / 53.0 / 53.5 / 54.8. Larger thresholds let LPM's entrance bias back in.
    target: which stages a gate guards. "sink": the workflow's exit stages (C in A->B->C; for a
      DAG, every stage without successors), the paper's gate. "deepest": per workflow, the
      deepest stage(s) that have waiting requests, a generalisation that also drains a join or
      a late stage when the exit has nothing waiting.
    The gate closes only when the stage's waiting backlog is empty (hysteresis), so an open
    gate serves the whole backlog as one batch behind one prefix rather than flapping.
    """

    threshold: int = 2
    target: GateTarget = "sink"

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int) or self.threshold < 1:
            raise ConfigError(f"lpm-gated threshold: expected an integer >= 1, got {self.threshold!r}")
        if self.target not in ("sink", "deepest"):
            raise ConfigError(f"lpm-gated target: expected 'sink' or 'deepest', got {self.target!r}")


_GATE = GateConfig()


class LPMGated(LPM):
    """LPM plus the paper's downstream gate (Diagnostic 2, section II, Fig. 1).

    LPM's locality feedback keeps service at the workflow entrance (continuous arrivals keep
    A's prefix resident and A's requests first). The gate is the paper's "coarse
    intervention": once a gated stage (GateConfig.target) has `threshold` requests waiting,
    its requests go before everything else (among them, LPM's order) until its backlog is
    empty. Admission, eviction and everything else are LPM's (greedy, head-of-line, LRU).

    The key is (group value, arrival, rid) with group (workflow, stage, agent) and value
    (0 if the stage's gate is open else 1, -cached prefix tokens of the agent), so the
    incremental queue re-keys only groups whose gate or residency changed.
    """

    name = "lpm-gated"

    def __init__(self, threshold: int = _GATE.threshold, target: GateTarget = _GATE.target) -> None:
        self.config = GateConfig(threshold, target)
        self._open: frozenset[tuple[str, str]] = frozenset()
        self._sinks: dict[str, frozenset[str]] = {}
        super().__init__()

    def group_of(self) -> Callable[[RequestView], Hashable] | None:
        return _workflow_stage_agent

    default = (1, 0)

    def group_values(self, snap: Snapshot) -> Mapping[Hashable, Any] | None:
        backlog = Counter(map(_workflow_stage_agent, snap.waiting))
        per_stage = Counter()
        for (wf, stage, _agent_name), n in backlog.items():
            if wf is not None:
                per_stage[wf, stage] += n
        self._open = self._update_gates(snap, per_stage)
        cached = {p.agent: -p.tokens for p in snap.prefixes if p.on_gpu}
        return {g: (0 if g[:2] in self._open else 1, cached.get(g[2], 0)) for g in backlog}

    def _update_gates(self, snap: Snapshot, per_stage: Counter) -> frozenset[tuple[str, str]]:
        """Open at `threshold` waiting, stay open until empty. Idempotent for one snapshot."""
        keep = {k for k in self._open if per_stage.get(k, 0) > 0}
        targets = self._targets(snap, per_stage)
        fresh = {k for k in targets if per_stage[k] >= self.config.threshold}
        return frozenset(keep | fresh)

    def _targets(self, snap: Snapshot, per_stage: Counter) -> set[tuple[str, str]]:
        if self.config.target == "sink":
            return {k for k in per_stage if k[1] in self._sinks_of(snap, k[0])}
        deepest: dict[str, int] = {}
        for wf_name, stage in per_stage:
            wf = snap.workflows.get(wf_name)
            if wf is not None and wf.has_stage(stage):
                deepest[wf_name] = max(deepest.get(wf_name, 0), wf.depth[stage])
        return {(w, s) for w, s in per_stage if deepest.get(w, 0) > 0
                and snap.workflows[w].depth.get(s) == deepest[w]}

    def _sinks_of(self, snap: Snapshot, wf_name: str) -> frozenset[str]:
        sinks = self._sinks.get(wf_name)
        if sinks is None:
            wf = snap.workflows.get(wf_name)
            if wf is None:
                return frozenset()  # unknown workflow: nothing to gate (not cached: may appear later)
            sinks = self._sinks[wf_name] = frozenset(  # a depth-0 sink is an entry: LPM favours it already
                s for s, succ in wf.successors.items() if not succ and wf.depth[s] > 0)
        return sinks

    def __repr__(self) -> str:
        return f"LPMGated(threshold={self.config.threshold}, target={self.config.target!r})"


def _workflow_stage_agent(r: RequestView) -> Hashable:
    return (r.workflow, r.stage, r.agent)


def _agent(r: RequestView) -> Hashable:
    return r.agent


def _task(r: RequestView) -> Hashable:
    return r.task_id
