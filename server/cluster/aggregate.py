"""One view of N replicas' `/v1/topas/stats` (pure functions; the front calls them).

JCT is recomputed from the replicas' task lists, so percentiles are over the whole cluster.
A task seen on more than one replica (a failover re-homed it) counts once: arrival is its
earliest arrival anywhere and finish its latest finish, which is the JCT the client lived.
Replica times are simulated seconds of independent clocks; for sim replicas started together
with one time scale they agree to within the start-up skew, which the view reports.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topas_agents.percentile import percentile_or_none


@dataclass(frozen=True, slots=True)
class ReplicaAnswer:
    """One replica's answer to a control-plane call (status None: unreachable)."""

    url: str
    status: int | None
    body: Any
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def brief(self) -> dict[str, Any]:
        out: dict[str, Any] = {"url": self.url, "status": self.status}
        if self.error:
            out["error"] = self.error
        return out


def _quantile(values: Sequence[float], p: float) -> float | None:
    return percentile_or_none(values, 100 * p)


def merge_tasks(per_replica: Sequence[tuple[int, Sequence[Mapping[str, Any]]]]) -> dict[str, dict[str, Any]]:
    """task id -> merged record with the replicas (1-based) that served it."""
    merged: dict[str, dict[str, Any]] = {}
    for idx, items in per_replica:
        for item in items:
            tid = item["task_id"]
            m = merged.setdefault(tid, {"task_id": tid, "replicas": [], "arrival_s": None, "finish_s": None,
                                        "done": True, "calls": 0})
            m["replicas"].append(idx)
            arr, fin = item.get("arrival_s"), item.get("finish_s")
            if arr is not None:
                m["arrival_s"] = arr if m["arrival_s"] is None else min(m["arrival_s"], arr)
            if fin is not None:
                m["finish_s"] = fin if m["finish_s"] is None else max(m["finish_s"], fin)
            m["done"] = m["done"] and bool(item.get("done"))
            m["calls"] += sum(int(st.get("calls", 0)) for st in (item.get("stages") or {}).values())
    return merged


