"""The simulated serving engine (the embedded default) and its offline workflow driver.

    from topas_agents.sim import SimEngine, EngineRequest, make_trace, simulate

See docs/simulator.md for the model, its choices and what it leaves out.
"""

from __future__ import annotations

from .driver import make_trace, simulate
from .engine import SimEngine
from .record import RecorderConfig, Timeline, TimelineRecorder
from .steps import PREFILL_CHUNK_TOKENS
from .types import (
    BENCH_KEYS,
    EngineRequest,
    EngineStats,
    OverBudgetError,
    RequestError,
    RunResult,
    StallError,
    TaskResult,
)

__all__ = [
    "BENCH_KEYS",
    "PREFILL_CHUNK_TOKENS",
    "EngineRequest",
    "EngineStats",
    "OverBudgetError",
    "RecorderConfig",
    "RequestError",
    "RunResult",
    "SimEngine",
    "StallError",
    "TaskResult",
    "Timeline",
    "TimelineRecorder",
    "make_trace",
    "simulate",
]
