"""What the scheduler did, per request and per task: a recorded `Timeline` (sim/record.py) as a
Chrome/Perfetto trace-event JSON and as a Gantt PNG; `write_bench_timelines` for `topas bench
--timeline DIR`. See docs/timelines.md.

Trace layout (open it in ui.perfetto.dev or chrome://tracing), one process per task:
- process "engine" (pid 0): counter tracks `kv_used` (tokens, with the budget) and `batch`
  (running requests, decode batch), and a "host link" thread with one span per prefix
  transfer plus `swap_in`/`swap_out` instants when each transfer is queued;
- process "task <id>" (pid 1, 2, ... in arrival order): one thread per request (LLM call,
  named `stage#round (agent)`) with its phase spans (queued, preempted, prefix_load,
  prefill, decode; category = agent) and a `preempt` instant at each preemption.
Times are simulated seconds written as microseconds (the format's unit).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..sim.record import RecorderConfig, RequestTimeline, Timeline, TimelineRecorder
from .plots import save_figure

# Gantt rows and trace processes for a bench run: enough to see the pattern, few enough that
# one PNG stays readable (one row per task) and the JSON small.
DEFAULT_TIMELINE_TASKS = 40
ENGINE_PID = 0
HOST_LINK_TID = 1
_US = 1e6  # trace-event timestamps are microseconds


def window(tl: Timeline, last: int | None = None, *, keep: Callable[[str], bool] | None = None,
           rename: Callable[[str], str] | None = None) -> Timeline:
    """`tl` cut down for display: requests whose task id passes `keep` (transfers: whose
    agent does), the latest `last` of those by arrival, counters and transfers from the
    first kept arrival on (with the sample in force then), task/agent/workflow names mapped
    through `rename` (the server shows a tenant its own, unqualified names)."""
    reqs = [r for r in tl.requests if keep is None or keep(r.task_id)]
    if last is not None:
        reqs = reqs[-last:] if last > 0 else []
    t0 = min((r.arrival_s for r in reqs), default=tl.now_s)
    first = next((i for i, smp in enumerate(tl.samples) if smp.t_s > t0), len(tl.samples))
    samples = tl.samples[max(0, first - 1):]
    transfers = tuple(x for x in tl.transfers if x.end_s >= t0 and (keep is None or keep(x.agent)))
    if rename is not None:
        reqs = [replace(r, task_id=rename(r.task_id), agent=rename(r.agent),
                        workflow=None if r.workflow is None else rename(r.workflow)) for r in reqs]
        transfers = tuple(replace(x, agent=rename(x.agent)) for x in transfers)
    return Timeline(tl.kv_budget, tl.now_s, tuple(reqs), transfers, samples)


def _us(t: float) -> float:
    return round(t * _US, 3)


def _dur(start: float, end: float) -> float:
    """Rounded from the rounded ends, so a span ends exactly where the next one starts."""
    return round(_us(end) - _us(start), 3)


def _meta(pid: int, name: str, tid: int | None = None) -> list[dict[str, Any]]:
    kind = "process" if tid is None else "thread"
    base: dict[str, Any] = {"ph": "M", "pid": pid} if tid is None else {"ph": "M", "pid": pid, "tid": tid}
    sort = pid if tid is None else tid
    return [{**base, "name": f"{kind}_name", "args": {"name": name}},
            {**base, "name": f"{kind}_sort_index", "args": {"sort_index": sort}}]


def _engine_events(tl: Timeline) -> Iterator[dict[str, Any]]:
    yield from _meta(ENGINE_PID, "engine")
    yield from _meta(ENGINE_PID, "host link", HOST_LINK_TID)
    for s in tl.samples:
        ts = _us(s.t_s)
        yield {"ph": "C", "name": "kv_used", "pid": ENGINE_PID, "ts": ts,
               "args": {"kv_used": s.kv_used, "kv_budget": tl.kv_budget}}
        yield {"ph": "C", "name": "batch", "pid": ENGINE_PID, "ts": ts,
               "args": {"running": s.running, "decoding": s.decoding}}
    for tr in tl.transfers:
        args = {"agent": tr.agent, "tokens": tr.tokens, "start_s": tr.start_s, "end_s": tr.end_s}
        yield {"ph": "i", "s": "t", "name": f"swap_{tr.direction}", "pid": ENGINE_PID, "tid": HOST_LINK_TID,
               "ts": _us(tr.queued_s), "args": args}
        yield {"ph": "X", "name": f"swap_{tr.direction} {tr.agent}", "cat": "transfer", "pid": ENGINE_PID,
               "tid": HOST_LINK_TID, "ts": _us(tr.start_s), "dur": _dur(tr.start_s, tr.end_s), "args": args}


def _request_events(r: RequestTimeline, pid: int, tid: int) -> Iterator[dict[str, Any]]:
    yield from _meta(pid, f"{r.stage}#{r.round} ({r.agent})", tid)
    args = {"rid": r.rid, "stage": r.stage, "agent": r.agent, "round": r.round, "end": r.end}
    for sp in r.spans:
        if sp.end_s > sp.start_s:  # a phase left at once (admitted on arrival) draws nothing
            yield {"ph": "X", "name": sp.phase, "cat": r.agent, "pid": pid, "tid": tid, "ts": _us(sp.start_s),
                   "dur": _dur(sp.start_s, sp.end_s), "args": args}
    for t in r.preemptions:
        yield {"ph": "i", "s": "t", "name": "preempt", "pid": pid, "tid": tid, "ts": _us(t), "args": args}


def perfetto_trace(tl: Timeline, *, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The trace-event JSON document (`{"traceEvents": [...], ...}`) of `tl`."""
    events = list(_engine_events(tl))
    pids: dict[str, int] = {}
    for tid, r in enumerate(tl.requests, start=HOST_LINK_TID + 1):  # tids unique across processes
        pid = pids.get(r.task_id)
        if pid is None:
            pid = pids[r.task_id] = len(pids) + 1
            events += _meta(pid, f"task {r.task_id}" + (f" ({r.workflow})" if r.workflow else ""))
        events += _request_events(r, pid, tid)
    other = {"kv_budget": tl.kv_budget, "now_s": tl.now_s, "requests": len(tl.requests), "tasks": len(pids),
             "time_unit": "simulated seconds, written as microseconds"}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {**other, **(meta or {})}}


