"""The simulated serving engine (the embedded default) and its offline workflow driver.

    from topas_agents.sim import SimEngine, EngineRequest, make_trace, simulate

See docs/simulator.md for the model, its choices and what it leaves out.
"""

from __future__ import annotations

# The request type and its errors are the core engine contract (topas_agents.engine);
# re-exported here because `from topas_agents.sim import EngineRequest` is documented usage.
from ..engine import EngineRequest, OverBudgetError, RequestError
from .driver import make_trace, simulate
from .engine import SimEngine
from .record import RecorderConfig, Timeline, TimelineRecorder
from .residency import PrefixCacheCount
from .steps import PREFILL_CHUNK_TOKENS
from .types import (
    BENCH_KEYS,
    EngineStats,
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
    "PrefixCacheCount",
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
