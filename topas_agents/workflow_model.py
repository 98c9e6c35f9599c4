"""The workflow model: a DAG of stages, each run by an agent with a static prompt prefix
(frozen records; parsing and limits are in `workflow_parse`, loading in `workflow`)."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from .errors import WorkflowError


@dataclass(frozen=True, slots=True)
class IntRange:
    """Inclusive integer range; `lo == hi` is a fixed value."""

    lo: int
    hi: int

    @property
    def mean(self) -> float:
        return (self.lo + self.hi) / 2

    def sample(self, rng: random.Random) -> int:
        return self.lo if self.lo == self.hi else rng.randint(self.lo, self.hi)


@dataclass(frozen=True, slots=True)
class AgentSpec:
    name: str
    prefix_tokens: int


@dataclass(frozen=True, slots=True)
class StageSpec:
    name: str
    agent: str
    after: tuple[str, ...]
    requests: IntRange
    input_tokens: IntRange
    output_tokens: IntRange
    tool_wait_s: float = 0.0


@dataclass(frozen=True)
class Workflow:
    """A validated workflow DAG. Construct through `parse_workflow` / `load_workflow`."""

    name: str
    agents: tuple[AgentSpec, ...]
    stages: tuple[StageSpec, ...]
    # Default operating points for `topas bench` (offered load, fraction of capacity).
    loads: tuple[float, ...] = (0.3, 0.6, 0.9)
    description: str = ""
    _by_stage: dict[str, StageSpec] = field(init=False, repr=False, compare=False)
    _by_agent: dict[str, AgentSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_stage", {s.name: s for s in self.stages})
        object.__setattr__(self, "_by_agent", {a.name: a for a in self.agents})

    def stage(self, name: str) -> StageSpec:
        return self._by_stage[name]

    def agent(self, name: str) -> AgentSpec:
        return self._by_agent[name]

    def has_stage(self, name: str) -> bool:
        return name in self._by_stage

    def has_agent(self, name: str) -> bool:
        return name in self._by_agent

    @cached_property
    def topo_order(self) -> tuple[str, ...]:
        """Stages in a deterministic topological order (declaration order breaks ties)."""
        return _topo_sort(self.stages)

    @cached_property
    def successors(self) -> Mapping[str, tuple[str, ...]]:
        succ: dict[str, list[str]] = {s.name: [] for s in self.stages}
        for s in self.stages:
            for dep in s.after:
                succ[dep].append(s.name)
        return {k: tuple(v) for k, v in succ.items()}

    @cached_property
    def roots(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages if not s.after)

    @cached_property
    def depth(self) -> Mapping[str, int]:
        """Longest number of edges from any root (roots are depth 0)."""
        depth: dict[str, int] = {}
        for name in self.topo_order:
            st = self._by_stage[name]
            depth[name] = 1 + max((depth[d] for d in st.after), default=-1)
        return depth

    def prefix_tokens(self, agent: str) -> int:
        return self._by_agent[agent].prefix_tokens

    def ready_stages(self, done: frozenset[str] | set[str]) -> tuple[str, ...]:
        """Stages not done whose predecessors are all done."""
        return tuple(
            s.name for s in self.stages if s.name not in done and all(d in done for d in s.after)
        )


# ---------------------------------------------------------------------------- parsing


def _one_cycle(stages: Sequence[StageSpec], index: Mapping[str, int], pending: Sequence[bool]) -> list[str]:
    """One actual cycle among the stages the sort could not order, in dependency order, its
    first stage repeated at the end. Every such stage waits on another such stage, so walking
    back through `after` must come round (the error listed every stage left, sorted by name:
    stages downstream of a cycle, and not always the cycle's own)."""
    at = next(i for i, p in enumerate(pending) if p)
    seen: dict[int, int] = {}
    walk: list[int] = []
    while at not in seen:
        seen[at] = len(walk)
        walk.append(at)
        at = next(index[d] for d in stages[at].after if pending[index[d]])
    loop = walk[seen[at]:]
    return [_clip(stages[i].name) for i in reversed(loop)] + [_clip(stages[loop[-1]].name)]


def _topo_sort(stages: tuple[StageSpec, ...]) -> tuple[str, ...]:
    """Kahn's algorithm, O(stages + edges). The order is by depth (longest path from a root),
    then declaration order: the same order as the former level-by-level passes."""
    index = {s.name: i for i, s in enumerate(stages)}
    indegree = [len(s.after) for s in stages]
    succ: list[list[int]] = [[] for _ in stages]
    for i, s in enumerate(stages):
        for dep in s.after:
            succ[index[dep]].append(i)
    depth = [0] * len(stages)
    queue = [i for i, d in enumerate(indegree) if d == 0]
    for i in queue:  # the list grows while iterating: a FIFO without pops
        for j in succ[i]:
            depth[j] = max(depth[j], depth[i] + 1)
            indegree[j] -= 1
            if indegree[j] == 0:
                queue.append(j)
    if len(queue) != len(stages):
        cycle = _one_cycle(stages, index, [d > 0 for d in indegree])
        shown = cycle if len(cycle) <= 12 else [*cycle[:6], "...", *cycle[-6:]]
        raise WorkflowError(f"stages: dependency cycle {' -> '.join(shown)}")
    return tuple(stages[i].name for i in sorted(range(len(stages)), key=lambda i: (depth[i], i)))


_SURROGATE = re.compile("[\ud800-\udfff]")


def _clip(text: str) -> str:
    """User text in a message: surrogates replaced, at most 80 characters."""
    text = _SURROGATE.sub("?", text)
    return text if len(text) <= 80 else text[:77] + "..."
