"""One view of N replicas' `/v1/topas/stats` (pure functions; the front calls them).

JCT is recomputed from the replicas' task lists, so percentiles are over the whole cluster.
A task seen on more than one replica (a failover re-homed it) counts once: arrival is its
earliest arrival anywhere and finish its latest finish, which is the JCT the client lived.
Replica times are seconds of independent clocks: a restarted replica's starts again at 0, and
replicas started together differ by their start-up skew. The stats are fetched from every
replica at once, so each replica's `now_s` marks the same instant: every task's times are
moved onto the clock of the replica that reads latest (`ReplicaTasks.shift_s`) before they are
merged. Without it a split task ran from a restarted replica's early arrival to the others'
late finish (a 2 s task reported as 849 s).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from topas_agents.percentile import percentile_or_none
from topas_agents.task_tracker import NO_JCT


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


class FrontAnswer(NamedTuple):
    """What the front answers a fanned-out call with: a status and a JSON body."""

    status: int
    body: dict[str, Any]


class ReplicaTasks(NamedTuple):
    """One replica's task items, and what moves its times onto the common clock."""

    replica: int  # 1-based
    items: Sequence[Mapping[str, Any]]
    shift_s: float = 0.0  # added to its arrival_s and finish_s


def merge_tasks(per_replica: Sequence[ReplicaTasks]) -> dict[str, dict[str, Any]]:
    """task id -> merged record in a replica's own item shape (`server/stats.py` `task_json`),
    plus the replicas (1-based) that served it, its times on the common clock. A task served
    by one replica keeps that replica's other fields; a split task (failover) runs from its
    earliest arrival to its latest finish, is done when every part is, and sums its stages'
    counts."""
    merged: dict[str, dict[str, Any]] = {}
    for idx, items, shift in per_replica:
        for item in items:
            tid = item["task_id"]
            m = merged.get(tid)
            if m is None:
                m = merged[tid] = {**item, "replicas": [], "arrival_s": None, "finish_s": None, "done": True,
                                   "stages": {}, "calls": 0}
            m["replicas"].append(idx)
            arr, fin = _shifted(item.get("arrival_s"), shift), _shifted(item.get("finish_s"), shift)
            if arr is not None:
                m["arrival_s"] = arr if m["arrival_s"] is None else min(m["arrival_s"], arr)
            if fin is not None:
                m["finish_s"] = fin if m["finish_s"] is None else max(m["finish_s"], fin)
            m["done"] = m["done"] and bool(item.get("done"))
            if len(m["replicas"]) > 1:  # the first replica's fields are already in the copy
                m["in_flight"] = int(m.get("in_flight") or 0) + int(item.get("in_flight") or 0)
                # a part that failed fails the task; else the first part's reason
                reasons = (m.get("done_reason"), item.get("done_reason"))
                m["done_reason"] = "failed" if "failed" in reasons else reasons[0] or reasons[1]
            for name, stage in (item.get("stages") or {}).items():
                _merge_stage(m["stages"].setdefault(name, {}), stage)
            m["calls"] += sum(int(st.get("calls", 0)) for st in (item.get("stages") or {}).values())
    for m in merged.values():
        done = m["done"] and m["finish_s"] is not None and m["arrival_s"] is not None
        m["jct_s"] = m["finish_s"] - m["arrival_s"] if done and m.get("done_reason") not in NO_JCT else None
        if not m["done"]:
            m["done_reason"] = None
    return merged


def _shifted(t: Any, shift_s: float) -> float | None:
    return t + shift_s if isinstance(t, int | float) and not isinstance(t, bool) else None


def _common_clock(live: Sequence[tuple[int, Mapping[str, Any]]]) -> list[ReplicaTasks]:
    """Each live replica's tasks with the shift onto the latest-reading replica's clock (none
    for a replica that reports no clock)."""
    clocks = {i: s["now_s"] for i, s in live if isinstance(s.get("now_s"), int | float)}
    ref = max(clocks.values(), default=0.0)
    return [ReplicaTasks(i, (s.get("tasks") or {}).get("items") or [], ref - clocks[i] if i in clocks else 0.0)
            for i, s in live]


def _merge_stage(into: dict[str, Any], stage: Mapping[str, Any]) -> None:
    """One replica's counts of a stage added to the merged stage (done: on any replica)."""
    for key, value in stage.items():
        if isinstance(value, bool):
            into[key] = into.get(key, False) or value
        elif isinstance(value, int | float):
            into[key] = into.get(key, 0) + value


