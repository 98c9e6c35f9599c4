"""Oracle lower bound on mean JCT for one arrival trace.

Two bounds, each valid for every schedule on the simulated engine, reported separately:

* critical path: a task cannot finish sooner than its DAG's longest path with every call
  alone at batch 1, prefix resident, tool waits included (they are real latency).
* work bound: price every task at its minimum GPU-seconds (`work.task_work_s`, calls at
  the fullest batch the KV budget allows) and serve those amounts on one fluid server,
  shortest-remaining-work-first, over the same arrivals. SRPT minimises mean response time
  on a single server, and no real schedule can do more than one GPU-second of that work
  per second, so its mean is a bound.

LB = max(mean critical path, work bound). A per-task max of the two would not be a bound
(the SRPT schedule that attains the work bound may finish some tasks faster than their
critical path), so only the means are combined.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..costmodel import Profile
from ..workflow import TaskPlan
from .work import critical_path_s, min_request_kv, task_work_s


@dataclass(frozen=True, slots=True)
class LowerBound:
    mean_jct: float  # max(critical_path, work_bound)
    critical_path: float  # mean over tasks of the batch-1 critical path
    work_bound: float  # mean response time of the SRPT fluid server

    def as_dict(self) -> dict[str, float]:
        return {"mean_jct": self.mean_jct, "critical_path": self.critical_path,
                "work_bound": self.work_bound}


def srpt_mean_response(arrivals: Sequence[float], works: Sequence[float]) -> float:
    """Mean (finish - arrival) of preemptive shortest-remaining-work-first on a unit-rate
    server. Ties in remaining work go to the earlier arrival."""
    if len(arrivals) != len(works):
        raise ValueError("arrivals and works differ in length")
    n = len(arrivals)
    if n == 0:
        return 0.0
    order = sorted(range(n), key=lambda i: (arrivals[i], i))
    heap: list[tuple[float, int]] = []
    total = 0.0
    now = 0.0
    k = 0
    while k < n or heap:
        next_arrival = arrivals[order[k]] if k < n else math.inf
        if not heap:
            now = max(now, next_arrival)
        if heap and now + heap[0][0] <= next_arrival:
            remaining, i = heapq.heappop(heap)
            now += remaining
            total += now - arrivals[i]
            continue
        if heap:  # serve the shortest job until the next arrival, then reconsider
            remaining, i = heapq.heappop(heap)
            heapq.heappush(heap, (remaining - (next_arrival - now), i))
            now = next_arrival
        i = order[k]
        heapq.heappush(heap, (works[i], i))
        k += 1
    return total / n


def lower_bound(trace: Sequence[TaskPlan], profile: Profile, kv_budget: int | None = None) -> LowerBound:
    """The oracle lower bound on mean JCT of `trace` (see module docstring)."""
    if not trace:
        return LowerBound(0.0, 0.0, 0.0)
    budget = profile.kv_budget_tokens if kv_budget is None else kv_budget
    min_kv = min_request_kv(trace)
    crit = sum(critical_path_s(profile, t) for t in trace) / len(trace)
    works = [task_work_s(profile, budget, t, min_kv) for t in trace]
    work = srpt_mean_response([t.arrival_s for t in trace], works)
    return LowerBound(max(crit, work), crit, work)
