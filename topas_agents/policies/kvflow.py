"""KVFlow (Pan et al., NeurIPS'25, arXiv 2507.07400) as a policy on the Snapshot/Decision boundary.

KVFlow is workflow-aware KV-cache *management* on top of SGLang's hierarchical radix cache;
it leaves SGLang's request order alone. Its three mechanisms, and how they map here:

1. **Agent Step Graph, steps-to-execution.** Each agent gets a value estimating how many
   workflow steps remain before it is invoked; with many concurrent workflows an agent's
   value is the minimum over them. Here, per live task (`snap.tasks`), a stage that is
   active (a request running/waiting or a tool wait between rounds) or ready is 0 steps
   away, and a stage not yet ready is `1 + max(steps of its unfinished predecessors)` (it
   waits for all of them). Agents of stages that future tasks will run count with
   `1 + depth(stage)` (tasks keep arriving at the roots). Agents with waiting or running
   requests are 0. An agent nobody will use is infinitely far.
2. **Workflow-aware eviction.** Instead of LRU, GPU prefixes are evicted largest
   steps-to-execution first (ties: LRU, then name). A prefix used by a running or
   just-admitted request is pinned, as in every engine. A prefix whose agent has waiting
   requests (0 steps) goes last: KVFlow gives it the highest keep priority; it is evicted
   only when nothing farther away is left, because refusing outright could deadlock a
   queue whose head cannot fit beside the other waiting agents' prefixes.
3. **Overlapped prefetch, status-aware scheduling.** Prefixes of agents 1 step away whose
   KV sits in the host tier (`PrefixView.location == "cpu"`) are loaded proactively with
   `Decision.prefix_in`, into KV nobody waiting can use (only when the admission walk did
   not block, and evicting only prefixes farther away than the one loaded). A request whose
   prefix is still `loading` is skipped, not admitted (its KV reservation would idle while
   the transfer runs); a request whose prefix is in the host tier gets its load started
   (`prefix_in`) and is skipped until it lands: KVFlow's scheduler only runs requests whose
   cache is ready. With no host tier nothing is ever `cpu` (evicted prefixes are dropped),
   so KVFlow degrades to LPM with steps-to-execution eviction, as KVFlow itself does on a
   GPU-only cache (its prefetch reads the CPU tier only; prefix_in of a dropped prefix would
   mean a recompute, which KVFlow never issues ahead of time).

Admission is stock SGLang: LPM order (`baselines.LPM`, same incremental queue), greedy,
head-of-line blocking (`greedy.KVLedger`). What is not modelled: KV-node granularity
(radix-tree partial matches; prefixes here are whole per-agent units) and KVFlow's
LoRA-adapter prefetch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from ..snapshot import NOOP, Decision, RequestView, Snapshot, TaskView
from ..workflow import Workflow
from .baselines import LPM
from .greedy import KVLedger

FAR = math.inf  # steps-to-execution of an agent no live or future task will use


def task_stage_steps(wf: Workflow, task: TaskView) -> dict[str, float]:
    """Steps until each unfinished stage of `task` runs: 0 if active or ready, else 1 + max(preds)."""
    done = task.done_stages
    active = {name for name, _ in task.active_stages}
    steps: dict[str, float] = {}
    for name in wf.topo_order:
        if name in done:
            continue
        preds = [steps[p] for p in wf.stage(name).after if p not in done]
        steps[name] = 0.0 if name in active or not preds else 1.0 + max(preds)
    return steps


def steps_to_execution(snap: Snapshot) -> dict[str, float]:
    """Each agent's steps-to-execution (module docstring, item 1); agents absent are FAR."""
    steps: dict[str, float] = {}

    def note(agent: str, value: float) -> None:
        if value < steps.get(agent, FAR):
            steps[agent] = value

    for wf in snap.workflows.values():  # future tasks enter at the roots
        for st in wf.stages:
            note(st.agent, 1.0 + wf.depth[st.name])
    for task in snap.tasks:
        wf = snap.workflows.get(task.workflow) if task.workflow is not None else None
        if wf is None:
            continue
        for name, value in task_stage_steps(wf, task).items():
            note(wf.stage(name).agent, value)
    for r in (*snap.running, *snap.waiting):
        steps[r.agent] = 0.0
    return steps


class KVFlow(LPM):
    """LPM admission with KVFlow's eviction order, prefetch and load-skipping (module docstring)."""

    name = "kvflow"

    def __init__(self) -> None:
        super().__init__()
        self.last_steps: Mapping[str, float] = {}  # the values of the latest decision (tests, debugging)

    def decide(self, snap: Snapshot) -> Decision:
        self._queue.sync(snap.waiting, self.group_values(snap), self.default)
        steps = self.last_steps = steps_to_execution(snap)
        if not snap.waiting and not _prefetchable(snap, steps):
            return NOOP
        ledger = _StepLedger(snap, steps)
        blocked = self._admit(ledger, self._queue)
        if not blocked:
            self._prefetch(ledger, snap, steps)
        self._queue.note_admitted(ledger.admitted)
        return ledger.decision(prefix_in=tuple(ledger.loads))

    @staticmethod
    def _admit(ledger: _StepLedger, order: Iterable[RequestView]) -> bool:
        """Greedy walk in LPM order; True if it stopped at a request that does not fit."""
        for r in order:
            where = ledger.location.get(r.agent, "none")
            if where == "loading" or r.agent in ledger.loads:
                continue  # status-aware: wait until the cache has landed
            if where == "cpu":
                if not ledger.try_load(r.agent, farther_than=-1.0):
                    return True
                continue
            if not ledger.try_admit(r):
                return True
        return False

    @staticmethod
    def _prefetch(ledger: _StepLedger, snap: Snapshot, steps: Mapping[str, float]) -> None:
        """Load next-step agents' host-tier prefixes into KV nobody waiting can use."""
        for agent in sorted(_prefetchable(snap, steps)):
            ledger.try_load(agent, farther_than=steps[agent])

    def __repr__(self) -> str:
        return "KVFlow()"


def _prefetchable(snap: Snapshot, steps: Mapping[str, float]) -> set[str]:
    return {p.agent for p in snap.prefixes if p.location == "cpu" and steps.get(p.agent, FAR) == 1.0}


class _StepLedger(KVLedger):
    """KVLedger whose eviction order is steps-to-execution (farthest first), plus proactive loads."""

    def __init__(self, snap: Snapshot, steps: Mapping[str, float]) -> None:
        super().__init__(snap)
        last = {p.agent: p.last_used_s for p in snap.prefixes}
        self.steps = steps
        self.lru = sorted(self.lru, key=lambda a: (-steps.get(a, FAR), last[a], a))
        self.location = {p.agent: p.location for p in snap.prefixes}
        self.loads: list[str] = []

    def try_load(self, agent: str, *, farther_than: float) -> bool:
        """Start loading `agent`'s host-tier prefix, evicting only prefixes more than `farther_than` steps away."""
        need = self.tokens[agent]
        short = need - self.free
        victims: list[str] = []
        for other in self.lru:
            if short <= 0:
                break
            if other == agent or other in self.pinned or other not in self.on_gpu:
                continue
            if self.steps.get(other, FAR) <= farther_than:
                break  # the rest are at least as close as what we would load
            victims.append(other)
            short -= self.tokens[other]
        if short > 0:
            return False
        for other in victims:
            self.evict(other)
        self.free -= need
        self.on_gpu.add(agent)
        self.pinned.add(agent)  # not evicted again by this decision
        self.loads.append(agent)
        return True