def write_trace(tl: Timeline, path: str | Path, *, meta: Mapping[str, Any] | None = None) -> Path:
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(perfetto_trace(tl, meta=meta), separators=(",", ":")))
    except OSError as exc:
        raise ConfigError(f"--timeline: cannot write {out}: {exc.strerror or exc}") from None
    return out


# ---------------------------------------------------------------------- Gantt


def _by_task(tl: Timeline, max_tasks: int | None) -> dict[str, list[RequestTimeline]]:
    tasks: dict[str, list[RequestTimeline]] = {}
    for r in tl.requests:
        if r.task_id not in tasks and max_tasks is not None and len(tasks) >= max_tasks:
            continue
        tasks.setdefault(r.task_id, []).append(r)
    return tasks


def _draw_task(ax: Any, y: int, reqs: list[RequestTimeline], colors: Mapping[str, Any]) -> list[float]:
    """One row: a light bar per stage (first arrival to last end), solid bars where its
    requests ran (prefill, decode); returns the preemption times."""
    stages: dict[str, list[RequestTimeline]] = {}
    for r in reqs:
        stages.setdefault(r.stage, []).append(r)
    for rs in stages.values():
        start, end = min(r.arrival_s for r in rs), max(r.end_s for r in rs)
        color = colors[rs[0].agent]
        ax.barh(y, end - start, left=start, height=0.8, color=color, alpha=0.3, edgecolor=color, linewidth=0.6)
        for r in rs:
            for sp in r.spans:
                if sp.phase in ("prefill", "decode"):
                    ax.barh(y, sp.end_s - sp.start_s, left=sp.start_s, height=0.36, color=color)
    return [t for r in reqs for t in r.preemptions]


