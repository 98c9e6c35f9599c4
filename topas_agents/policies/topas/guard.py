"""The work-conserving guard: the GPU never sits idle while a waiting request could run.

Topas's search changes the resident set by at most one drop or swap per repair step, so when
several *idle* prefixes (no running or waiting request) fill the KV and every waiting request
needs a large prefix, it can find no state better than the empty incumbent, decide nothing,
and stall for ever (random-suite workflows with prefixes summing to ~4x the budget did: 3 of
24 workflows). An idle GPU with work waiting is never the best state: this guard then evicts
idle prefixes, least recently used first, until the oldest task's waiting request fits, and
admits it with every further request of the same agent that fits (Parrot order: oldest task
first, so the fallback cannot starve anyone).
"""

from __future__ import annotations

from ...snapshot import NOOP, Decision, Snapshot
from ..baselines import task_fcfs_key


def work_conserving(snap: Snapshot, decision: Decision) -> Decision:
    """`decision`, unless it leaves the GPU idle with requests waiting: then the fallback."""
    if len(snap.running) > len(decision.preempt) or not snap.waiting or decision.admit:
        return decision  # something runs after it (a preempt-only decision can empty the GPU)
    gpu = {p.agent: p for p in snap.prefixes if p.on_gpu}
    used = sum(p.tokens for p in gpu.values()) + sum(r.kv_tokens for r in snap.running)
    for first in sorted(snap.waiting, key=task_fcfs_key):
        own = first.prefix_tokens if first.agent not in gpu else 0
        evictable = sorted((p for a, p in gpu.items() if a != first.agent and p.location == "gpu" and not p.running),
                           key=lambda p: (p.last_used_s, p.agent))
        need = used + own + first.kv_tokens - snap.kv_budget
        out: list[str] = []
        for p in evictable:
            if need <= 0:
                break
            out.append(p.agent)
            need -= p.tokens
        if need > 0:
            continue  # cannot fit even alone (a loading prefix holds KV): try the next task
        free = -need
        admit = [first.rid]
        for r in sorted(snap.waiting, key=task_fcfs_key):
            if r.rid != first.rid and r.agent == first.agent and r.kv_tokens <= free:
                admit.append(r.rid)
                free -= r.kv_tokens
        return Decision(admit=tuple(admit), prefix_out=tuple(out))
    return NOOP if decision.preempt else decision  # never empty the GPU for nothing
