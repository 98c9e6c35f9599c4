"""The policy boundary: a frozen `Snapshot` goes in, a `Decision` comes out.

Engines (the simulator, the SGLang adapter) build snapshots and apply decisions; policies
never touch engine state. KV accounting is defined once here:

    kv_used = sum(prefix tokens of GPU-resident or loading agents)
            + sum(request.kv_tokens for running requests)
    kv_used <= kv_budget            (always; `check_decision` enforces it)

`request.kv_tokens` is the request's own footprint beyond its agent prefix: its dynamic
input plus its full decode reservation (`input_tokens + max_new_tokens`). Reserving the
whole decode up front means a running request never runs out of KV; preemption is always a
policy choice, never an out-of-memory surprise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from .costmodel import Profile
from .errors import DecisionError
from .workflow import Workflow

PrefixLocation = Literal["gpu", "loading", "cpu", "none"]


@dataclass(frozen=True, slots=True)
class RequestView:
    rid: str
    task_id: str
    workflow: str | None  # None: unlabelled or unknown workflow (a one-stage task)
    stage: str
    agent: str
    prefix_tokens: int  # the agent's static prefix (shared by all its requests)
    input_tokens: int  # dynamic suffix
    max_new_tokens: int
    generated: int  # output tokens produced so far (kept across preemption)
    arrival_s: float
    task_arrival_s: float
    round: int = 0  # ReAct round within the stage (0-based)
    service_s: float = 0.0  # LLM service time attained so far (running time)
    preemptions: int = 0

    @property
    def kv_tokens(self) -> int:
        """KV footprint beyond the shared prefix: input plus full decode reservation."""
        return self.input_tokens + self.max_new_tokens

    @property
    def remaining_tokens(self) -> int:
        return max(0, self.max_new_tokens - self.generated)


@dataclass(frozen=True, slots=True)
class TaskView:
    task_id: str
    workflow: str | None
    arrival_s: float
    done_stages: frozenset[str]
    # Stages that have started (a request issued) but not finished, with the LLM service
    # time they have attained so far (for residual conditioning).
    active_stages: tuple[tuple[str, float], ...]
    attained_s: float  # total LLM service attained by the task (Autellix LAS)


@dataclass(frozen=True, slots=True)
class PrefixView:
    agent: str
    tokens: int
    location: PrefixLocation
    last_used_s: float  # for LRU eviction
    running: int  # running requests using it (a pinned prefix cannot be evicted)

    @property
    def on_gpu(self) -> bool:
        return self.location in ("gpu", "loading")


@dataclass(frozen=True, slots=True)
class StageDone:
    """A stage finished since the previous decision (policies learn service profiles)."""

    task_id: str
    workflow: str | None
    stage: str
    agent: str
    service_s: float  # LLM service over all rounds, tool waits excluded
    rounds: int
    time_s: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    kv_budget: int
    waiting: tuple[RequestView, ...]
    running: tuple[RequestView, ...]
    prefixes: tuple[PrefixView, ...]
    tasks: tuple[TaskView, ...]
    profile: Profile
    workflows: Mapping[str, Workflow] = field(default_factory=lambda: MappingProxyType({}))
    events: tuple[StageDone, ...] = ()

    @property
    def kv_used(self) -> int:
        return sum(p.tokens for p in self.prefixes if p.on_gpu) + sum(r.kv_tokens for r in self.running)

    @property
    def kv_free(self) -> int:
        return self.kv_budget - self.kv_used

    def prefix(self, agent: str) -> PrefixView | None:
        for p in self.prefixes:
            if p.agent == agent:
                return p
        return None


@dataclass(frozen=True, slots=True)
class Decision:
    """What to change now. Order of application: preempt, prefix_out, prefix_in, admit.

    Admitting a request makes its agent's prefix GPU-resident implicitly (swap-in from the
    CPU tier, or recompute as part of its prefill); `prefix_in` loads prefixes proactively.
    """

    admit: tuple[str, ...] = ()
    preempt: tuple[str, ...] = ()
    prefix_in: tuple[str, ...] = ()
    prefix_out: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Each field as a tuple of ids: a list is taken as its tuple (a list in `prefix_out`
        was a TypeError deep in the check), a string or non-sequence is a DecisionError
        naming the field (`admit="rid"` read as one id per character)."""
        for name in _DECISION_FIELDS:
            ids = getattr(self, name)
            if type(ids) is tuple:
                continue
            if isinstance(ids, str | bytes | Mapping) or not isinstance(ids, Iterable):
                raise DecisionError(f"Decision.{name} must be a tuple of ids, got {type(ids).__name__} {ids!r:.60}")
            object.__setattr__(self, name, tuple(ids))

    @property
    def empty(self) -> bool:
        return not (self.admit or self.preempt or self.prefix_in or self.prefix_out)


_DECISION_FIELDS = ("admit", "preempt", "prefix_in", "prefix_out")


NOOP = Decision()


def _unique(ids: tuple[str, ...], what: str) -> None:
    if len(set(ids)) != len(ids):
        raise DecisionError(f"duplicate ids in {what}: {ids}")


def kv_after(snap: Snapshot, decision: Decision) -> int:
    """KV tokens in use once `decision` is applied (validates nothing)."""
    preempted = set(decision.preempt)
    admitted = set(decision.admit)
    running = [r for r in snap.running if r.rid not in preempted]
    running += [r for r in snap.waiting if r.rid in admitted]
    gpu = {p.agent for p in snap.prefixes if p.on_gpu}
    gpu -= set(decision.prefix_out)
    gpu |= set(decision.prefix_in)
    gpu |= {r.agent for r in running}
    tokens = {p.agent: p.tokens for p in snap.prefixes}
    tokens.update({r.agent: r.prefix_tokens for r in running if r.agent not in tokens})
    return sum(tokens[a] for a in gpu) + sum(r.kv_tokens for r in running)


def check_decision(snap: Snapshot, decision: Decision) -> None:
    """Raise DecisionError unless `decision` is applicable to `snap` within the KV budget."""
    for name in ("admit", "preempt", "prefix_in", "prefix_out"):
        _unique(getattr(decision, name), name)
    waiting = {r.rid for r in snap.waiting}
    running = {r.rid: r for r in snap.running}
    if bad := [rid for rid in decision.admit if rid not in waiting]:
        raise DecisionError(f"admit of requests not waiting: {bad}")
    if bad := [rid for rid in decision.preempt if rid not in running]:
        raise DecisionError(f"preempt of requests not running: {bad}")
    if clash := set(decision.prefix_in) & set(decision.prefix_out):
        raise DecisionError(f"prefix both in and out: {sorted(clash)}")
    known = {p.agent for p in snap.prefixes}
    if bad := [a for a in decision.prefix_in + decision.prefix_out if a not in known]:
        raise DecisionError(f"unknown prefixes: {bad}")
    preempted = set(decision.preempt)
    still_running = {r.agent for r in snap.running if r.rid not in preempted}
    admit_set = set(decision.admit)
    admitted_agents = {r.agent for r in snap.waiting if r.rid in admit_set}
    if pinned := sorted(set(decision.prefix_out) & (still_running | admitted_agents)):
        raise DecisionError(f"prefix_out of prefixes in use by running/admitted requests: {pinned}")
    used = kv_after(snap, decision)
    if used > snap.kv_budget:
        raise DecisionError(f"decision needs {used} KV tokens, budget is {snap.kv_budget}")
