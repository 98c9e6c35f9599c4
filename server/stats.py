"""`GET /v1/topas/stats`: tasks, stages, prefixes, queues, engine stats and per-call labels.

Built inside the engine task (it reads the engine's snapshot and stats).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, get_args

from topas_agents.percentile import percentile_or_none
from topas_agents.snapshot import PrefixLocation
from topas_agents.task_tracker import TaskState

from .tenancy import Tenant, owned_by, unqualify

if TYPE_CHECKING:
    from .service import SimService


def task_json(task: TaskState, tenant: Tenant = None) -> dict[str, Any]:
    return {
        "task_id": unqualify(tenant, task.task_id),
        "workflow": task.workflow_name,
        "workflow_registered": task.workflow is not None,
        "unlabelled": task.unlabelled,
        "arrival_s": task.arrival_s,
        "finish_s": task.finish_s,
        "jct_s": task.jct_s,
        "done": task.done_reason is not None,
        "done_reason": task.done_reason,
        "in_flight": task.in_flight,
        "reopened": task.reopened,
        "stages": {
            name: {"calls": st.calls, "finished": st.finished, "in_flight": st.in_flight, "done": st.done}
            for name, st in task.stages.items()
        },
    }


def engine_stats_json(stats: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        return dataclasses.asdict(stats)
    if isinstance(stats, dict):
        return dict(stats)
    return {k: v for k, v in vars(stats).items() if not k.startswith("_")}


def engine_view(svc: SimService, tenant: Tenant = None) -> dict[str, Any]:
    """Queues, batch, KV and resident prefixes (a tenant sees only its own agents' prefixes)."""
    snap = svc.engine.snapshot()
    return {
        "now_s": snap.now,
        "batch_size": len(snap.running),
        "queues": {"waiting": len(snap.waiting), "running": len(snap.running)},
        "kv": {"used": snap.kv_used, "budget": snap.kv_budget},
        "prefixes": [
            {"agent": unqualify(tenant, p.agent), "tokens": p.tokens, "location": p.location,
             "running": p.running, "last_used_s": p.last_used_s}
            for p in snap.prefixes if owned_by(tenant, p.agent)
        ],
    }


LOCATIONS: tuple[PrefixLocation, ...] = get_args(PrefixLocation)


def prefixes_by_location(prefixes: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """location -> (prefix count, their tokens), every location present (zeros included);
    `prefixes` as in `engine_view`. An unknown location (another engine's) is kept too."""
    out: dict[str, tuple[int, int]] = {loc: (0, 0) for loc in LOCATIONS}
    for p in prefixes:
        n, toks = out.get(p["location"], (0, 0))
        out[p["location"]] = (n + 1, toks + int(p["tokens"]))
    return out


def prefix_cache_json(svc: SimService, tenant: Tenant = None) -> dict[str, Any] | None:
    """Prefix-cache tokens (as /metrics `prefix_cache_queries/hits`): engine-wide totals and
    hit rate, and per agent the tenant's own; None for an engine that does not count them."""
    counts_fn = getattr(svc.engine, "prefix_cache_counts", None)
    if counts_fn is None:
        return None
    counts = counts_fn()
    queries = sum(c.queries for c in counts.values())
    hits = sum(c.hits for c in counts.values())
    return {"queries": queries, "hits": hits, "hit_rate": hits / queries if queries else None,
            "agents": {unqualify(tenant, a): {"queries": c.queries, "hits": c.hits}
                       for a, c in sorted(counts.items()) if owned_by(tenant, a)}}


def jct_summary(svc: SimService) -> dict[str, Any]:
    t = svc.tracker
    recent = [c.jct_s for c in t.jcts]

    def q(p: float) -> float | None:
        return percentile_or_none(recent, 100 * p)

    return {"count": t.jct_count, "sum_s": t.jct_sum, "mean_s": t.jct_sum / t.jct_count if t.jct_count else None,
            "p50_s": q(0.5), "p90_s": q(0.9), "p99_s": q(0.99)}


class StatsRows:
    """The JSON text of stats rows that no longer change (a finished call's record, a task in
    the finished history), kept between stats requests. With 10 000 calls and tasks a request
    built and encoded 8 MB of rows on the engine task, 0.2-0.4 s during which nothing else
    was served (/health waited 0.4 s); now it encodes only the rows that moved since the last
    request and joins the rest. An entry is valid while its row is the same object at the same
    version; rows gone from the histories are dropped when the cache outgrows them."""

    def __init__(self) -> None:
        self._rows: dict[RowKey, EncodedRow] = {}

    def text(self, key: RowKey, row: object, version: object, build: Callable[[], dict[str, Any]]) -> str:
        hit = self._rows.get(key)
        if hit is not None and hit.row is row and hit.version == version:
            return hit.text
        text = json.dumps(build())
        self._rows[key] = EncodedRow(row, version, text)
        return text

    def prune(self, live: set[RowKey]) -> None:
        """Keep only `live` once the cache holds more than twice as many (with API keys a
        request sees its own rows only, so another key's are encoded again after a prune)."""
        if len(self._rows) > 2 * len(live) + 1024:
            self._rows = {k: v for k, v in self._rows.items() if k in live}


class RowKey(NamedTuple):
    kind: Literal["task", "call"]
    id: str  # task id or call rid
    tenant: Tenant  # a task row is as its tenant sees it (ids unqualified)


class EncodedRow(NamedTuple):
    row: object  # the TaskState or CallRecord it encodes
    version: object  # what changes when the row does
    text: str


def _task_rows(svc: SimService, tenant: Tenant, seen: set[RowKey]) -> list[str]:
    t = svc.tracker
    rows = [json.dumps(task_json(x, tenant)) for x in t.active.values() if owned_by(tenant, x.task_id)]
    for x in t.finished.values():  # a finished task is reopened by moving it back to `active`
        if owned_by(tenant, x.task_id):
            key = RowKey("task", x.task_id, tenant)
            seen.add(key)
            # a done call on a finished task changes only its done_reason (to "explicit")
            version = (x.finish_s, x.reopened, x.done_reason)
            rows.append(svc.stats_rows.text(key, x, version, lambda x=x: task_json(x, tenant)))
    return rows


def _call_rows(svc: SimService, records: list[Any], seen: set[RowKey]) -> list[str]:
    rows = []
    for r in records:
        if r.status == "running":
            rows.append(json.dumps(r.to_json()))
        else:  # a record's fields are final with its status
            key = RowKey("call", r.rid, None)
            seen.add(key)
            rows.append(svc.stats_rows.text(key, r, r.status, r.to_json))
    return rows


# Stand-ins for the two row lists in the encoded head: a NUL never reaches a name or label
# (`labels.text_problem` refuses control characters), and the suffix is random per process.
_ROWS_MARK = f"\0rows-{uuid.uuid4().hex}-"


def build_stats_json(svc: SimService, max_calls: int | None = None, tenant: Tenant = None) -> str:
    """`build_stats` as JSON text, the unchanged rows from `svc.stats_rows`."""
    seen: set[RowKey] = set()
    tasks = _task_rows(svc, tenant, seen)
    calls = _call_rows(svc, _records(svc, max_calls, tenant), seen)
    svc.stats_rows.prune(seen)
    head = json.dumps(build_stats(svc, max_calls, tenant, rows=False))
    for name, rows in (("tasks", tasks), ("calls", calls)):
        head = head.replace(json.dumps(_ROWS_MARK + name), f"[{', '.join(rows)}]", 1)
    return head


def _records(svc: SimService, max_calls: int | None, tenant: Tenant) -> list[Any]:
    records = [r for r in svc.records if tenant is None or r.tenant == tenant]
    if max_calls is not None:
        records = records[-max_calls:] if max_calls > 0 else []
    return records


def build_stats(svc: SimService, max_calls: int | None = None, tenant: Tenant = None,
                rows: bool = True) -> dict[str, Any]:
    """The whole state; with API keys, `tenant`'s own tasks, calls, prefixes and workflows.
    `rows=False`: without the task items and call records (`build_stats_json` adds them)."""
    t = svc.tracker
    # one record per (workflow, stage): a "workflow/stage" key merged `a/b`'s stage `c` with
    # `a`'s stage `b/c` (names may hold "/"); workflow None: calls labelled without one. With
    # API keys, each key's own calls (a shared built-in's counts showed every key's calls)
    stages = [{"workflow": key.workflow, "stage": key.stage, "calls": n, "tasks": t.stage_tasks[key]}
              for key, n in sorted(t.stage_calls.items(), key=lambda kv: (kv[0].workflow or "", kv[0].stage))
              if key.owner == tenant]
    cfg = svc.config
    return {
        "server": {"engine": cfg.engine, "policy": cfg.policy, "profile": cfg.profile,
                   "time_scale": cfg.time_scale, "responder": cfg.responder, "model": cfg.model_name,
                   "status": svc.status},
        **engine_view(svc, tenant),
        "engine": engine_stats_json(svc.engine.stats()),
        "workflows": svc.registry.names(tenant),
        "requests": {"in_flight": len(svc.calls), "calls_by_status": dict(svc.call_status),
                     "http": [{"endpoint": e, "status": s, "count": n} for (e, s), n in sorted(svc.requests.items())]},
        "jct": jct_summary(svc),
        "prefix_cache": prefix_cache_json(svc, tenant),
        "tasks": {
            "active": len(t.active),
            "done": t.jct_count,
            "abandoned": t.abandoned,
            "failed": t.failed,
            "items": [task_json(x, tenant) for x in list(t.active.values()) + list(t.finished.values())
                      if owned_by(tenant, x.task_id)] if rows else _ROWS_MARK + "tasks",
        },
        "stages": stages,
        "calls": [r.to_json() for r in _records(svc, max_calls, tenant)] if rows else _ROWS_MARK + "calls",
    }
