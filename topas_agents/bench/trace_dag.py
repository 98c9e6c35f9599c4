"""Stage DAGs for replayed traces: recorded prefix sizes on a known workflow, or chains
rebuilt from the records of an unknown one (see `trace.py` for the format)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, WorkflowError
from ..workflow import DEFAULT_LIMITS, AgentSpec, Workflow, parse_workflow


def _max_prefix(rows: Sequence[tuple[int, Any]]) -> dict[str, int]:
    prefix: dict[str, int] = {}
    for _, rec in rows:
        prefix[rec.agent] = max(prefix.get(rec.agent, 0), rec.prefix_tokens)
    return prefix


def with_prefixes(wf: Workflow, rows: Sequence[tuple[int, Any]]) -> Workflow:
    """`wf` with each recorded agent's prefix size replaced by the largest one recorded
    (the real prompts the run sent, which may differ from the workflow's estimate)."""
    recorded = _max_prefix(rows)
    agents = tuple(AgentSpec(a.name, recorded.get(a.name, a.prefix_tokens)) for a in wf.agents)
    return dataclasses.replace(wf, agents=agents)


def _stage_order(stages: dict[str, list]) -> tuple[str, ...]:
    """A task's stages in the order their first record appears in the file."""
    return tuple(sorted(stages, key=lambda s: min(n for n, _ in stages[s])))


def _range(values: list[int]) -> list[int] | int:
    lo, hi = min(values), max(values)
    return lo if lo == hi else [lo, hi]


def _tool_wait(path: str | Path, workflow: str, stage: str, members: list[dict[str, list]]) -> float:
    """The stage's wait between rounds: the mean recorded gap (t_done to the next round's
    t_submit). A mean over the workflow limit is refused here, naming the records: the
    workflow check named a field the trace does not have ("stages[0] (s1).tool_wait_s")."""
    gaps = [(task[stage][r + 1][0], max(0.0, task[stage][r + 1][1].t_submit - task[stage][r][1].t_done))
            for task in members for r in range(len(task[stage]) - 1)]
    mean = sum(g for _, g in gaps) / len(gaps) if gaps else 0.0
    limit = DEFAULT_LIMITS.max_tool_wait_s
    if mean > limit:
        line = max(gaps, key=lambda lg: lg[1])[0]  # the widest gap ends at this record
        raise ConfigError(f"{path}:{line}: stage '{stage}' of workflow '{workflow}': its rounds are "
                          f"{mean:g} s apart on average (t_done to the next round's t_submit), "
                          f"over the {limit:g} s a tool wait may take")
    return mean


def _chain_spec(path: str | Path, workflow: str, name: str, order: tuple[str, ...],
                members: list[dict[str, list]]) -> dict[str, Any]:
    """A workflow mapping (for parse_workflow) for tasks that share one stage sequence
    (`name`: this variant's, `workflow`: the recorded workflow's, for errors)."""
    rows = [row for stages in members for rs in stages.values() for row in rs]
    prefix = _max_prefix(rows)
    agents = [{"name": a, "prefix_tokens": p} for a, p in prefix.items()]
    stages = []
    for i, stage in enumerate(order):
        recs = [rec for task in members for _, rec in task[stage]]
        stages.append({
            "name": stage, "agent": recs[0].agent, "after": [order[i - 1]] if i else [],
            "requests": _range([len(task[stage]) for task in members]),
            "input_tokens": _range([r.input_tokens for r in recs]),
            "output_tokens": _range([r.output_tokens for r in recs]),
            "tool_wait_s": _tool_wait(path, workflow, stage, members),
        })
    return {"name": name, "agents": agents, "stages": stages,
            "description": "chain rebuilt from a recorded trace"}


def chain_workflows(path: str | Path, name: str, task_ids: Sequence[str],
                    tasks: dict[str, dict[str, list]]) -> dict[str, Workflow]:
    """task_id -> chain Workflow for tasks of a workflow that is not built in.

    Tasks with the same stage sequence share one chain; when tasks differ, each distinct
    sequence gets its own workflow named `name#2`, `name#3`, ... (first one keeps `name`)."""
    variants: dict[tuple[str, ...], list[str]] = {}
    for task_id in task_ids:
        stages = tasks[task_id]
        for stage, rows in stages.items():
            agents = {rec.agent for _, rec in rows}
            if len(agents) > 1:
                raise ConfigError(f"{path}:{rows[0][0]}: task '{task_id}' stage '{stage}' is run by "
                                  f"several agents {sorted(agents)}")
        variants.setdefault(_stage_order(stages), []).append(task_id)
    out: dict[str, Workflow] = {}
    for k, (order, ids) in enumerate(variants.items()):
        wf_name = name if k == 0 else f"{name}#{k + 1}"
        members = [tasks[t] for t in ids]
        for stage in order:  # one stage name, one agent, across the variant's tasks
            agents = {rec.agent for t in members for _, rec in t[stage]}
            if len(agents) > 1:
                line = members[0][stage][0][0]
                raise ConfigError(f"{path}:{line}: stage '{stage}' of workflow '{name}' is run by "
                                  f"several agents {sorted(agents)}")
        try:
            wf = parse_workflow(_chain_spec(path, name, wf_name, order, members), str(path))
        except WorkflowError as exc:
            raise ConfigError(str(exc)) from None
        out.update({t: wf for t in ids})
    return out
