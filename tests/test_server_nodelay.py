"""The embedded server's connections send without Nagle's delay.

asyncio turns Nagle off on an accepted socket only when the listening socket's protocol number
is IPPROTO_TCP; a socket made with `socket.create_server` or `socket.socket(AF_INET,
SOCK_STREAM)` has 0 there, and a keep-alive call then waited for the client's delayed ACK
(40 ms a call). These tests read the option on the server's own sockets, not a latency.
"""

from __future__ import annotations

import asyncio
import socket

import httpx

from topas_agents.server import runner
from topas_agents.server.config import ServerConfig
from topas_agents.server.runner import start_server_in_thread


def _nodelay(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_a_connection_accepted_on_the_listener_has_nagle_off() -> None:
    accepted: list[int] = []

    async def main() -> None:
        listener = runner.tcp_listener("127.0.0.1", 0)
        port = listener.getsockname()[1]
        got = asyncio.Event()

        def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(_nodelay(writer.get_extra_info("socket")))
            writer.close()
            got.set()

        server = await asyncio.start_server(on_connect, sock=listener)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.wait_for(got.wait(), 10)
            writer.close()

    asyncio.run(main())
    assert accepted == [1]


def test_serve_listens_on_a_tcp_socket() -> None:
    sock = runner._listen("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP and _nodelay(sock) == 1
    finally:
        sock.close()


def test_the_embedded_servers_keep_alive_connection_has_nagle_off() -> None:
    with start_server_in_thread(ServerConfig(policy="fcfs", time_scale=100.0)) as handle, \
            httpx.Client(base_url=handle.base_url, timeout=30) as client:
        for _ in range(2):  # the second call reuses the connection: the case that stalled
            assert client.get("/health").status_code == 200
        connections = list(handle._server.server_state.connections)
        assert connections, "the client's keep-alive connection is open"
        assert [_nodelay(c.transport.get_extra_info("socket")) for c in connections] == [1] * len(connections)
