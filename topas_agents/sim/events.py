"""The engine's single event heap, keyed `(time, seq)`: ties break once, by insertion order."""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Any

from .state import Run

# Event kinds: an external callback, a host-link transfer completing, the GPU work in flight ending.
CALLBACK, TRANSFER, RUN_END = 0, 1, 2


class EventHeap:
    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0

    def push(self, t: float, kind: int, obj: Any) -> None:
        self._seq += 1
        heappush(self._heap, (t, self._seq, kind, obj))

    def peek(self, live_run: Run | None) -> float | None:
        """Time of the next live event. A RUN_END is stale (and dropped) unless it is the end
        of `live_run`, the GPU work in flight: a cut jump leaves its old end behind."""
        heap = self._heap
        while heap:
            t, _, kind, obj = heap[0]
            if kind == RUN_END and (obj is not live_run or obj.end_s != t):
                heappop(heap)
                continue
            return t
        return None

    def pop(self) -> tuple[int, Any]:
        """Remove the first event (call `peek` first: it drops stale entries)."""
        _, _, kind, obj = heappop(self._heap)
        return kind, obj
