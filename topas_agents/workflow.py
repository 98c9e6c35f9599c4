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
import numbers
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError, WorkflowError
from .workflow_model import AgentSpec, IntRange, StageSpec, Workflow
from .workflow_parse import (
    DEFAULT_LIMITS,
    WorkflowLimits,
    load_yaml_data,
    parse_workflow,
    yaml_error_detail,
)

__all__ = [
    "DEFAULT_LIMITS", "DERIVED_WORKFLOWS", "AgentSpec", "IntRange", "RoundPlan", "StageSpec", "TaskPlan", "Workflow", "WorkflowLimits",
    "builtin_workflow_dir", "builtin_workflows", "load_workflow", "load_yaml_data", "parse_workflow",
    "sample_task", "workflow_mapping", "yaml_error_detail",
]


def builtin_workflow_dir() -> Path:
    from topas_agents import datasets

    return Path(datasets.__file__).parent / "workloads"


def builtin_workflows() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in builtin_workflow_dir().glob("*.yaml")))


def workflow_mapping(wf: Workflow) -> dict[str, Any]:
    """The YAML mapping of `wf`, the inverse of `parse_workflow` (uploads, derived built-ins)."""

    def rng(r: IntRange) -> int | list[int]:
        return r.lo if r.lo == r.hi else [r.lo, r.hi]

    return {
        "name": wf.name,
        "description": wf.description,
        "loads": list(wf.loads),
        "agents": [{"name": a.name, "prefix_tokens": a.prefix_tokens} for a in wf.agents],
        "stages": [{"name": s.name, "agent": s.agent, "after": list(s.after), "requests": rng(s.requests),
                    "input_tokens": rng(s.input_tokens), "output_tokens": rng(s.output_tokens),
                    "tool_wait_s": s.tool_wait_s} for s in wf.stages],
    }


# Built-ins derived from another by dropping stages: name -> (base, stages dropped). MetaGPT's
# SOP without its QA stage is how `topas run sop` runs by default (QA runs generated code); its
# calls are labelled with this name, so a server that takes workflows at start only (SGLang with
# the plugin) must be able to load it by name. Not a workload of its own (not listed).
DERIVED_WORKFLOWS: Mapping[str, tuple[str, tuple[str, ...]]] = {"metagpt-sop-noqa": ("metagpt-sop", ("qa",))}


def _derived(name: str) -> Workflow:
    base_name, dropped = DERIVED_WORKFLOWS[name]
    data = workflow_mapping(load_workflow(base_name))
    stages = [{**s, "after": [d for d in s["after"] if d not in dropped]}
              for s in data["stages"] if s["name"] not in dropped]
    used = {s["agent"] for s in stages}
    data.update(name=name, description=f"{data['description']} (without: {', '.join(dropped)})", stages=stages,
                agents=[a for a in data["agents"] if a["name"] in used])
    return parse_workflow(data, f"built-in {name}")


def load_workflow(name_or_path: str | Path) -> Workflow:
    """Load a built-in workflow by name (`chain3`, or a derived one: DERIVED_WORKFLOWS) or a
    YAML file by path."""
    if isinstance(name_or_path, str) and name_or_path in DERIVED_WORKFLOWS:
        return _derived(name_or_path)
    path = Path(name_or_path)
    if path.suffix.lower() not in (".yaml", ".yml"):
        builtin = builtin_workflow_dir() / f"{name_or_path}.yaml"
        if len(path.parts) == 1 and builtin.exists():  # a bare name; "/x/wf" read /x/wf.yaml
            path = builtin
        elif not path.is_file():  # any other existing file is read as YAML (JSON included)
            known = ", ".join([*builtin_workflows(), *DERIVED_WORKFLOWS])
            raise WorkflowError(f"unknown workflow '{name_or_path}' (built-in: {known}; or give a "
                                "workflow file's path)")
    if not path.exists():
        raise WorkflowError(f"workflow file not found: {path}")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:  # a directory, no permission, binary file
        raise WorkflowError(f"cannot read workflow file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = load_yaml_data(text)
    except WorkflowError as exc:
        raise WorkflowError(f"{path}: {exc}") from None
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

    def __post_init__(self) -> None:
        # A NaN arrival hung the simulator (its event heap never advanced past it), an
        # infinite one gave a NaN JCT. A negative one is a task that arrived before the
        # clock's zero (the decision-cost world pre-ages its tasks so).
        if not isinstance(self.task_id, str) or not self.task_id:
            raise ConfigError(f"task id must be a non-empty string, got {self.task_id!r}")
        arrival = self.arrival_s
        if isinstance(arrival, bool) or not isinstance(arrival, numbers.Real) or not math.isfinite(arrival):
            raise ConfigError(f"task {self.task_id!r}: arrival time must be a finite number of seconds, got {arrival!r}")


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
