"""How the front hands a call to smg: the call rewritten for the gateway (label lifted into the
body, routing key, served model), sent while a restarting smg is waited for, and its answer
relayed back with the upstream response closed however the relay ends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NamedTuple

import httpx
from starlette.responses import StreamingResponse

from topas_agents.server.bodies import parse_json_body

from .requests import label_into_metadata, lift_label, route_key, route_key_header

# How often a call that found smg down tries again (smg starts in about a second).
GATEWAY_RETRY_S = 0.2


class RelayedCall(NamedTuple):
    """A call's body as the front sends it to smg, and its routing-key header value."""

    body: bytes
    route_key: bytes | None


def rewrite_call(raw: bytes, headers: Mapping[str, str], path: str, model: str | None,
                 router_policy: str) -> RelayedCall:
    """The call as smg gets it: the label lifted into the body (smg drops X-Topas-*), its
    routing key, and the served model's name. A body that is not an object goes as sent
    (the replica answers the 400)."""
    body = parse_json_body(raw)
    if not isinstance(body, dict):
        return RelayedCall(raw, None)
    label = lift_label(body, headers)
    key = route_key(label, router_policy)
    if path == "/v1/responses" and label is not None:
        label_into_metadata(body)
    if model is not None:
        body["model"] = model
    return RelayedCall(json.dumps(body).encode(), route_key_header(key) if key is not None else None)


async def post_to_gateway(http: httpx.AsyncClient, url: str, raw: bytes, headers: list[tuple[bytes, bytes]],
                          wait_s: float, draining: Callable[[], bool]) -> httpx.Response:
    """POST to smg (streamed), waiting for a restarting smg (`_waiting_for_gateway`). The front
    names the served model in the body, so smg's 404 `model_not_found` means no worker yet."""
    return await _waiting_for_gateway(
        lambda: http.send(http.build_request("POST", url, content=raw, headers=headers), stream=True),
        wait_s, draining, model_is_served=True)


async def get_from_gateway(http: httpx.AsyncClient, url: str, wait_s: float,
                           draining: Callable[[], bool]) -> httpx.Response:
    """GET from smg, waiting for a restarting smg as `post_to_gateway` does. Only a refused
    connection is tried again: the path's model id is the client's (`/v1/models/{id}`), so a
    404 `model_not_found` may be the answer for a wrong id, relayed at once."""
    return await _waiting_for_gateway(lambda: http.get(url, timeout=5.0), wait_s, draining, model_is_served=False)


async def _waiting_for_gateway(send: Callable[[], Awaitable[httpx.Response]], wait_s: float,
                               draining: Callable[[], bool], *, model_is_served: bool) -> httpx.Response:
    """`send()` to smg. While the supervisor restarts a dead smg (up to `wait_s`:
    `RestartPolicy.gateway_wait_s`) the call waits for it instead of failing with an error that
    only the client's one retry could absorb. Two answers mean smg ran nothing, so trying again
    is safe: a refused connection, and, when the call names the served model
    (`model_is_served`), smg's 404 `model_not_found` (a new smg listens before it has
    registered its workers). No wait once the front drains."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s

    def last_try() -> bool:
        return draining() or loop.time() + GATEWAY_RETRY_S > deadline

    while True:
        try:
            resp = await send()
        except httpx.ConnectError:
            if last_try():
                raise
        else:
            if not (model_is_served and resp.status_code == 404):
                return resp
            body = await resp.aread()  # an error: small
            await resp.aclose()
            if b"model_not_found" not in body or last_try():
                kept = [(k, v) for k, v in resp.headers.raw if k.lower() != b"content-encoding"]
                return httpx.Response(resp.status_code, headers=kept, stream=httpx.ByteStream(body))
        await asyncio.sleep(GATEWAY_RETRY_S)


class RelayResponse(StreamingResponse):
    """smg's answer relayed; the upstream response is closed however the relay ends. A client
    that left before the body's first chunk had its stream task cancelled before the body
    generator started, so the generator's own cleanup never ran: the pooled connection to smg
    stayed taken and the replica's call ran to its end."""

    def __init__(self, content: AsyncIterator[bytes], upstream: httpx.Response, **kw: Any) -> None:
        super().__init__(content, **kw)
        self._upstream = upstream

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._upstream.aclose()
