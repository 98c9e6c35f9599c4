"""The engine contract: what a serving engine accepts and the online API it offers.

    EngineRequest   one LLM call as an engine sees it (labels resolved to sizes)
    Engine          the online API the embedded server drives (`topas_agents.sim.SimEngine`
                    implements it; a test fake or another simulator can too)
    RequestError, OverBudgetError   what `Engine.submit` raises for a call it can never run

It sits in the core, next to the policy boundary (`snapshot.py`), so the simulator, the
embedded server and the SGLang adapter share one definition instead of each holding an
`Any` or a private protocol. The stage-inference task tracker that turns calls into stage
and task completions is its companion, `topas_agents.task_tracker`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .errors import TopasError
from .snapshot import Snapshot


class RequestError(TopasError, ValueError):
    """A submitted request is malformed (duplicate id, negative sizes, output > max_new)."""


class OverBudgetError(RequestError):
    """A request whose prefix plus KV reservation can never fit the KV budget."""


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One LLM call as the engine sees it.

    `output_tokens` is what the call will actually generate (<= `max_new_tokens`); the KV
    reservation uses `max_new_tokens`, as a real engine only knows the client's limit.
    """

    rid: str
    task_id: str
    workflow: str | None
    stage: str
    agent: str
    prefix_tokens: int
    input_tokens: int
    output_tokens: int
    max_new_tokens: int
    round: int = 0
    task_arrival_s: float | None = None


class Engine(Protocol):
    """The online API of an engine driven in wall-clock time by the embedded server.

    The engine owns its clock (`now`, simulated seconds). `advance(until)` runs every event
    up to `until`, firing `on_token(rid, tokens generated so far)` and `on_finish(rid, t)`;
    callbacks only record, and callers make follow-up engine calls after `advance` returns.
    The server may call `advance` from a worker thread (never two methods at once), so an
    engine must not depend on running in the thread that built it.
    `stage_done` / `task_done` carry the task tracker's completions to the policy.
    """

    now: float
    on_token: Callable[[str, int], None] | None
    on_finish: Callable[[str, float], None] | None

    def submit(self, req: EngineRequest) -> None:
        """The request arrives now; raises `RequestError` / `OverBudgetError` if it cannot run."""
        ...

    def cancel(self, rid: str) -> bool:
        """Drop a waiting or running request; False if it is unknown or already over."""
        ...

    def stage_done(self, task_id: str, stage: str) -> None: ...
    def task_done(self, task_id: str) -> None: ...

    def next_event_time(self) -> float | None:
        """When the next event is due (None: nothing scheduled)."""
        ...

    def advance(self, until: float) -> None: ...

    def stats(self) -> object:
        """Counters since start: a dataclass instance, a dict or a plain object (JSON-able fields)."""
        ...

    def snapshot(self) -> Snapshot:
        """The policy's view of the engine now (also served by `/v1/topas/stats`)."""
        ...


# Builds an engine's request from keyword fields (the embedded server's engine factories
# return `EngineRequest` itself; an engine with a richer request type returns its own).
RequestFactory = Callable[..., EngineRequest]
