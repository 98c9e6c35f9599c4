"""The front's drain on stop, as a single server drains (server/runner.py): new calls get 503,
calls in flight through the front get the drain timeout to finish, and a stream still open
after it ends with an error event and [DONE] instead of being cut mid-body.

Without it, stopping a cluster stopped smg with the replicas: smg's short grace period cut
every relay after ~2 s, and a raw client got a 200 stream that just stopped.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import httpx
import uvicorn

from topas_agents.server.api_errors import ApiError
from topas_agents.server.forced_exit import ForcedExitServer
from topas_agents.server.openai_format import sse

# How often the drain looks whether the relays in flight have finished.
_POLL_S = 0.05


class RelayDrain:
    """The relays in flight (by the task that streams each), and the end of the ones left."""

    def __init__(self) -> None:
        self.draining = False
        self._relays: set[asyncio.Task] = set()
        self._cut: set[asyncio.Task] = set()

    @property
    def in_flight(self) -> int:
        return len(self._relays)

    def cut(self) -> None:
        """End every relay still open: its task is cancelled, and the relay, seeing its own
        cut, ends the stream with an error event (nothing is added on the hot path)."""
        for task in self._relays - self._cut:
            self._cut.add(task)
            task.cancel()

    async def body(self, resp: httpx.Response) -> AsyncIterator[bytes]:
        """`resp`'s body, relayed until it ends, breaks (ended as it did: the client wrapper
        resumes a cut stream) or the drain cuts it."""
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
        except httpx.HTTPError:
            return
        except asyncio.CancelledError:
            if task not in self._cut:
                raise  # the client left, or the loop is closing: not ours to swallow
            if hasattr(task, "uncancel"):  # 3.11+: the cancellation was ours and is handled
                task.uncancel()
            if resp.headers.get("content-type", "").startswith("text/event-stream"):
                yield sse(ApiError(503, "server shut down before the request finished").body())
                yield b"data: [DONE]\n\n"
        finally:
            self._relays.discard(task)
            self._cut.discard(task)
            await resp.aclose()


class DrainingFront(ForcedExitServer):
    """The front's uvicorn server: drains its relays (`RelayDrain`) before closing."""

    def __init__(self, config: uvicorn.Config, drain: RelayDrain, drain_timeout_s: float) -> None:
        super().__init__(config)
        self._drain = drain
        self._drain_timeout_s = drain_timeout_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        self._drain.draining = True
        deadline = loop.time() + self._drain_timeout_s
        while self._drain.in_flight and loop.time() < deadline and not self.force_exit:
            await asyncio.sleep(_POLL_S)
        self._drain.cut()
        await super().shutdown(sockets)
