"""Request bodies as every endpoint reads them, one server or the cluster front: within a
byte limit (413 before the rest is read into memory) and parsed as JSON (400 for anything
`json` refuses, never a 500)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import ClientDisconnect, Request

from .api_errors import ApiError, bad_request

CLIENT_GONE = 499  # nginx's "client closed request": counted so, never as a 5xx


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) past `limit` bytes: first by its Content-Length, then while it
    streams in, never holding more than `limit` bytes."""
    length = request.headers.get("content-length", "")
    # > 19 digits is past any limit (and int() of 4300+ digits raises)
    if length.isascii() and length.isdigit() and (len(length) > 19 or int(length) > limit):
        raise _too_large(limit)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:  # escaped as an "unhandled error" 500 with a traceback
        raise ApiError(CLIENT_GONE, "the client disconnected while sending the request body") from None
    return b"".join(chunks)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body larger than {limit} bytes")


def parse_json_body(raw: bytes) -> Any:
    """The body as JSON, or a 400: bad JSON or UTF-8, an int of over 4300 digits (ValueError),
    deep nesting (RecursionError; on the cluster front it escaped as a plain-text 500)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"request body is not valid JSON: {str(exc)[:200]}") from None


async def client_gone(request: Request) -> None:
    """Returns once the client has disconnected (its request body already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def done_before_client_left(work: asyncio.Future[Any], request: Request) -> bool:
    """Wait for `work` or the client's disconnect, whichever comes first; True if `work` is
    done. `work` is left as it is either way: the caller cancels it or reads its result."""
    gone = asyncio.ensure_future(client_gone(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    return work.done()
