"""Public value types of the simulated engine: statistics and results out.

Requests in (`EngineRequest`) and the errors `submit` raises are the core engine contract,
`topas_agents.engine`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import TopasError


class StallError(TopasError, RuntimeError):
    """The engine went idle with work left (a policy that never admits what is waiting)."""


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counters since the engine started. Decision timings are wall-clock, hence not compared."""

    decisions: int
    decision_ms_mean: float = field(compare=False)
    decision_ms_p99: float = field(compare=False)
    mean_batch: float  # decode batch size, weighted by decode time
    prefix_swaps_in: int
    prefix_swaps_out: int
    prefix_recomputes: int
    preemptions: int
    busy_s: float  # GPU time in prefill or decode steps
    tokens_generated: int
    requests_finished: int
    requests_cancelled: int
    prefill_steps: int
    decode_steps: int
    prefill_tokens: int  # uncached tokens prefilled (prefix recomputes and re-prefills included)
    runs: int  # prefill steps plus decode jumps (engine work items)
    now: float


@dataclass(frozen=True, slots=True)
class TaskResult:
    task_id: str
    workflow: str
    arrival_s: float
    finish_s: float
    jct_s: float


# The keys `topas bench` reports (RunResult.as_dict()).
BENCH_KEYS = (
    "mean_jct",
    "p99_jct",
    "first_task_s",
    "throughput_rps",
    "mean_batch",
    "prefix_swaps",
    "preemptions",
    "decision_ms_mean",
    "decision_ms_p99",
)


@dataclass(frozen=True, slots=True)
class RunResult:
    """One simulated run. Equal seeds give equal results (decision timings excluded).

    - `makespan_s`: last task finish minus first task arrival.
    - `first_task_s`: first task completion minus first task arrival.
    - `throughput_rps`: LLM requests completed per second of makespan.
    - `p99_jct`: numpy's default percentile (linear interpolation between order statistics).
    """

    policy: str
    tasks: tuple[TaskResult, ...]
    makespan_s: float
    mean_jct: float
    p99_jct: float
    first_task_s: float
    throughput_rps: float
    mean_batch: float
    prefix_swaps: int  # transfers in + out
    prefix_recomputes: int
    preemptions: int
    decision_ms_mean: float = field(compare=False)
    decision_ms_p99: float = field(compare=False)
    requests: int
    stats: EngineStats

    def as_dict(self, *, full: bool = False) -> dict[str, Any]:
        """The bench's JSON keys (`full=True` adds makespan, counts and engine stats)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in BENCH_KEYS}
        if full:
            out.update(
                policy=self.policy,
                tasks=len(self.tasks),
                makespan_s=self.makespan_s,
                prefix_recomputes=self.prefix_recomputes,
                requests=self.requests,
                decisions=self.stats.decisions,
                busy_s=self.stats.busy_s,
            )
        return out
