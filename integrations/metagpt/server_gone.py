"""A server that stopped answering mid-run fails the run in seconds, not minutes.

MetaGPT 0.8.2 retries a failed call in two nested layers (`OpenAILLM.acompletion_text`: 6
connection attempts, 1-60 s apart; `ActionNode._aask_v1` and the code actions: 6 attempts of
everything, 1-20 s apart), after the openai client's own retries. When the server died
mid-run, `topas run tl` took 209 s to exit 1. Here a connection error that survives the
openai client's retries is checked with one probe of the server: if that cannot connect
either, the call raises `ServerGoneError`, the server is marked gone (every call in the next
GONE_FOR_S raises at once, without the network), and `patches.never_retry(ServerGoneError)` keeps
MetaGPT's layers from retrying it. A probe that connects leaves the error to MetaGPT's
retries (a blip, not a dead server).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx

# One GET of /models: a live server answers at once (any status counts as alive).
PROBE_TIMEOUT_S = 3.0
# A server found gone is not called for this long (every call raises at once); then the next
# call tries it again, so a server restarted on the same URL is used again by a process that
# outlives the run (stock MetaGPT with `enable()`), not refused for the process's lifetime.
GONE_FOR_S = 10.0


class ServerGoneError(RuntimeError):
    """The server stopped answering: neither the call (after the client's retries) nor a
    probe could connect."""


class ServerWatch:
    """Which servers (OpenAI base URLs) stopped answering during this process's runs."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._gone: dict[str, tuple[str, float]] = {}  # base URL -> (why, when found)
        self._lock = threading.Lock()
        self._clock = clock

    def check(self, base_url: str) -> None:
        """Raise `ServerGoneError` if `base_url` was found gone within GONE_FOR_S (before a
        call is sent)."""
        key = base_url.rstrip("/")
        found = self._gone.get(key)
        if found is None:
            return
        if self._clock() - found[1] < GONE_FOR_S:
            raise ServerGoneError(found[0])
        with self._lock:  # long enough: let this call try it again
            self._gone.pop(key, None)

    async def after_connection_error(self, base_url: str, exc: BaseException) -> BaseException:
        """What to raise for a call that could not connect: `ServerGoneError` when a probe cannot
        connect either (and the server is marked gone), else `exc` itself."""
        try:
            async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:
                await client.get(f"{base_url.rstrip('/')}/models")
        except httpx.HTTPError as probe:
            why = (f"the server at {base_url} stopped answering ({type(exc).__name__}; a probe of /models: "
                   f"{type(probe).__name__})")
            with self._lock:
                self._gone[base_url.rstrip("/")] = (why, self._clock())
            return ServerGoneError(why)
        return exc

    def forget(self, base_url: str) -> None:
        """A new run against `base_url` starts from a live server (its probe passed)."""
        with self._lock:
            self._gone.pop(base_url.rstrip("/"), None)


WATCH = ServerWatch()
