"""Recorded-call traces (JSONL): write them from real runs, replay them in the simulator.

One JSON object per line, one line per LLM call:

    {"task_id": "t7", "workflow": "metagpt-sop", "stage": "engineer", "agent": "engineer",
     "prefix_tokens": 4096, "input_tokens": 2210, "output_tokens": 655,
     "t_submit": 1718000012.25, "t_done": 1718000031.5, "round": 2}

* `task_id`, `stage`, `agent`: non-empty strings. `workflow`: a string or null (unlabelled).
* `prefix_tokens` >= 0, `input_tokens` >= 1, `output_tokens` >= 1: integers (tokens).
* `t_submit` <= `t_done`: seconds on any one clock (only differences are used).
* `round`: 0-based ReAct round within the stage; a stage's rounds must be 0..n-1.

Replay (`load_trace`): each task's stage DAG comes from the workflow named in its records
when that is a built-in workflow (its agents' prefix sizes replaced by the recorded ones);
otherwise tasks become a chain of their stages in the order first seen, with each stage's
tool wait estimated as the mean gap between its rounds. Each call keeps its recorded sizes.
A task arrives at its first `t_submit` (shifted so the trace starts at 0), or, with `rate`,
arrivals are re-drawn as a Poisson process in the recorded order.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from ..errors import ConfigError
from ..sim.driver import poisson_arrivals
from ..workflow import RoundPlan, TaskPlan, Workflow, builtin_workflows, load_workflow
from ..workflow_parse import unique_json_keys
from .protocol import LIMITS
from .trace_dag import chain_workflows, with_prefixes

# Largest |t_submit| / |t_done|, seconds. Unix time is 1.7e9 and stays below this until the
# year 5138; beyond it float64 spacing (>= 1.5e-5 s, 16384 s at 1e20) swallows step times
# and gaps, and a value that large is a unit error (milliseconds or nanoseconds) anyway.
MAX_TIMESTAMP_S = 1e11


@dataclass(frozen=True, slots=True)
class TraceRecord:
    task_id: str
    workflow: str | None
    stage: str
    agent: str
    prefix_tokens: int
    input_tokens: int
    output_tokens: int
    t_submit: float
    t_done: float
    round: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


FIELDS = tuple(TraceRecord.__slots__)
_INT_MIN = {"prefix_tokens": 0, "input_tokens": 1, "output_tokens": 1, "round": 0}


def _field(obj: dict, key: str) -> Any:
    value = obj[key]
    if key == "workflow":
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"field 'workflow': expected a non-empty string or null, got {value!r}")
        return value
    if key in ("task_id", "stage", "agent"):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"field '{key}': expected a non-empty string, got {value!r}")
        return value
    if key in _INT_MIN:
        if isinstance(value, bool) or not isinstance(value, int) or value < _INT_MIN[key]:
            raise ValueError(f"field '{key}': expected an integer >= {_INT_MIN[key]}, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"field '{key}': expected a finite number, got {value!r}")
    if abs(value) > MAX_TIMESTAMP_S:
        raise ValueError(f"field '{key}': expected seconds within +-{MAX_TIMESTAMP_S:g}, got {value!r}")
    return float(value)


def parse_record(obj: Any) -> TraceRecord:
    """Validate one decoded JSON object; ValueError names the bad field."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in FIELDS if k not in obj]
    if missing:
        raise ValueError(f"missing field '{missing[0]}'")
    unknown = sorted(str(k) for k in obj if k not in FIELDS)
    if unknown:
        raise ValueError(f"unknown field '{unknown[0]}'")
    rec = TraceRecord(**{k: _field(obj, k) for k in FIELDS})
    if rec.t_done < rec.t_submit:
        raise ValueError(f"field 't_done': {rec.t_done} is before t_submit {rec.t_submit}")
    return rec


def write_trace_record(out: TextIO, record: TraceRecord | None = None, **fields: Any) -> TraceRecord:
    """Append one call to an open trace file (give a TraceRecord or its fields).

    Validates first, so a recorder cannot write a trace that `load_trace` rejects."""
    if record is None:
        try:
            record = parse_record(fields)
        except ValueError as exc:
            raise ConfigError(f"trace record: {exc}") from None
    out.write(record.to_json() + "\n")
    out.flush()
    return record


