"""A uvicorn server whose app still shuts down when the exit is forced (a second Ctrl-C)."""

from __future__ import annotations

import socket

import uvicorn


class ForcedExitServer(uvicorn.Server):
    """uvicorn.Server whose app still shuts down on a forced exit (a second Ctrl-C).

    uvicorn skips the app's lifespan shutdown then; the lifespan task was cancelled at exit,
    which logged a CancelledError traceback and skipped what the app's shutdown closes."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        if self.force_exit:
            await self.lifespan.shutdown()