def common_server(bodies: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The replicas' `server` block: each field where every replica that answered agrees, else
    None (so a client reads the engine, clock and responder of the cluster as of one server)."""
    blocks = [b.get("server") if isinstance(b.get("server"), Mapping) else {} for b in bodies]
    out: dict[str, Any] = {}
    for key in ("engine", "policy", "profile", "time_scale", "responder", "model"):
        values = {repr(blk.get(key)) for blk in blocks}
        out[key] = blocks[0].get(key) if blocks and len(values) == 1 else None
    return out


def _jct(tasks: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    jcts = sorted(t["finish_s"] - t["arrival_s"] for t in tasks.values()
                  if t["done"] and t["finish_s"] is not None and t["arrival_s"] is not None
                  and t.get("done_reason") not in NO_JCT)  # no call finished, or failed: no JCT
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
    tasks = merge_tasks(_common_clock(live))
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
            # as one server counts them: `done` has a JCT; a task that ended without one is
            # `failed` (the client said so) or `abandoned` (no call finished), not done
            "tasks": {"seen": len(tasks), "done": sum(1 for t in tasks.values() if t["jct_s"] is not None),
                      "failed": sum(1 for t in tasks.values() if t["done"] and t.get("done_reason") == "failed"),
                      "abandoned": sum(1 for t in tasks.values()
                                       if t["done"] and t.get("done_reason") == "abandoned"),
                      "split": len(split), "split_ids": split[:100]},
            "jct": _jct(tasks),
            "clock_skew_s": (max(clocks) - min(clocks)) if clocks else None,
        },
        "replicas": replicas,
        # what a client reads from one server's stats, in the same shape (topas run/eval --server)
        "server": common_server(bodies),
        "tasks": {"items": list(tasks.values())},
        "calls": [c for s in bodies for c in (s.get("calls") or [])],
    }


def pick_owner_answer(answers: Sequence[ReplicaAnswer]) -> FrontAnswer:
    """A fanned-out task/stage `done`: the owners answer 2xx, the others 404. Status and body
    for the client: the first 2xx; else the first non-404 error (an owner's refusal, such as
    409 for a closed task); else, if some replica did not answer, 502: the outcome is unknown,
    since the silent replica may own the task and close it once it answers (a hung owner did);
    else 404 (every replica answered and none knows the task)."""
    summary = [a.brief() for a in answers]
    for group in ([a for a in answers if a.ok],
                  [a for a in answers if a.status is not None and a.status != 404]):
        if group:
            return _relayed(group[0], summary)
    silent = [a.url for a in answers if a.status is None]
    if silent:
        known = "no replica that answered knows the task" if len(silent) < len(answers) else "no replica answered"
        return FrontAnswer(502, _server_error(f"outcome unknown: {known}, and {', '.join(silent)} did not answer "
                                              "(the task may be theirs); retry once they answer", summary))
    return _relayed(answers[0], summary)


def _relayed(answer: ReplicaAnswer, summary: list[dict[str, Any]]) -> FrontAnswer:
    """One replica's answer as the front's, with every replica's status listed."""
    body = dict(answer.body) if isinstance(answer.body, Mapping) else {"detail": answer.body}
    return FrontAnswer(int(answer.status or 502), {**body, "replicas": summary})


def _server_error(message: str, summary: list[dict[str, Any]]) -> dict[str, Any]:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": None},
            "replicas": summary}


def no_replica_served(answers: Sequence[ReplicaAnswer], what: str) -> FrontAnswer | None:
    """503 for a fanned-out read that no replica served (down, hung or 5xx): an empty
    aggregate would read as a real answer ("no workflows", "no samples"). None otherwise."""
    if any(a.ok for a in answers):
        return None
    summary = [a.brief() for a in answers]
    return FrontAnswer(503, {"error": {"message": f"no replica answered {what}: see replicas",
                                       "type": "service_unavailable", "param": None, "code": None},
                             "replicas": summary})


def missing_replicas(answers: Sequence[ReplicaAnswer]) -> list[str]:
    """The URLs of the replicas whose part is missing from a fanned-out read's aggregate."""
    return [a.url for a in answers if not a.ok]


def client_error(answers: Sequence[ReplicaAnswer]) -> FrontAnswer | None:
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
    return FrontAnswer(first.status, {**body, "replicas": [a.brief() for a in answers]})


def pick_registration_answer(answers: Sequence[ReplicaAnswer]) -> FrontAnswer:
    """A fanned-out workflow registration: a refusal (4xx/5xx) wins; else 201 if any replica
    created it, 200 if all had it; unreachable replicas are listed (the front replays the
    registration on them when they restart). A refusal next to acceptances is a split: the
    replicas now disagree (one had another definition under the name), so the refusal's
    message says which replicas took it and which refused (`registration_split`)."""
    summary = [a.brief() for a in answers]
    refused = [a for a in answers if a.status is not None and a.status >= 400]
    oks = [a for a in answers if a.ok]
    if refused:
        status, body = _relayed(refused[0], summary)
        if oks:
            body["error"] = {**_error_fields(body), "message": split_message(oks, refused, body)}
            body["split"] = {"accepted": [a.url for a in oks], "refused": [a.url for a in refused]}
        return FrontAnswer(status, body)
    if not oks:
        return FrontAnswer(502, _server_error("no replica answered", summary))
    body = dict(oks[0].body) if isinstance(oks[0].body, Mapping) else {}
    body["created"] = any(a.status == 201 for a in oks)
    return FrontAnswer(201 if body["created"] else 200, {**body, "replicas": summary})