def read_records(path: str | Path) -> list[tuple[int, TraceRecord]]:
    """All records with their 1-based line numbers; blank lines are skipped."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read trace {path}: {getattr(exc, 'strerror', None) or exc}") from None
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append((n, parse_record(json.loads(line, object_pairs_hook=unique_json_keys))))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{n}: invalid JSON: {exc.msg}") from None
        except RecursionError:  # json's decoder recurses once per level of nesting
            raise ConfigError(f"{path}:{n}: invalid JSON: nested too deeply") from None
        except ValueError as exc:
            raise ConfigError(f"{path}:{n}: {exc}") from None
    if not records:
        raise ConfigError(f"{path}: no records")
    return records


def _group_rounds(path: str | Path, records: list[tuple[int, TraceRecord]]) -> dict[str, dict[str, list]]:
    """task -> stage -> [(line, record)] sorted by round; checks rounds are 0..n-1."""
    tasks: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    owner: dict[str, tuple[int, str | None]] = {}
    seen: dict[tuple[str, str, int], int] = {}
    for n, rec in records:
        first = owner.setdefault(rec.task_id, (n, rec.workflow))
        if first[1] != rec.workflow:
            raise ConfigError(f"{path}:{n}: task '{rec.task_id}' has workflow {rec.workflow!r} here "
                              f"but {first[1]!r} at line {first[0]}")
        key = (rec.task_id, rec.stage, rec.round)
        if key in seen:
            raise ConfigError(f"{path}:{n}: task '{rec.task_id}' stage '{rec.stage}' round {rec.round} "
                              f"already recorded at line {seen[key]}")
        seen[key] = n
        tasks[rec.task_id][rec.stage].append((n, rec))
    for task_id, stages in tasks.items():
        for stage, rows in stages.items():
            rows.sort(key=lambda row: row[1].round)
            if rows[-1][1].round != len(rows) - 1:
                raise ConfigError(f"{path}:{rows[-1][0]}: task '{task_id}' stage '{stage}' has rounds "
                                  f"{[r.round for _, r in rows]}, expected 0..{len(rows) - 1}")
    return tasks


def _known_workflow(path: str | Path, name: str, rows: list[tuple[int, TraceRecord]]) -> Workflow:
    wf = load_workflow(name)
    for n, rec in rows:
        if not wf.has_stage(rec.stage):
            raise ConfigError(f"{path}:{n}: workflow '{name}' has no stage '{rec.stage}'")
        if wf.stage(rec.stage).agent != rec.agent:
            raise ConfigError(f"{path}:{n}: stage '{rec.stage}' of workflow '{name}' is run by agent "
                              f"'{wf.stage(rec.stage).agent}', not '{rec.agent}'")
    return with_prefixes(wf, rows)


def _build_workflows(path: str | Path, records: list[tuple[int, TraceRecord]],
                     tasks: dict[str, dict[str, list]]) -> dict[str, Workflow]:
    """task_id -> the Workflow it replays through."""
    by_name: dict[str | None, list[tuple[int, TraceRecord]]] = defaultdict(list)
    for n, rec in records:
        by_name[rec.workflow].append((n, rec))
    builtin = set(builtin_workflows())
    out: dict[str, Workflow] = {}
    for name, rows in by_name.items():
        ids = list(dict.fromkeys(rec.task_id for _, rec in rows))
        if name in builtin:
            wf = _known_workflow(path, name, rows)
            for task_id in ids:
                if missing := [s for s in wf.topo_order if s not in tasks[task_id]]:
                    line = tasks[task_id][next(iter(tasks[task_id]))][0][0]
                    raise ConfigError(f"{path}:{line}: task '{task_id}' has no records for stages "
                                      f"{missing} of workflow '{name}'")
                out[task_id] = wf
        else:
            out.update(chain_workflows(path, name or "unlabelled", ids, tasks))
    return out


def _check_arrival_rate(path: str | Path, plans: Sequence[TaskPlan]) -> None:
    """The recorded arrivals' rate, (tasks - 1) / span as the bench reports it, within the
    lower bound of `--rate` (LIMITS.rate, the same float-rounding reason): arrivals 1e20 s
    apart ran "at 1e-20 tasks/s" and reported a JCT below the lower bound."""
    span = plans[-1].arrival_s - plans[0].arrival_s if plans else 0.0
    if len(plans) < 2 or span <= 0:
        return
    rate, low = (len(plans) - 1) / span, LIMITS.rate[0]
    if rate < low:
        raise ConfigError(f"{path}: its {len(plans)} tasks arrive over {span:g} s, a rate of {rate:.3g} "
                          f"tasks/s, below the supported {low:g} (give --rate or --load to redraw arrivals)")


def load_trace(path: str | Path, *, rate: float | None = None, seed: int = 0,
               max_tasks: int | None = None, redrawn: bool = False) -> tuple[TaskPlan, ...]:
    """Rebuild the recorded tasks as TaskPlans, in arrival order (module docstring). Unless
    `rate` is given or the caller redraws arrivals itself (`redrawn`), the recorded arrivals
    are replayed and so must have a supported rate (LIMITS.rate)."""
    records = read_records(path)
    tasks = _group_rounds(path, records)
    workflows = _build_workflows(path, records, tasks)
    start = min(rec.t_submit for _, rec in records)
    plans = []
    for task_id, stages in tasks.items():
        arrival = min(rec.t_submit for rows in stages.values() for _, rec in rows) - start
        rounds = {s: tuple(RoundPlan(r.input_tokens, r.output_tokens) for _, r in rows)
                  for s, rows in stages.items()}
        wf = workflows[task_id]
        ordered = {s: rounds[s] for s in wf.topo_order}
        plans.append(TaskPlan(task_id, wf, arrival, ordered))
    plans.sort(key=lambda p: (p.arrival_s, p.task_id))
    if max_tasks is not None:
        plans = plans[:max_tasks]
    if rate is None and not redrawn:
        _check_arrival_rate(path, plans)
    return redraw_arrivals(plans, rate, seed) if rate is not None else tuple(plans)


def redraw_arrivals(tasks: Sequence[TaskPlan], rate: float, seed: int) -> tuple[TaskPlan, ...]:
    """Same tasks, same order, Poisson arrivals at `rate` tasks/s from `seed`."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ConfigError(f"rate must be a positive number, got {rate!r}")
    times = poisson_arrivals(len(tasks), rate, seed)
    return tuple(replace(task, arrival_s=t) for task, t in zip(tasks, times, strict=True))
