"""Framework-neutral labelling at the HTTP layer: any client built on httpx carries the label.

LangChain/LangGraph, AutoGen, CrewAI (LiteLLM) and others build their own `openai` clients, so
`labelled(client)` cannot reach them; but they all accept an httpx client. The label in force
(`topas_agents.label`, contextvars) is added when the request is sent:

* `LabelTransport` / `AsyncLabelTransport` (preferred): `X-Topas-*` headers AND the `topas`
  field of a JSON object body;
* `add_label_headers` / `aadd_label_headers`: httpx request event hooks, headers only (for
  code that must keep its own transport).

A label already on the request wins (headers are only added when absent; a body that has a
`topas` field keeps it), so this composes with `labelled(...)` and with per-call labels.
Unlabelled requests are sent unchanged. Recipes: docs/integrations.md ("Other frameworks").

    http = labelled_http_client()                   # httpx.Client(transport=LabelTransport())
    client = openai.OpenAI(base_url=..., api_key=..., http_client=http)
    with label(task_id="t1", stage="plan", agent="planner"):
        client.chat.completions.create(...)

Light: httpx and the label module only.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from topas_agents.labels import BODY_KEY, Label, current_label


def _with_headers(headers: httpx.Headers, lab: Label) -> httpx.Headers:
    """`headers` plus the label's X-Topas-* headers that are not there yet, values as UTF-8
    bytes: `headers[key] = value` encodes with the encoding httpx detected for the request's
    headers, ASCII in practice, so a task id like "café" raised UnicodeEncodeError. Servers
    decode them back (`topas_agents.labels.header_text`)."""
    added = [(key.encode("ascii"), value.encode("utf-8")) for key, value in lab.to_headers().items()
             if key not in headers]  # httpx.Headers is case-insensitive
    return httpx.Headers([*headers.raw, *added]) if added else headers


def add_label_headers(request: httpx.Request) -> None:
    """httpx request event hook (sync clients): add the label in force as headers."""
    lab = current_label()
    if lab is not None:
        request.headers = _with_headers(request.headers, lab)


async def aadd_label_headers(request: httpx.Request) -> None:
    """httpx request event hook (async clients)."""
    add_label_headers(request)


def _labelled_body(content: bytes, headers: httpx.Headers, lab: Label) -> bytes | None:
    """The JSON body with `topas` added, or None when it is not a JSON object without one."""
    if not content or "json" not in headers.get("content-type", ""):
        return None
    try:
        body = json.loads(content)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(body, dict) or body.get(BODY_KEY) is not None:
        return None
    body[BODY_KEY] = lab.to_body()
    return json.dumps(body).encode()


def label_request(request: httpx.Request, lab: Label | None) -> httpx.Request:
    """`request` with `lab` added to its headers and JSON body (the same request if None).
    The body must be readable (httpx reads non-streaming bodies when it builds them)."""
    if lab is None:
        return request
    headers = _with_headers(httpx.Headers(request.headers), lab)
    try:
        content = request.content
    except httpx.RequestNotRead:  # a streaming body: headers only
        content = b""
    new_body = _labelled_body(content, headers, lab)
    if new_body is None:
        request.headers = headers
        return request
    headers.pop("content-length", None)  # recomputed from the new content
    return httpx.Request(request.method, request.url, headers=headers, content=new_body,
                         extensions=request.extensions)


class LabelTransport(httpx.BaseTransport):
    """Sync transport wrapper: labels each request, then sends it with `inner`."""

    def __init__(self, inner: httpx.BaseTransport | None = None) -> None:
        self._inner = inner or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        lab = current_label()
        if lab is not None:
            request.read()
        return self._inner.handle_request(label_request(request, lab))

    def close(self) -> None:
        self._inner.close()


class AsyncLabelTransport(httpx.AsyncBaseTransport):
    """Async transport wrapper: labels each request, then sends it with `inner`."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self._inner = inner or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        lab = current_label()
        if lab is not None:
            await request.aread()
        return await self._inner.handle_async_request(label_request(request, lab))

    async def aclose(self) -> None:
        await self._inner.aclose()


# httpx applies these to its default transport only; with our wrapper they go to the inner one.
_TRANSPORT_KWARGS = ("verify", "cert", "http1", "http2", "limits", "proxy")


def _split(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    inner = {k: kwargs.pop(k) for k in _TRANSPORT_KWARGS if k in kwargs}
    if "trust_env" in kwargs:
        inner["trust_env"] = kwargs["trust_env"]
    return inner, kwargs


def labelled_http_client(**kwargs: Any) -> httpx.Client:
    """An `httpx.Client(**kwargs)` whose requests carry the label in force. A `transport=`
    given is wrapped, not replaced; transport options (verify, limits, proxy, ...) still apply."""
    inner, kwargs = _split(kwargs)
    transport = kwargs.pop("transport", None) or httpx.HTTPTransport(**inner)
    return httpx.Client(transport=LabelTransport(transport), **kwargs)


def labelled_async_http_client(**kwargs: Any) -> httpx.AsyncClient:
    """The async counterpart of `labelled_http_client`."""
    inner, kwargs = _split(kwargs)
    transport = kwargs.pop("transport", None) or httpx.AsyncHTTPTransport(**inner)
    return httpx.AsyncClient(transport=AsyncLabelTransport(transport), **kwargs)
