"""Drives an engine in wall-clock time from one asyncio task.

The engine's clock follows `now_sim = sim0 + (wall - wall0) * time_scale`. The loop advances
the engine to the current target, runs queued commands (closures over the engine: submit,
cancel, stats...), then sleeps until the engine's next event or a new command. Everything
that touches the engine runs inside this one task, one thing at a time, so there are no races;
callbacks fired during `advance` only record results, and follow-up engine calls happen after
`advance` returns (the `after_advance` hook). The engine is anything implementing the core
contract `topas_agents.engine.Engine`.

An `advance` with an event due (a policy decision, mostly) runs in one worker thread while
the task awaits it: a slow policy held the event loop, so every call, stream and /health
waited for each decision. The task still runs nothing else on the engine until the thread
returns, so the engine is never touched from two threads at once; its callbacks run in the
worker thread and must only record (they must not touch asyncio objects).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from ..engine import Engine
from .api_errors import ApiError

log = logging.getLogger("topas.server")
T = TypeVar("T")
# An advance that holds the loop this long is logged (a client notices half a second), at most
# once per SLOW_WARNING_EVERY_S: a slow policy would otherwise log at every decision.
SLOW_ADVANCE_S = 0.5
SLOW_WARNING_EVERY_S = 60.0


class _AdvanceJob(NamedTuple):
    target: float
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future


class _AdvanceThread:
    """One daemon thread that runs the engine's advances, one at a time, in order. A daemon (not
    a ThreadPoolExecutor's worker, which the interpreter joins at exit): a process whose policy
    hangs in a decision must still exit, as it did when decisions ran on the event loop."""

    def __init__(self, advance: Callable[[float], Exception | None]) -> None:
        self._advance = advance
        self._jobs: queue.SimpleQueue[_AdvanceJob | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="topas-engine", daemon=True)
        self._thread.start()

    def run(self, target: float) -> asyncio.Future:
        """The advance to `target`, queued; the future gets its result on the calling loop."""
        loop = asyncio.get_running_loop()
        job = _AdvanceJob(target, loop, loop.create_future())
        self._jobs.put(job)
        return job.done

    def stop(self) -> None:
        self._jobs.put(None)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                outcome: Any = self._advance(job.target)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task as is
                outcome = exc
            try:
                job.loop.call_soon_threadsafe(_settle, job.done, outcome)
            except RuntimeError:  # the loop closed while this advance ran: nobody waits for it
                return


def _settle(done: asyncio.Future, outcome: Any) -> None:
    if done.cancelled():
        return
    if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
        done.set_exception(outcome)
    else:
        done.set_result(outcome)


class EngineLoop:
    def __init__(self, engine: Engine, time_scale: float, *,
                 after_advance: Callable[[], None] = lambda: None,
                 periodic: Callable[[float], None] = lambda wall: None,
                 on_failure: Callable[[BaseException], None] = lambda exc: None,
                 max_sleep_s: float = 0.25, advance_in_thread: bool = True) -> None:
        self.engine = engine
        self.time_scale = time_scale
        self._after_advance = after_advance
        self._periodic = periodic
        self._on_failure = on_failure
        self._max_sleep_s = max_sleep_s
        self._cmds: collections.deque[tuple[Callable[[], Any], asyncio.Future | None]] = collections.deque()
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task | None = None
        self._wall0 = 0.0
        self._sim0 = 0.0
        self.failure: BaseException | None = None
        self._last_slow_warning = -math.inf
        # one thread: advances stay in order, and an engine bound to a thread keeps one
        self._worker = _AdvanceThread(self._advance_to) if advance_in_thread else None
        self.advancing_since: float | None = None  # loop time an advance in the worker began

    @property
    def max_sleep_s(self) -> float:
        """The longest the loop sleeps, and the period of `periodic`."""
        return self._max_sleep_s

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._wall0, self._sim0 = loop.time(), self.engine.now
        self._task = asyncio.create_task(self._run(), name="topas-engine-loop")
        self._task.add_done_callback(self._loop_ended)

    def _loop_ended(self, task: asyncio.Task) -> None:
        """A loop task that died of an exception (a bug in the loop itself, not in the engine:
        `_advance` catches those) marks the engine failed, so calls get 503 and /health says
        so, instead of waiting forever on a loop that no longer runs."""
        exc = None if task.cancelled() else task.exception()
        if exc is None:
            return
        log.error("engine loop stopped", exc_info=exc)
        if self.failure is None:
            self.failure = exc
            self._guarded(lambda: self._on_failure(exc))
        self._fail_pending(ApiError(503, f"engine failed: {exc!r}"))

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
        if self._worker is not None:
            self._worker.stop()

    def target_now(self) -> float:
        """The simulated time that corresponds to the wall clock now."""
        return self._sim0 + (asyncio.get_running_loop().time() - self._wall0) * self.time_scale

    # ------------------------------------------------------------------ commands

    async def call(self, fn: Callable[[], T]) -> T:
        """Run `fn()` inside the engine task (after advancing to now); returns its result."""
        if self._stopping:
            raise ApiError(503, "engine is stopped")
        if self._task is not None and self._task.done():  # nothing would run the command
            raise ApiError(503, f"engine failed: {self.failure!r}")
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._cmds.append((fn, fut))
        self._wake.set()
        return await fut

    def call_soon(self, fn: Callable[[], Any]) -> None:
        """Queue `fn()` without waiting (safe from cancelled tasks and finally blocks)."""
        self._cmds.append((fn, None))
        self._wake.set()

    # ------------------------------------------------------------------ loop

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last_periodic = loop.time()
        while True:
            await self._advance()
            self._run_commands()
            if self._stopping and not self._cmds:
                break
            wall = loop.time()
            if wall - last_periodic >= self._max_sleep_s:
                last_periodic = wall
                self._guarded(lambda w=wall: self._periodic(w))
            await self._sleep(self._sleep_s())
        self._fail_pending(ApiError(503, "engine stopped"))

    async def _advance(self) -> None:
        if self.failure is not None:
            return
        target = max(self.target_now(), self.engine.now)
        due = self.engine.next_event_time()
        started = time.perf_counter()
        if self._worker is None or due is None or due > target:  # nothing to process: the clock moves
            failed = self._advance_to(target)
        else:
            self.advancing_since = asyncio.get_running_loop().time()
            try:
                failed = await self._worker.run(target)
            finally:
                self.advancing_since = None
        # what the advance completed reaches its calls first: a call that finished before the
        # engine failed keeps its answer
        self._guarded(self._after_advance)
        if failed is not None:
            self.failure = failed
            self._guarded(lambda e=failed: self._on_failure(e))
        self._warn_if_slow(time.perf_counter() - started)

    def _advance_to(self, target: float) -> Exception | None:
        """Advance the engine (in the worker thread, or inline); its exception, not raised."""
        try:
            self.engine.advance(target)
        except Exception as exc:  # an engine or policy bug: fail loudly, keep serving errors
            log.exception("engine failed")
            return exc
        return None

    def _warn_if_slow(self, held_s: float) -> None:
        """Say when an advance (its policy's decisions, mostly) took long enough for every
        client to notice, at most once a minute: calls wait for it (off the event loop, they
        still cannot start or finish before it returns)."""
        now = time.monotonic()
        if held_s >= SLOW_ADVANCE_S and now - self._last_slow_warning >= SLOW_WARNING_EVERY_S:
            self._last_slow_warning = now
            log.warning("the engine took %.2f s to advance (a slow policy delays every call; "
                        "topas_decision_latency_seconds shows each decision)", held_s)

    def _run_commands(self) -> None:
        if not self._cmds:
            return
        for _ in range(len(self._cmds)):
            fn, fut = self._cmds.popleft()
            if fut is not None and fut.done():  # the caller went away
                continue
            try:
                if self.failure is not None and fut is not None:
                    raise ApiError(503, f"engine failed: {self.failure}")
                result = fn()
            except Exception as exc:
                if fut is None:
                    log.exception("engine command failed")
                else:
                    fut.set_exception(exc)
            else:
                if fut is not None:
                    fut.set_result(result)
        self._guarded(self._after_advance)  # what a command's engine calls reported, applied now

    def _sleep_s(self) -> float:
        if self._cmds or self._stopping:
            return 0.0
        if self.failure is not None:
            return self._max_sleep_s
        nxt = self.engine.next_event_time()
        if nxt is None:
            return self._max_sleep_s
        wait = (nxt - self.target_now()) / self.time_scale
        # never spin: an event due now that advance() left pending gets 1 ms
        return min(self._max_sleep_s, max(wait, 0.001))

    async def _sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        self._wake.clear()
        if self._cmds:
            return
        # asyncio's TimeoutError: the builtin one only from Python 3.11 on (on 3.10 the
        # builtin missed it, and the loop task died at its first idle sleep)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    def _fail_pending(self, err: Exception) -> None:
        while self._cmds:
            _, fut = self._cmds.popleft()
            if fut is not None and not fut.done():
                fut.set_exception(err)

    @staticmethod
    def _guarded(fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception:
            log.exception("engine-loop hook failed")
