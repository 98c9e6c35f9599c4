"""Workflow model: a DAG of stages, each run by an agent with a static prompt prefix.

The YAML schema (see README "Workflow YAML"):

    name: diamond
    agents:
      - {name: planner, prefix_tokens: 4096}
    stages:
      - {name: plan, agent: planner, after: [], requests: 1, input_tokens: 512, output_tokens: 256}
      - {name: code, agent: coder, after: [plan], requests: [1, 3], input_tokens: 768,
         output_tokens: 384, tool_wait_s: 0.5}

`requests`, `input_tokens` and `output_tokens` take a number or `[lo, hi]` (uniform integer
range, inclusive). A stage issues `requests` sequential LLM calls (ReAct rounds); each round's
input/output sizes are sampled independently from the task's seeded RNG.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from .errors import WorkflowError

_STAGE_KEYS = {"name", "agent", "after", "requests", "input_tokens", "output_tokens", "tool_wait_s"}
_AGENT_KEYS = {"name", "prefix_tokens"}
_TOP_KEYS = {"name", "agents", "stages", "description", "rates", "loads"}


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


def _int_range(value: Any, where: str, *, minimum: int) -> IntRange:
    if isinstance(value, bool):
        raise WorkflowError(f"{where}: expected an integer or [lo, hi], got {value!r}")
    if isinstance(value, int):
        lo = hi = value
    elif (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        lo, hi = value
    else:
        raise WorkflowError(f"{where}: expected an integer or [lo, hi], got {value!r}")
    if lo < minimum or hi < lo:
        raise WorkflowError(f"{where}: need {minimum} <= lo <= hi, got {value!r}")
    return IntRange(lo, hi)


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise WorkflowError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _check_keys(obj: Any, allowed: set[str], required: set[str], where: str) -> dict:
    if not isinstance(obj, dict):
        raise WorkflowError(f"{where}: expected a mapping, got {type(obj).__name__}")
    # YAML keys may be non-strings (`1: x`); compare as text so sorting never fails.
    unknown = sorted(str(k) for k in obj if k not in allowed)
    if unknown:
        raise WorkflowError(f"{where}: unknown field '{unknown[0]}'")
    missing = sorted(required - set(obj))
    if missing:
        raise WorkflowError(f"{where}: missing field '{missing[0]}'")
    return obj


def _parse_agent(obj: Any, i: int) -> AgentSpec:
    where = f"agents[{i}]"
    obj = _check_keys(obj, _AGENT_KEYS, _AGENT_KEYS, where)
    name = _name(obj["name"], f"{where}.name")
    tokens = obj["prefix_tokens"]
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise WorkflowError(f"{where}.prefix_tokens: expected an integer >= 0, got {tokens!r}")
    return AgentSpec(name, tokens)


def _parse_stage(obj: Any, i: int, agents: set[str]) -> StageSpec:
    where = f"stages[{i}]"
    obj = _check_keys(obj, _STAGE_KEYS, {"name", "agent", "input_tokens", "output_tokens"}, where)
    name = _name(obj["name"], f"{where}.name")
    where = f"stages[{i}] ({name})"
    agent = _name(obj["agent"], f"{where}.agent")
    if agent not in agents:
        raise WorkflowError(f"{where}.agent: unknown agent '{agent}'")
    after = obj.get("after", []) or []
    if isinstance(after, str):
        after = [after]
    if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
        raise WorkflowError(f"{where}.after: expected a list of stage names, got {after!r}")
    if len(set(after)) != len(after):
        dup = next(a for a in after if after.count(a) > 1)
        raise WorkflowError(f"{where}.after: stage '{dup}' listed twice")
    wait = obj.get("tool_wait_s", 0.0)
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not (0 <= wait < math.inf):
        raise WorkflowError(f"{where}.tool_wait_s: expected a finite number >= 0, got {wait!r}")
    return StageSpec(
        name=name,
        agent=agent,
        after=tuple(after),
        requests=_int_range(obj.get("requests", 1), f"{where}.requests", minimum=1),
        input_tokens=_int_range(obj["input_tokens"], f"{where}.input_tokens", minimum=1),
        output_tokens=_int_range(obj["output_tokens"], f"{where}.output_tokens", minimum=1),
        tool_wait_s=float(wait),
    )


def _topo_sort(stages: tuple[StageSpec, ...]) -> tuple[str, ...]:
    order: list[str] = []
    done: set[str] = set()
    pending = list(stages)
    while pending:
        ready = [s for s in pending if all(d in done for d in s.after)]
        if not ready:
            cycle = sorted(s.name for s in pending)
            raise WorkflowError(f"stages: dependency cycle among {cycle}")
        for s in ready:
            order.append(s.name)
            done.add(s.name)
        pending = [s for s in pending if s.name not in done]
    return tuple(order)


def parse_workflow(data: Any, source: str = "<workflow>") -> Workflow:
    """Validate a workflow mapping (as loaded from YAML). Errors name the bad field."""
    try:
        return _parse_workflow(data)
    except WorkflowError as exc:
        raise WorkflowError(f"{source}: {exc}") from None


def _parse_workflow(data: Any) -> Workflow:
    data = _check_keys(data, _TOP_KEYS, {"name", "agents", "stages"}, "workflow")
    name = _name(data["name"], "name")
    if not isinstance(data["agents"], list) or not data["agents"]:
        raise WorkflowError("agents: expected a non-empty list")
    if not isinstance(data["stages"], list) or not data["stages"]:
        raise WorkflowError("stages: expected a non-empty list")
    agents = tuple(_parse_agent(a, i) for i, a in enumerate(data["agents"]))
    agent_names = [a.name for a in agents]
    if len(set(agent_names)) != len(agent_names):
        dup = next(n for n in agent_names if agent_names.count(n) > 1)
        raise WorkflowError(f"agents: duplicate agent '{dup}'")
    stages = tuple(_parse_stage(s, i, set(agent_names)) for i, s in enumerate(data["stages"]))
    stage_names = [s.name for s in stages]
    if len(set(stage_names)) != len(stage_names):
        dup = next(n for n in stage_names if stage_names.count(n) > 1)
        raise WorkflowError(f"stages: duplicate stage '{dup}'")
    for i, s in enumerate(stages):
        for dep in s.after:
            if dep not in stage_names:
                raise WorkflowError(f"stages[{i}] ({s.name}).after: unknown stage '{dep}'")
            if dep == s.name:
                raise WorkflowError(f"stages[{i}] ({s.name}).after: a stage cannot depend on itself")
    _topo_sort(stages)  # raises on cycles
    loads = data.get("loads", (0.3, 0.6, 0.9))
    if not isinstance(loads, list | tuple) or not loads or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and 0 < x < math.inf for x in loads
    ):
        raise WorkflowError(f"loads: expected a non-empty list of positive numbers, got {loads!r}")
    desc = data.get("description", "")
    if not isinstance(desc, str):
        raise WorkflowError(f"description: expected a string, got {type(desc).__name__}")
    return Workflow(name, agents, stages, tuple(float(x) for x in loads), desc)


def yaml_error_detail(exc: yaml.YAMLError) -> str:
    """' at line N: problem' for a YAML parse error (one line, for user-facing messages)."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark else ""
    return f"{where}: {getattr(exc, 'problem', exc)}"