def _jct(tasks: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    jcts = sorted(t["finish_s"] - t["arrival_s"] for t in tasks.values()
                  if t["done"] and t["finish_s"] is not None and t["arrival_s"] is not None)
    return {"count": len(jcts), "mean_s": sum(jcts) / len(jcts) if jcts else None,
            "p50_s": _quantile(jcts, 0.5), "p90_s": _quantile(jcts, 0.9), "p99_s": _quantile(jcts, 0.99)}


def _sum_counters(dicts: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for d in dicts:
        total.update({k: int(v) for k, v in d.items()})
    return dict(total)


def aggregate_stats(answers: Sequence[ReplicaAnswer]) -> dict[str, Any]:
    """The cluster view: totals, cluster-wide JCT, split tasks, and each replica's summary."""
    live = [(i + 1, a.body) for i, a in enumerate(answers) if a.ok and isinstance(a.body, Mapping)]
    tasks = merge_tasks([(i, (s.get("tasks") or {}).get("items") or []) for i, s in live])
    split = sorted(tid for tid, t in tasks.items() if len(set(t["replicas"])) > 1)
    clocks = [s["now_s"] for _, s in live if isinstance(s.get("now_s"), (int, float))]
    replicas = []
    for i, a in enumerate(answers):
        row = {"replica": i + 1, **a.brief()}
        if a.ok and isinstance(a.body, Mapping):
            s = a.body
            row.update({"now_s": s.get("now_s"), "queues": s.get("queues"), "kv": s.get("kv"),
                        "jct": s.get("jct"), "tasks_active": (s.get("tasks") or {}).get("active"),
                        "calls_by_status": (s.get("requests") or {}).get("calls_by_status")})
        replicas.append(row)
    bodies = [s for _, s in live]
    return {
        "cluster": {
            "replicas": len(answers), "replicas_up": len(live),
            "queues": _sum_counters([s.get("queues") or {} for s in bodies]),
            "kv": _sum_counters([s.get("kv") or {} for s in bodies]),
            "calls_by_status": _sum_counters([(s.get("requests") or {}).get("calls_by_status") or {}
                                              for s in bodies]),
            "in_flight": sum(int((s.get("requests") or {}).get("in_flight") or 0) for s in bodies),
            "tasks": {"seen": len(tasks), "done": sum(1 for t in tasks.values() if t["done"]),
                      "split": len(split), "split_ids": split[:100]},
            "jct": _jct(tasks),
            "clock_skew_s": (max(clocks) - min(clocks)) if clocks else None,
        },
        "replicas": replicas,
    }


def pick_owner_answer(answers: Sequence[ReplicaAnswer]) -> tuple[int, dict[str, Any]]:
    """A fanned-out task/stage `done`: the owners answer 2xx, the others 404. Status and body
    for the client: the first 2xx; else the first non-404 error; else 404 (no replica knows it)."""
    summary = [a.brief() for a in answers]
    for group in ([a for a in answers if a.ok],
                  [a for a in answers if a.status is not None and a.status != 404],
                  [a for a in answers if a.status == 404]):
        if group:
            first = group[0]
            body = dict(first.body) if isinstance(first.body, Mapping) else {"detail": first.body}
            return int(first.status or 502), {**body, "replicas": summary}
    return 502, {"error": {"message": "no replica answered", "type": "server_error", "param": None,
                           "code": None}, "replicas": summary}


def client_error(answers: Sequence[ReplicaAnswer]) -> tuple[int, dict[str, Any]] | None:
    """A fanned-out read that no replica served because the request itself is wrong (a bad
    query, missing credentials): every replica that answered said 4xx. Status and body of the
    first such answer, with the replicas listed; None when some replica served it, or none
    answered at all (then the aggregate shows the replicas as down)."""
    if any(a.ok for a in answers):
        return None
    refused = [a for a in answers if a.status is not None and 400 <= a.status < 500]
    if not refused or len(refused) < sum(a.status is not None for a in answers):
        return None
    first = refused[0]
    body = dict(first.body) if isinstance(first.body, Mapping) else {"detail": first.body}
    return first.status, {**body, "replicas": [a.brief() for a in answers]}


def pick_registration_answer(answers: Sequence[ReplicaAnswer]) -> tuple[int, dict[str, Any]]:
    """A fanned-out workflow registration: any 4xx wins (it is the same on every replica);
    else 201 if any replica created it, 200 if all had it; unreachable replicas are listed."""
    summary = [a.brief() for a in answers]
    for a in answers:
        if a.status is not None and a.status >= 400:
            body = dict(a.body) if isinstance(a.body, Mapping) else {"detail": a.body}
            return a.status, {**body, "replicas": summary}
    oks = [a for a in answers if a.ok]
    if not oks:
        return 502, {"error": {"message": "no replica answered", "type": "server_error", "param": None,
                               "code": None}, "replicas": summary}
    body = dict(oks[0].body) if isinstance(oks[0].body, Mapping) else {}
    body["created"] = any(a.status == 201 for a in oks)
    return (201 if body["created"] else 200), {**body, "replicas": summary}


def _with_replica(line: str, replica: int) -> str:
    name, sep, rest = line.partition("{")
    if sep:
        return f'{name}{{replica="{replica}",{rest}'
    metric, _, value = line.partition(" ")
    return f'{metric}{{replica="{replica}"}} {value}'


def merge_metrics(texts: Sequence[str | None]) -> str:
    """The replicas' Prometheus texts as one, each sample labelled `replica="i"`; a family's
    HELP/TYPE lines once, followed by its samples from every replica (the format wants a
    family's lines together)."""
    families: dict[str, tuple[list[str], list[str]]] = {}  # name -> (meta lines, samples)
    for replica, text in enumerate(texts, start=1):
        current = ""
        for line in (text or "").splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split()
                current = parts[2] if len(parts) > 2 else current
                meta, _ = families.setdefault(current, ([], []))
                if line not in meta:
                    meta.append(line)
                continue
            families.setdefault(current, ([], []))[1].append(_with_replica(line, replica))
    return "".join(f"{line}\n" for meta, samples in families.values() for line in (*meta, *samples))
