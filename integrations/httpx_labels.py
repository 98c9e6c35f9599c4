"""Framework-neutral labelling at the HTTP layer: any client built on httpx carries the label.

LangChain/LangGraph, AutoGen, CrewAI (LiteLLM) and others build their own `openai` clients, so
`labelled(client)` cannot reach them; but they all accept an httpx client. The label in force
(`topas_agents.label`, contextvars) is added when the request is sent:

* `LabelTransport` / `AsyncLabelTransport` (preferred): `X-Topas-*` headers AND the `topas`
  field of a JSON object body;
* `add_label_headers` / `aadd_label_headers`: httpx request event hooks, headers only (for
  code that must keep its own transport).

A label already on the request wins, whole: a request that carries a `topas` body field or any
X-Topas-* label header gets nothing of the label in force (hooks: no header of it), so this
composes with `labelled(...)` and with per-call labels.
Unlabelled requests are sent unchanged. Recipes: docs/integrations.md ("Other frameworks").

    http = labelled_http_client()                   # httpx.Client(transport=LabelTransport())
    client = openai.OpenAI(base_url=..., api_key=..., http_client=http)
    with label(task_id="t1", stage="plan", agent="planner"):
        client.chat.completions.create(...)

Light: httpx and the label module only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from topas_agents.errors import ConfigError, LabelError
from topas_agents.integrations.task import note_unlabelled_call
from topas_agents.labels import BODY_KEY, Label, carries_label, current_label, label, label_fields

# the fields a client of its own may fix (label()'s parameters)
LABEL_FIELDS = ("task_id", "stage", "agent", "workflow", "prefix_tokens")


def _with_headers(headers: httpx.Headers, lab: Label) -> httpx.Headers:
    """`headers` plus the label's X-Topas-* headers, values as UTF-8 bytes: `headers[key] =
    value` encodes with the encoding httpx detected for the request's headers, ASCII in
    practice, so a task id like "café" raised UnicodeEncodeError. Servers decode them back
    (`topas_agents.labels.header_text`)."""
    added = [(key.encode("ascii"), value.encode("utf-8")) for key, value in lab.to_headers().items()]
    return httpx.Headers([*headers.raw, *added])


def _body_of(request: httpx.Request) -> dict[str, Any] | None:
    try:
        content = request.content
    except httpx.RequestNotRead:  # a streaming body: headers only
        return None
    return _json_object(content, request.headers)


# The LLM calls a task's label is for (other requests, e.g. /models, need none).
_LLM_PATHS = ("/chat/completions", "/completions", "/responses")


def _note_unlabelled(request: httpx.Request) -> None:
    """An LLM call with no label in force and none of its own: inside `task(...)` it went out
    unlabelled without a word (no stage/agent in force); now a warning, once per task."""
    if request.url.path.rstrip("/").endswith(_LLM_PATHS) and not carries_label(_body_of(request), request.headers.keys()):
        note_unlabelled_call()


def add_label_headers(request: httpx.Request) -> None:
    """httpx request event hook (sync clients): add the label in force as headers, unless the
    request is labelled already."""
    lab = current_label()
    if lab is None:
        _note_unlabelled(request)
    elif not carries_label(_body_of(request), request.headers.keys()):
        request.headers = _with_headers(request.headers, lab)


async def aadd_label_headers(request: httpx.Request) -> None:
    """httpx request event hook (async clients)."""
    add_label_headers(request)


def _json_object(content: bytes, headers: httpx.Headers) -> dict[str, Any] | None:
    """The request's JSON object body, or None when it has none."""
    if not content or "json" not in headers.get("content-type", ""):
        return None
    try:
        body = json.loads(content)
    except (UnicodeDecodeError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def label_request(request: httpx.Request, lab: Label | None) -> httpx.Request:
    """`request` with `lab` added to its headers and JSON body (the same request if None, or
    if the caller labelled it already: body or headers, the caller's label is kept whole).
    The body must be readable (httpx reads non-streaming bodies when it builds them)."""
    if lab is None:
        _note_unlabelled(request)
        return request
    body = _body_of(request)
    if carries_label(body, request.headers.keys()):
        return request
    headers = _with_headers(httpx.Headers(request.headers), lab)
    if body is None:
        request.headers = headers
        return request
    body[BODY_KEY] = lab.to_body()
    headers.pop("content-length", None)  # recomputed from the new content
    return httpx.Request(request.method, request.url, headers=headers, content=json.dumps(body).encode(),
                         extensions=request.extensions)


def _checked_fields(fields: Mapping[str, Any] | None) -> dict[str, Any]:
    """The client's own label fields (None values dropped), checked when the client is built:
    a bad value is a ConfigError there, not a LabelError at every call."""
    given = {k: v for k, v in (fields or {}).items() if v is not None}
    unknown = sorted(set(given) - set(LABEL_FIELDS))
    if unknown:
        raise ConfigError(f"labelled http client: unknown label field(s) {', '.join(unknown)}")
    try:
        label_fields(given, complete=False)
    except LabelError as exc:
        raise ConfigError(f"labelled http client: {exc}") from None
    return given


def _label_for(fields: Mapping[str, Any]) -> Label | None:
    """The label in force, with the client's own fields over it (as a `label(**fields)` block
    inside the caller's would): stage and agent per client, the task from the caller."""
    if not fields:
        return current_label()
    with label(**fields) as lab:
        return lab


class LabelTransport(httpx.BaseTransport):
    """Sync transport wrapper: labels each request, then sends it with `inner`. `fields`: label
    fields of this client's own (e.g. one client per agent: stage and agent), over the label in
    force."""

    def __init__(self, inner: httpx.BaseTransport | None = None,
                 fields: Mapping[str, Any] | None = None) -> None:
        self._inner = inner or httpx.HTTPTransport()
        self._fields = _checked_fields(fields)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        lab = _label_for(self._fields)
        if lab is not None:
            request.read()
        return self._inner.handle_request(label_request(request, lab))

    def close(self) -> None:
        self._inner.close()


class AsyncLabelTransport(httpx.AsyncBaseTransport):
    """Async transport wrapper: labels each request, then sends it with `inner` (`fields`: as
    `LabelTransport`'s)."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None,
                 fields: Mapping[str, Any] | None = None) -> None:
        self._inner = inner or httpx.AsyncHTTPTransport()
        self._fields = _checked_fields(fields)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        lab = _label_for(self._fields)
        if lab is not None:
            await request.aread()
        return await self._inner.handle_async_request(label_request(request, lab))

    async def aclose(self) -> None:
        await self._inner.aclose()


# httpx applies these to its default transport only; with our wrapper they go to the inner one.
_TRANSPORT_KWARGS = ("verify", "cert", "http1", "http2", "limits", "proxy")


# What openai's own client uses (openai._constants.DEFAULT_CONNECTION_LIMITS): httpx's default
# of 100 connections held the 101st concurrent call inside the client, where no scheduler sees it.
_OPENAI_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)


def _split(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the inner transport's options, the client's), with openai's client defaults: its
    connection limits and following redirects, as the client it replaces had."""
    inner = {k: kwargs.pop(k) for k in _TRANSPORT_KWARGS if k in kwargs}
    inner.setdefault("limits", _OPENAI_LIMITS)
    if "trust_env" in kwargs:
        inner["trust_env"] = kwargs["trust_env"]
    kwargs.setdefault("follow_redirects", True)
    return inner, kwargs


def _env_mounts(inner: dict[str, Any], kwargs: dict[str, Any], make: Any, wrap: Any) -> dict[str, Any]:
    """HTTP(S)_PROXY / ALL_PROXY / NO_PROXY as httpx applies them to its own transport, for ours:
    httpx reads the environment only when it builds the transport, so a labelled client went
    straight past a proxy the environment names. Nothing when the caller set a proxy or
    trust_env=False."""
    if "proxy" in inner or not kwargs.get("trust_env", True):
        return {}
    try:
        from httpx._utils import get_environment_proxies  # httpx's own reading of the environment
    except ImportError:  # pragma: no cover - an httpx without it: its own behaviour, no proxies
        return {}
    return {pattern: None if proxy is None else wrap(make(**{**inner, "proxy": proxy}))
            for pattern, proxy in get_environment_proxies().items()}


def _mounts(kwargs: dict[str, Any], given: Any, from_env: Callable[[], dict[str, Any]],
            wrap: Callable[[Any], Any]) -> dict[str, Any]:
    """The client's mounts, each transport wrapped to label (None: no transport for that pattern,
    as httpx reads it): the environment's proxies (none when the caller gave a transport), with
    the caller's `mounts=` over them (popped from `kwargs`; passed on bare, calls routed through
    them went out unlabelled)."""
    given_mounts = kwargs.pop("mounts", None) or {}
    mounts = {} if given is not None else from_env()  # as httpx: the environment's, then the caller's
    mounts.update({pattern: None if t is None else wrap(t) for pattern, t in given_mounts.items()})
    return mounts


def labelled_http_client(*, task_id: str | None = None, stage: str | None = None, agent: str | None = None,
                         workflow: str | None = None, prefix_tokens: int | None = None,
                         **kwargs: Any) -> httpx.Client:
    """An `httpx.Client(**kwargs)` whose requests carry the label in force. A `transport=`
    given is wrapped, not replaced; transport options (verify, limits, proxy, ...) still apply.
    Label fields given here are the client's own, over the label in force at each call: one
    client per agent (`stage=`, `agent=`) labels a multi-agent framework's calls per agent,
    with the task id from the caller's `task(...)` / `label(task_id=...)`."""
    fields = {"task_id": task_id, "stage": stage, "agent": agent, "workflow": workflow,
              "prefix_tokens": prefix_tokens}
    inner, kwargs = _split(kwargs)
    given = kwargs.pop("transport", None)
    wrap = lambda t: LabelTransport(t, fields)  # noqa: E731
    mounts = _mounts(kwargs, given, lambda: _env_mounts(inner, kwargs, httpx.HTTPTransport, wrap), wrap)
    return httpx.Client(transport=wrap(given or httpx.HTTPTransport(**inner)), **kwargs,
                        **({"mounts": mounts} if mounts else {}))


def labelled_async_http_client(*, task_id: str | None = None, stage: str | None = None,
                               agent: str | None = None, workflow: str | None = None,
                               prefix_tokens: int | None = None, **kwargs: Any) -> httpx.AsyncClient:
    """The async counterpart of `labelled_http_client` (the same label fields)."""
    fields = {"task_id": task_id, "stage": stage, "agent": agent, "workflow": workflow,
              "prefix_tokens": prefix_tokens}
    inner, kwargs = _split(kwargs)
    given = kwargs.pop("transport", None)
    wrap = lambda t: AsyncLabelTransport(t, fields)  # noqa: E731
    mounts = _mounts(kwargs, given, lambda: _env_mounts(inner, kwargs, httpx.AsyncHTTPTransport, wrap), wrap)
    return httpx.AsyncClient(transport=wrap(given or httpx.AsyncHTTPTransport(**inner)), **kwargs,
                             **({"mounts": mounts} if mounts else {}))
