"""Client-side records of every LLM call a workflow makes, and JSONL traces from them.

The provider reports each completed call (`TopasOpenAILLM._record`); rounds are numbered
per (task, stage) in completion order, as the trace format requires. `write_trace` uses
the bench helper's `write_trace_record`, so a trace that is written always loads.

Times come from `clock`: seconds since the recorder started (wall seconds x time_scale for
the embedded simulator, i.e. approximately simulated seconds).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from topas_agents.bench.trace import write_trace_record
from topas_agents.labels import Label
from topas_agents.workflow import builtin_workflows, load_workflow

from .layout import Shaped


@dataclass(frozen=True, slots=True)
class CallRecord:
    task_id: str
    workflow: str | None
    stage: str
    agent: str
    round: int
    prefix_tokens: int
    input_tokens: int
    output_tokens: int
    t_submit: float
    t_done: float
    template: str | None  # the layout splitter that matched (None: prompt left as is)


class CallRecorder:
    """Collects `CallRecord`s (one asyncio loop; no locking needed)."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock = clock or scaled_clock(1.0)
        self.records: list[CallRecord] = []
        self.unlabelled = 0
        self._rounds: collections.Counter[tuple[str, str]] = collections.Counter()

    def on_call(self, label: Label | None, shaped: Shaped, t_submit: float, t_done: float,
                prompt_tokens: int, completion_tokens: int) -> None:
        if label is None:
            self.unlabelled += 1
            return
        key = (label.task_id, label.stage)
        prefix = shaped.prefix_tokens
        self.records.append(CallRecord(
            task_id=label.task_id, workflow=label.workflow, stage=label.stage, agent=label.agent,
            round=self._rounds[key], prefix_tokens=prefix, input_tokens=max(1, prompt_tokens - prefix),
            output_tokens=max(1, completion_tokens), t_submit=t_submit, t_done=max(t_submit, t_done),
            template=shaped.template))
        self._rounds[key] += 1

    def for_task(self, task_id: str) -> list[CallRecord]:
        return [r for r in self.records if r.task_id == task_id]


def scaled_clock(time_scale: float = 1.0) -> Callable[[], float]:
    """Seconds since this call x `time_scale` (the embedded simulator's pace: approximately
    simulated seconds)."""
    t0 = time.monotonic()
    return lambda: round((time.monotonic() - t0) * time_scale, 6)


def trace_workflow_name(workflow: str | None, stages: Iterable[str]) -> str | None:
    """The workflow name a task's records get in a trace.

    A built-in workflow's name only when the task has records for every one of its stages
    (replay then uses the built-in DAG); otherwise `<name>-partial` (replayed as the chain
    of stages actually seen), so a failed task never makes the trace unloadable."""
    if workflow is None or workflow not in builtin_workflows():
        return workflow
    needed = {s.name for s in load_workflow(workflow).stages}
    return workflow if needed <= set(stages) else f"{workflow}-partial"


def write_trace(out: TextIO, records: Iterable[CallRecord],
                names: Mapping[str, str | None] | None = None) -> int:
    """Write `records` as trace lines (`names`: task_id -> trace workflow name). Returns
    the number of lines."""
    records = list(records)
    if names is None:
        by_task: dict[str, list[CallRecord]] = collections.defaultdict(list)
        for r in records:
            by_task[r.task_id].append(r)
        names = {t: trace_workflow_name(rs[0].workflow, {r.stage for r in rs}) for t, rs in by_task.items()}
    for r in records:
        write_trace_record(out, task_id=r.task_id, workflow=names.get(r.task_id, r.workflow), stage=r.stage,
                           agent=r.agent, prefix_tokens=r.prefix_tokens, input_tokens=r.input_tokens,
                           output_tokens=r.output_tokens, t_submit=r.t_submit, t_done=r.t_done, round=r.round)
    return len(records)


def save_trace(path: str | Path, records: Iterable[CallRecord]) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        return write_trace(out, records)