def write_gantt(tl: Timeline, path: str | Path, *, max_tasks: int | None = DEFAULT_TIMELINE_TASKS,
                title: str = "") -> Path:
    """Tasks on y (first `max_tasks` by arrival), stages as bars coloured by agent (solid
    where a request of the stage was on the GPU), preemptions as red crosses."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg only; no pyplot state
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    tasks = _by_task(tl, max_tasks)
    agents = sorted({r.agent for rs in tasks.values() for r in rs})
    palette = [f"C{i % 10}" for i in range(len(agents))]
    colors = dict(zip(agents, palette, strict=True))
    fig = Figure(figsize=(12, max(3.0, 0.28 * len(tasks) + 1.6)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    preempts: list[tuple[float, int]] = []
    for y, reqs in enumerate(tasks.values()):
        preempts += [(t, y) for t in _draw_task(ax, y, reqs, colors)]
    if preempts:
        ax.plot([t for t, _ in preempts], [y for _, y in preempts], "x", color="red", markersize=7, mew=1.6)
    ax.set_yticks(range(len(tasks)), list(tasks), fontsize=7)
    ax.invert_yaxis()  # first task on top
    ax.set_xlabel("simulated time (s)")
    ax.grid(axis="x", alpha=0.3)
    handles: list[Any] = [Patch(color=colors[a], label=a) for a in agents]
    handles.append(Line2D([], [], marker="x", color="red", linestyle="none", label="preemption"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or f"{len(tasks)} tasks (light: stage span; solid: on the GPU)", fontsize=9)
    return save_figure(fig, path, "--timeline", dpi=100)


# ---------------------------------------------------------------------- bench


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "run"


def point_label(load: float | None, rate: float) -> str:
    """A point's file-name part: the load as given (0.6), else the rate (r0.0175), each as
    the shortest text that reads back as that float (`:g` kept 6 digits: 0.3000001 and
    0.3000002 wrote one file, the second over the first)."""
    return repr(float(load)) if load is not None else f"r{float(rate)!r}"


def write_bench_timelines(config: Any, out_dir: str | Path,
                          max_tasks: int = DEFAULT_TIMELINE_TASKS) -> list[Path]:
    """For each (point, policy) of `config` (a `BenchConfig`, its `seed` only): run the
    simulation once more with a recorder on the first `max_tasks` tasks (the engine is
    deterministic, so it is the bench's run) and write `<workload>-<policy>-<load>.trace.json`
    and `.gantt.png` under `out_dir`. Returns the paths written."""
    from ..sim import make_trace, simulate
    from .jobs import SimBackend, execute, finite
    from .runner import _point_jobs, plan_points

    if max_tasks < 1:
        raise ConfigError(f"--timeline-tasks must be >= 1, got {max_tasks}")
    out, written = Path(out_dir), []
    for j, point in enumerate(plan_points(config, SimBackend(make_trace, simulate))):
        label = point_label(point.load, point.rate)
        for job in _point_jobs((0, j), point, config):
            rec = TimelineRecorder(RecorderConfig(first_tasks=max_tasks))
            row = execute(job, SimBackend(make_trace, partial(simulate, recorder=rec)))
            tl = rec.timeline(rec.last_end_s)
            stem = _slug(f"{config.name.removesuffix('.jsonl')}-{job.policy}-{label}")  # a trace's file name
            meta = {"workload": config.name, "policy": job.policy, "load": point.load, "rate": finite(point.rate),
                    "seed": config.seed, "tasks_shown": min(max_tasks, len(point.trace)),
                    "tasks_run": len(point.trace), "host_tier": job.host_tier,
                    "run": {k: row[k] for k in ("mean_jct", "p99_jct", "preemptions", "prefix_swaps")}}
            written.append(write_trace(tl, out / f"{stem}.trace.json", meta=meta))
            title = (f"{config.name} / {job.policy} / load {label}, seed {config.seed}: first "
                     f"{meta['tasks_shown']} of {len(point.trace)} tasks (light: stage; solid: on the GPU)")
            written.append(write_gantt(tl, out / f"{stem}.gantt.png", max_tasks=max_tasks, title=title))
    return written
