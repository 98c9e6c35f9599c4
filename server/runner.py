"""Running the server: blocking (`topas serve`) or in a background thread (tests, MetaGPT).

Shutdown is graceful: new calls get 503 while in-flight ones get `drain_timeout_s` to finish;
the rest fail with a 503 error (an SSE error event when streaming). Only then does uvicorn
stop listening.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from ..errors import ConfigError, TopasError
from .app import build_app
from .config import ServerConfig
from .forced_exit import ForcedExitServer
from .responders import Responder
from .service import EngineFactory, SimService

# Pending connections the kernel queues: a burst of a thousand concurrent clients connects at once.
_BACKLOG = 4096


class _DrainingServer(ForcedExitServer):
    """uvicorn.Server that drains the simulator's in-flight calls before closing."""

    def __init__(self, config: uvicorn.Config, service: SimService, drain_timeout_s: float) -> None:
        super().__init__(config)
        self._service = service
        self._drain_timeout_s = drain_timeout_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # A second Ctrl-C (uvicorn's force_exit) ends the drain at once.
        await self._service.drain(self._drain_timeout_s, cut_short=lambda: self.force_exit)
        await super().shutdown(sockets)  # on a forced exit the service's stop is quick after the drain


def _uvicorn_config(app: Any, config: ServerConfig, **kw: Any) -> uvicorn.Config:
    return uvicorn.Config(app, log_level=config.log_level, access_log=False, lifespan="on",
                          timeout_graceful_shutdown=max(1, int(config.drain_timeout_s) + 1),
                          timeout_keep_alive=config.keep_alive_s,
                          backlog=_BACKLOG, **kw)


def run_server(config: ServerConfig, *, responder: Responder | None = None,
               engine_factory: EngineFactory | None = None) -> int:
    """Serve until SIGINT/SIGTERM (blocking)."""
    app = build_app(config, responder=responder, engine_factory=engine_factory)
    server = _DrainingServer(_uvicorn_config(app, config, host=config.host, port=config.port),
                             app.state.service, config.drain_timeout_s)
    sock = _listen(config.host, config.port)  # bind first: "serving on" is printed only when true
    print(f"topas: serving {config.model_name} on http://{config.host}:{config.port}/v1 "
          f"(engine sim, policy {config.policy}, time scale {config.time_scale:g})", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it handled
        server.run(sockets=[sock])
    return 0


def tcp_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one) whose accepted connections
    send without Nagle's delay. asyncio turns Nagle off (TCP_NODELAY) on an accepted socket
    only if its protocol number is IPPROTO_TCP, and `socket.create_server` or
    `socket.socket(AF_INET, SOCK_STREAM)` leave it 0: uvicorn then wrote a response in pieces
    that waited for the client's delayed ACK, 40 ms on every call after a connection's first
    (measured: 46 ms against 4 ms for a one-token call on the embedded server)."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                      proto=socket.IPPROTO_TCP)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited on Linux; belt and braces
        if family == socket.AF_INET6:  # as socket.create_server: an IPv6 host serves IPv6 only
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
        sock.listen(_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or a one-line ConfigError (a busy port, a bad host)."""
    try:
        return tcp_listener(host, port)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


@dataclass
class ServerHandle:
    """A server running in a background thread. `url` is the OpenAI base URL (…/v1)."""

    url: str
    base_url: str
    config: ServerConfig
    app: Any
    _server: _DrainingServer = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def service(self) -> SimService:
        return self.app.state.service

    def stop(self, timeout_s: float = 30.0) -> None:
        """Graceful shutdown (drain, then close); returns once the thread has exited."""
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(5.0)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server_in_thread(config: ServerConfig | None = None, *, responder: Responder | None = None,
                           engine_factory: EngineFactory | None = None,
                           startup_timeout_s: float = 30.0) -> ServerHandle:
    """Start the server on a free loopback port (`config.port` is ignored) in a daemon thread."""
    config = config or ServerConfig()
    app = build_app(config, responder=responder, engine_factory=engine_factory)
    sock = tcp_listener(config.host, 0)
    host, port = sock.getsockname()[:2]
    server = _DrainingServer(_uvicorn_config(app, config, log_config=None), app.state.service,
                             config.drain_timeout_s)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"topas-server-{port}",
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise TopasError(f"embedded server failed to start on {host}:{port}")
        time.sleep(0.01)
    base = f"http://{host}:{port}"
    return ServerHandle(f"{base}/v1", base, config, app, server, thread)