def _error_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    err = body.get("error")
    return dict(err) if isinstance(err, Mapping) else {"type": "conflict_error", "param": None, "code": None}


def split_message(oks: Sequence[ReplicaAnswer], refused: Sequence[ReplicaAnswer], body: Mapping[str, Any]) -> str:
    """What a split registration did, for the caller who must now fix it."""
    reason = _error_fields(body).get("message") or body.get("detail") or "refused"
    took = ", ".join(f"{a.url} ({a.status})" for a in oks)
    refusers = ", ".join(f"{a.url} ({a.status})" for a in refused)
    return (f"registration split across replicas: accepted by {took}; refused by {refusers}: {reason}. "
            "The replicas now hold different workflows under this name; the front did not record "
            "it, so a restarted replica does not get it back. Register it under a new name")


# The per-replica "did the front get its metrics" sample, so that a scrape with a replica
# missing says so (its other families simply have no samples for it).
REPLICA_UP_FAMILY = "topas_replica_up"
REPLICA_RESTARTS_FAMILY = "topas_replica_restarts_total"


def replica_up_metric(texts: Sequence[object | None]) -> str:
    """`topas_replica_up{replica="i"} 1|0`: 1 when replica i's metrics are in the scrape (its
    entry in `texts` is not None)."""
    lines = [f"# HELP {REPLICA_UP_FAMILY} 1 if the front got this replica's metrics, 0 if it did not answer or its text did not parse.",
             f"# TYPE {REPLICA_UP_FAMILY} gauge",
             *(f'{REPLICA_UP_FAMILY}{{replica="{i}"}} {int(t is not None)}' for i, t in enumerate(texts, start=1))]
    return "".join(f"{line}\n" for line in lines)


def replica_restarts_metric(restarted: Sequence[int], replicas: int) -> str:
    """`topas_replica_restarts_total{replica="i"}`: the replica processes started in place of
    one that died. A restarted replica's own counters begin again at 0, which alone read as a
    quiet spell on a dashboard; Prometheus's `resets()` and this counter tell it apart."""
    lines = [f"# HELP {REPLICA_RESTARTS_FAMILY} Replica processes started again after a death.",
             f"# TYPE {REPLICA_RESTARTS_FAMILY} counter",
             *(f'{REPLICA_RESTARTS_FAMILY}{{replica="{i}"}} {restarted.count(i)}' for i in range(1, replicas + 1))]
    return "".join(f"{line}\n" for line in lines)


def merge_metrics(texts: Sequence[str | None]) -> str:
    """The replicas' Prometheus texts as one, each sample labelled `replica="i"`: parsed and
    written again by prometheus_client, so a family's HELP/TYPE lines come once, followed by
    its samples from every replica (the format wants a family's lines together), and the
    names are the replicas' (a counter's `_total`, a histogram's `_bucket`/`_sum`/`_count`,
    the `_created` gauges; a counter typed without `_total`, which no prometheus_client
    exporter writes, gets it from the parser). A replica's own `replica` label is kept as
    `exported_replica`, as Prometheus keeps a target's label that its own would overwrite. A
    text that does not parse adds nothing (a replica that answered something else than metrics)."""
    return _merged([_parsed_metrics(text) for text in texts])


def metrics_page(texts: Sequence[str | None], restarted: Sequence[int]) -> str:
    """The front's `/metrics` from the replicas' texts (None: no answer) and the replica of
    each restart: `topas_replica_up`, `topas_replica_restarts_total`, then the merged
    families. A replica whose text does not parse is not up: none of its metrics are in it."""
    parsed = [_parsed_metrics(text) for text in texts]
    return replica_up_metric(parsed) + replica_restarts_metric(restarted, len(texts)) + _merged(parsed)


def _merged(parsed: Sequence[list[Metric] | None]) -> str:
    families: dict[str, Metric] = {}
    for replica, metrics in enumerate(parsed, start=1):
        for family in metrics or ():
            # keyed by name alone: the format allows one TYPE line per name
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            if family.type != merged.type:  # a replica of another version: its samples would not fit the TYPE
                continue
            merged.samples += [_with_replica(sample, replica) for sample in family.samples]
    return generate_latest(_MergedFamilies(list(families.values()))).decode("utf-8")


def _parsed_metrics(text: str | None) -> list[Metric] | None:
    """A replica's metric families; None when it sent none or text that does not parse."""
    if text is None:
        return None
    try:
        return list(text_string_to_metric_families(text))
    except ValueError:
        return None


def _with_replica(sample: Sample, replica: int) -> Sample:
    labels = dict(sample.labels)
    if "replica" in labels:
        labels["exported_replica"] = labels.pop("replica")
    return sample._replace(labels={"replica": str(replica), **labels})


class _MergedFamilies(Collector):
    """The merged families, as `generate_latest` reads them (a collector)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families