def builtin_workflow_dir() -> Path:
    from topas_agents import datasets

    return Path(datasets.__file__).parent / "workloads"


def builtin_workflows() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in builtin_workflow_dir().glob("*.yaml")))


def load_workflow(name_or_path: str | Path) -> Workflow:
    """Load a built-in workflow by name (`chain3`) or a YAML file by path."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = builtin_workflow_dir() / f"{name_or_path}.yaml"
        if not path.exists():
            known = ", ".join(builtin_workflows())
            raise WorkflowError(f"unknown workflow '{name_or_path}' (built-in: {known}; or give a .yaml path)")
    if not path.exists():
        raise WorkflowError(f"workflow file not found: {path}")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:  # a directory, no permission, binary file
        raise WorkflowError(f"cannot read workflow file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WorkflowError(f"{path}: invalid YAML{yaml_error_detail(exc)}") from None
    return parse_workflow(data, str(path))


# ---------------------------------------------------------------------------- task plans


@dataclass(frozen=True, slots=True)
class RoundPlan:
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class TaskPlan:
    """One sampled task instance: the concrete rounds every stage will issue."""

    task_id: str
    workflow: Workflow
    arrival_s: float
    rounds: Mapping[str, tuple[RoundPlan, ...]]


def sample_task(wf: Workflow, task_id: str, arrival_s: float, rng: random.Random) -> TaskPlan:
    """Sample every stage's round count and per-round sizes in topological order."""
    rounds: dict[str, tuple[RoundPlan, ...]] = {}
    for name in wf.topo_order:
        st = wf.stage(name)
        n = st.requests.sample(rng)
        rounds[name] = tuple(
            RoundPlan(st.input_tokens.sample(rng), st.output_tokens.sample(rng)) for _ in range(n)
        )
    return TaskPlan(task_id, wf, arrival_s, rounds)
