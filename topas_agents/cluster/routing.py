"""Routers of the simulated cluster: which replica serves an LLM call.

- `task`: a task's calls all go to one replica, chosen least-loaded at its first call (smg's
  manual policy keyed by task id, assignment min_load: what `topas serve --replicas` runs).
- `agent`: an agent's calls all go to one replica, chosen least-loaded at its first call.
- `cache`: SGLang's cache-aware router, modelled at the prefix level: a replica whose
  approximate radix tree holds the call's agent prefix wins when the match ratio is above
  `cache_threshold`, unless the load is imbalanced (then the least-loaded replica); with no
  match, the replica with the smallest tree.
- `round-robin`: calls in turn.
- `least-load`: the replica with the fewest calls waiting or running.
- `group`: agent-group pinning sized by demand: each agent gets a group of replicas in
  proportion to its expected GPU work (from the workflow and the cost profile), and its
  calls go to the least-loaded replica of its group; light agents share replicas. Each
  replica then keeps few prefixes resident.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from ..costmodel import Profile
from ..errors import ConfigError
from ..workflow import Workflow

RouterName = Literal["task", "agent", "cache", "round-robin", "least-load", "group"]
ROUTERS: tuple[str, ...] = RouterName.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class CallInfo:
    """What a router sees of a call (what a gateway sees of a labelled request)."""

    task_id: str
    agent: str
    prefix_tokens: int
    input_tokens: int


@dataclass(frozen=True, slots=True)
class CacheAwareSettings:
    """SGLang router defaults (sglang-router / smg `--cache-threshold`, `--balance-*`)."""

    cache_threshold: float = 0.5  # least prefix-match ratio that routes by cache
    balance_abs_threshold: int = 64  # imbalance gate: max-min load above this ...
    balance_rel_threshold: float = 1.5  # ... and max above this multiple of min


class Router(Protocol):
    name: str

    def route(self, call: CallInfo, loads: Sequence[int]) -> int: ...


def _least(loads: Sequence[int]) -> int:
    return min(range(len(loads)), key=lambda i: (loads[i], i))


class Pinned:
    """Pins a key (task id or agent) to the least-loaded replica at its first call."""

    def __init__(self, key: Literal["task", "agent"]) -> None:
        self.name = key
        self._key = key
        self._pins: dict[str, int] = {}

    def route(self, call: CallInfo, loads: Sequence[int]) -> int:
        key = call.task_id if self._key == "task" else call.agent
        if key not in self._pins:
            self._pins[key] = _least(loads)
        return self._pins[key]

    def forget(self, task_id: str) -> None:
        """A finished task's key is dropped (smg evicts idle keys)."""
        if self._key == "task":
            self._pins.pop(task_id, None)


class RoundRobin:
    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def route(self, call: CallInfo, loads: Sequence[int]) -> int:
        i = self._next % len(loads)
        self._next += 1
        return i


class LeastLoad:
    name = "least-load"

    def route(self, call: CallInfo, loads: Sequence[int]) -> int:
        return _least(loads)


class CacheAware:
    name = "cache"

    def __init__(self, settings: CacheAwareSettings | None = None) -> None:
        self.s = settings or CacheAwareSettings()
        self._agents: list[set[str]] = []
        self._tree: list[int] = []  # tokens each replica's approximate tree has taken in

    def route(self, call: CallInfo, loads: Sequence[int]) -> int:
        if not self._tree:
            self._agents = [set() for _ in loads]
            self._tree = [0] * len(loads)
        hi, lo = max(loads), min(loads)
        if hi - lo > self.s.balance_abs_threshold and hi > self.s.balance_rel_threshold * lo:
            pick = _least(loads)
        else:
            total = call.prefix_tokens + call.input_tokens
            ratio = call.prefix_tokens / total if total else 0.0
            holders = [i for i, agents in enumerate(self._agents) if call.agent in agents]
            if holders and ratio > self.s.cache_threshold:
                pick = min(holders, key=lambda i: (loads[i], i))
            else:
                pick = min(range(len(loads)), key=lambda i: (self._tree[i], i))
        if call.agent not in self._agents[pick]:
            self._agents[pick].add(call.agent)
            self._tree[pick] += call.prefix_tokens
        self._tree[pick] += call.input_tokens
        return pick


def agent_demand(workflows: Sequence[Workflow], profile: Profile) -> dict[str, float]:
    """Expected batch-1 GPU seconds per task for each agent (mean sizes, prefix cached)."""
    demand: dict[str, float] = {}
    for wf in workflows:
        for st in wf.stages:
            one = profile.request_service_s(wf.prefix_tokens(st.agent), int(st.input_tokens.mean),
                                            max(1, int(st.output_tokens.mean)))
            demand[st.agent] = demand.get(st.agent, 0.0) + st.requests.mean * one
    return demand


def group_replicas(demand: Mapping[str, float], replicas: int) -> dict[str, tuple[int, ...]]:
    """Agent -> its replicas. Each agent gets `max(1, round(N x its demand share))` replicas
    (replicas rounding leaves idle go to the agents with the most demand per replica), placed
    heaviest agent first on the replicas with the least demand assigned so far: light agents
    share replicas and a heavy one spans several."""
    total = sum(demand.values()) or 1.0
    order = sorted(demand, key=lambda a: (-demand[a], a))
    sizes = {a: min(replicas, max(1, round(replicas * demand[a] / total))) for a in order}
    while sum(sizes.values()) < replicas:  # rounding left replicas idle: the busiest per replica gets one
        a = max(order, key=lambda a: demand[a] / sizes[a])
        sizes[a] += 1
    assigned = [0.0] * replicas
    out: dict[str, tuple[int, ...]] = {}
    for a in order:
        size = sizes[a]
        group = sorted(sorted(range(replicas), key=lambda i: (assigned[i], i))[:size])
        for i in group:
            assigned[i] += demand[a] / size
        out[a] = tuple(group)
    return out


class GroupPinned:
    name = "group"

    def __init__(self, demand: Mapping[str, float], groups: Mapping[str, Sequence[int]] | None = None) -> None:
        """`groups` (agent -> replica indices) pins by hand instead of sizing by `demand`
        (to measure another allocation; docs/cluster.md)."""
        self._demand = dict(demand)
        self._groups: dict[str, tuple[int, ...]] | None = (
            {a: tuple(g) for a, g in groups.items()} if groups is not None else None)

    def route(self, call: CallInfo, loads: Sequence[int]) -> int:
        if self._groups is None:
            self._groups = group_replicas(self._demand, len(loads))
        group = self._groups.get(call.agent) or tuple(range(len(loads)))
        if not all(0 <= i < len(loads) for i in group):
            raise ConfigError(f"agent {call.agent!r} is pinned to replicas {list(group)}, "
                              f"but the cluster has {len(loads)} (0-{len(loads) - 1})")
        return min(group, key=lambda i: (loads[i], i))


def make_router(name: str, settings: CacheAwareSettings | None = None, *,
                workflows: Sequence[Workflow] = (), profile: Profile | None = None) -> Router:
    if name == "group":
        if profile is None or not workflows:
            raise ConfigError("the group router needs the workflows and the cost profile")
        return GroupPinned(agent_demand(workflows, profile))
    if name in ("task", "agent"):
        return Pinned(name)  # type: ignore[arg-type]
    if name == "cache":
        return CacheAware(settings)
    if name == "round-robin":
        return RoundRobin()
    if name == "least-load":
        return LeastLoad()
    raise ConfigError(f"unknown router {name!r}; choose from {', '.join(ROUTERS)}")
