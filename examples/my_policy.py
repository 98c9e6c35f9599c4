"""A scheduling policy of your own, run by every entry point without touching the package.

    topas bench --workload dag4 --policies lpm,topas,my_policy:ShortestInputFirst --tasks 60
    topas bench --workload dag4 --policies lpm,my_policy:ShortestInputFirst \
        --policy-opt my_policy:ShortestInputFirst.max_batch=8
    topas serve --engine sim --policy my_policy:ShortestInputFirst --workflow dag4

(run from this directory, or with it on PYTHONPATH: a `module:factory` name is imported from
the working directory too). An installed package names its policies instead, in its
pyproject.toml:

    [project.entry-points."topas_agents.policies"]
    sif = "my_package.policies:ShortestInputFirst"

A policy is an object with a `name` and `decide(snapshot) -> Decision`. It reads a frozen
Snapshot (waiting and running requests, agent prefixes and where they live, the KV budget)
and says what to change; the engine checks the Decision (`check_decision`) and applies it.
It never touches the engine. `greedy_admit` packs requests in the given order while they fit
the KV budget, evicting least-recently-used idle prefixes to make room.
"""

from __future__ import annotations

from topas_agents.policies.greedy import greedy_admit
from topas_agents.snapshot import Decision, Snapshot


class ShortestInputFirst:
    """Admit the waiting requests with the fewest input tokens first (ties: arrival order)."""

    name = "sif"

    def __init__(self, max_batch: int | None = None) -> None:
        if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        self.max_batch = max_batch

    def decide(self, snap: Snapshot) -> Decision:
        room = len(snap.waiting) if self.max_batch is None else max(0, self.max_batch - len(snap.running))
        order = sorted(snap.waiting, key=lambda r: (r.input_tokens, r.arrival_s))[:room]
        return greedy_admit(snap, order)


if __name__ == "__main__":
    from topas_agents.costmodel import load_profile
    from topas_agents.sim import make_trace, simulate
    from topas_agents.workflow import load_workflow

    trace = make_trace(load_workflow("dag4"), rate=0.1, n_tasks=30, seed=0)
    result = simulate(trace, ShortestInputFirst(), load_profile("a100-80g-qwen2.5-32b"), check=True)
    print(f"sif on dag4: mean JCT {result.mean_jct:.1f} s, p99 {result.p99_jct:.1f} s")
