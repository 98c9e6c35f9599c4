"""Label every call of an `openai` client (sync or async) through its official seams.

    from openai import OpenAI
    from topas_agents import label
    from topas_agents.integrations.openai_client import labelled

    client = labelled(OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="x"))
    with label(task_id="t1", stage="plan", agent="planner"):
        client.chat.completions.create(model="m", messages=[...])

`chat.completions`, `completions` and `responses` (openai >= 1.66; SGLang's Responses API
takes the label too), with their `create`, `parse` and `stream`, are labelled.
The label in force (`topas_agents.label`, contextvars) is added to `extra_body["topas"]` and
as `X-Topas-*` `extra_headers` (headers only when every field is ASCII: the body carries the
rest); caller dicts are copied, never mutated. A call that carries its own label (`extra_body`'s
`topas`, or any X-Topas-* label header) keeps it whole and gets nothing of the one in force. Calls are retried
with tenacity on connection errors, timeouts, 5xx, 408 and 429 answers (openai's `max_retries`, if
set, is the number of retries), never on other 4xx; a stream that
breaks mid-way is re-issued once and resumed (`topas_agents.cluster.stream_retry`). The inner
client's own retries are switched off (`with_options(max_retries=0)`) so there is exactly one
retry policy. Works with openai 1.x, 2.x and 3.x (only `extra_body`, `extra_headers`,
`with_options` and the exception classes are used, all stable across those majors).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import openai
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from topas_agents.cluster.stream_retry import AsyncResumingStream, ResponsesProgress, ResumingStream
from topas_agents.labels import BODY_KEY, Label, carries_label, current_label


@dataclass(frozen=True, slots=True)
class RetryConfig:
    attempts: int = 4
    wait_min_s: float = 0.2
    wait_max_s: float = 4.0


# 4xx answers that are transient, as openai's own client retries them: a request timeout and a
# rate limit (SGLang, vLLM and gateways answer 429 under load). Not 409, which openai retries
# too: a Topas server's 409 is final (a task marked done, a workflow under another definition).
RETRIED_4XX = (408, 429)


def is_retryable(exc: BaseException) -> bool:
    """Connection problems, timeouts, 5xx, 408 and 429 are transient; other 4xx are the
    caller's to fix."""
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500 or exc.status_code in RETRIED_4XX
    return False


# A server's Retry-After (seconds) is waited for, up to this long (openai's client caps it at 60).
RETRY_AFTER_MAX_S = 60.0


def _retry_after_s(exc: BaseException | None) -> float | None:
    """The Retry-After of a refused call, in seconds (None: none, or an HTTP date)."""
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return min(seconds, RETRY_AFTER_MAX_S) if seconds is not None and seconds >= 0 else None


def _honouring_retry_after(backoff: Callable[[Any], float]) -> Callable[[Any], float]:
    """`backoff`, or the server's Retry-After when that is longer (a 429 says when to come back)."""
    def wait(state: Any) -> float:
        outcome = state.outcome
        hinted = _retry_after_s(outcome.exception() if outcome is not None and outcome.failed else None)
        return max(backoff(state), hinted or 0.0)
    return wait


def with_label(kwargs: Mapping[str, Any], lab: Label | None) -> dict[str, Any]:
    """A copy of `kwargs` whose extra_body/extra_headers carry `lab` (caller dicts untouched)."""
    out = dict(kwargs)
    if lab is None or carries_label(out.get("extra_body"), out.get("extra_headers") or ()):
        return out  # an explicit per-call label wins, whole (body or headers)
    body = dict(out.get("extra_body") or {})
    body[BODY_KEY] = lab.to_body()
    out["extra_body"] = body
    if not lab.ascii:
        # The openai client builds its httpx headers at once, and httpx encodes those as ASCII:
        # a task id like "café" raised UnicodeEncodeError on every call. The body label above
        # carries it (every Topas server reads the body first).
        return out
    out["extra_headers"] = {**(out.get("extra_headers") or {}), **lab.to_headers()}
    return out


class _Endpoint:
    """Wraps one `create` endpoint (chat.completions, completions or responses) and its
    `parse` and `stream` helpers."""

    def __init__(self, target: Any, retry: RetryConfig, is_async: bool,
                 label_fn: Callable[[], Label | None], resume_streams: bool = True,
                 progress: Callable[[], Any] | None = None) -> None:
        self._target = target
        self._retry = retry
        self._async = is_async
        self._label_fn = label_fn
        self._resume = resume_streams
        self._progress = progress  # what a stream's chunks deliver (stream_retry; None: chat's)

    @property
    def with_raw_response(self) -> _Endpoint:
        """openai's raw-response variant, labelled and retried like `create` (a raw stream is
        the caller's to read, so it is not resumed). Forwarded bare, its calls went unlabelled."""
        return _Endpoint(self._target.with_raw_response, self._retry, self._async, self._label_fn,
                         resume_streams=False)

    @property
    def with_streaming_response(self) -> _LabelledOnly:
        """openai's streaming-response variant (a context manager), labelled; not retried:
        the response is opened by the caller's `with`, after this call returns."""
        return _LabelledOnly(self._target.with_streaming_response, self._label_fn)

    def _retrying_kwargs(self) -> dict[str, Any]:
        r = self._retry
        return {
            "stop": stop_after_attempt(r.attempts),
            "wait": _honouring_retry_after(wait_exponential(min=r.wait_min_s, max=r.wait_max_s)),
            "retry": retry_if_exception(is_retryable),
            "reraise": True,
        }

    def create(self, **kwargs: Any) -> Any:
        call_kwargs = with_label(kwargs, self._label_fn())
        if self._async:
            return self._acreate(call_kwargs)
        result = self._create_once(call_kwargs)
        if call_kwargs.get("stream") and self._resume:
            # A stream cut mid-way (a replica died behind the gateway: no [DONE], or an error
            # event) is re-issued once, with the same label, and resumed after what was delivered.
            return ResumingStream(result, lambda: self._create_once(call_kwargs), progress=self._progress)
        return result

    @property
    def parse(self) -> Callable[..., Any]:
        """openai's structured-output helper (`chat.completions.parse`, `responses.parse`),
        labelled and retried like `create`. Forwarded bare, its calls went unlabelled. An
        openai without it (1.x before 1.40) raises AttributeError here, as it would."""
        getattr(self._target, "parse")  # noqa: B009 - the target's AttributeError, at access

        def parse(**kwargs: Any) -> Any:
            call_kwargs = with_label(kwargs, self._label_fn())
            if self._async:
                return self._acreate_once(call_kwargs, "parse")
            return self._create_once(call_kwargs, "parse")
        return parse

    @property
    def stream(self) -> Callable[..., Any]:
        """openai's streaming helper (a context manager), labelled; not retried: the stream is
        opened by the caller's `with`, after this call returns."""
        target = self._target.stream  # the target's AttributeError, at access

        def stream(**kwargs: Any) -> Any:
            return target(**with_label(kwargs, self._label_fn()))
        return stream

    def _create_once(self, call_kwargs: dict[str, Any], method: str = "create") -> Any:
        for attempt in Retrying(**self._retrying_kwargs()):
            with attempt:
                return getattr(self._target, method)(**call_kwargs)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _acreate(self, call_kwargs: dict[str, Any]) -> Any:
        result = await self._acreate_once(call_kwargs)
        if call_kwargs.get("stream") and self._resume:
            return AsyncResumingStream(result, lambda: self._acreate_once(call_kwargs), progress=self._progress)
        return result

    async def _acreate_once(self, call_kwargs: dict[str, Any], method: str = "create") -> Any:
        async for attempt in AsyncRetrying(**self._retrying_kwargs()):
            with attempt:
                return await getattr(self._target, method)(**call_kwargs)
        raise AssertionError("unreachable")  # pragma: no cover

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


class _LabelledOnly:
    """A `create` endpoint whose calls get the label in force, and nothing else."""

    def __init__(self, target: Any, label_fn: Callable[[], Label | None]) -> None:
        self._target = target
        self._label_fn = label_fn

    def create(self, **kwargs: Any) -> Any:
        return self._target.create(**with_label(kwargs, self._label_fn()))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


class _Namespace:
    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


class _Overlay:
    """`base` (an openai resource group) with its chat/completion endpoints labelled; every
    other attribute forwarded (embeddings, files, ... go as they are)."""

    def __init__(self, base: Any, **labelled: Any) -> None:
        self._base = base
        self.__dict__.update(labelled)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


class LabelledClient:
    """A thin proxy over an `openai.OpenAI` / `openai.AsyncOpenAI` client."""

    def __init__(self, client: Any, retry: RetryConfig | None = None,
                 label_fn: Callable[[], Label | None] = current_label) -> None:
        is_async = isinstance(client, openai.AsyncOpenAI)
        if not is_async and not isinstance(client, openai.OpenAI):
            raise TypeError(f"expected openai.OpenAI or openai.AsyncOpenAI, got {type(client).__name__}")
        if retry is None and client.max_retries != openai.DEFAULT_MAX_RETRIES:
            # the caller set max_retries: the one retry policy honours it (it was replaced by 4 attempts)
            retry = RetryConfig(attempts=client.max_retries + 1)
        retry = retry or RetryConfig()
        inner = client.with_options(max_retries=0)
        self._client = client
        self._inner = inner
        self._retry = retry
        self._label_fn = label_fn
        self.chat = _Namespace(completions=_Endpoint(inner.chat.completions, retry, is_async, label_fn))
        self.completions = _Endpoint(inner.completions, retry, is_async, label_fn)
        responses = getattr(inner, "responses", None)  # the Responses API: openai >= 1.66
        if responses is not None:
            # labelled and retried; a cut event stream is re-issued once and resumed
            self.responses = _Endpoint(responses, retry, is_async, label_fn, progress=ResponsesProgress)

    def with_options(self, **options: Any) -> LabelledClient:
        """`client.with_options(...)`, still labelled (forwarded bare, it returned the plain
        client, whose calls went unlabelled)."""
        return LabelledClient(self._client.with_options(**options), self._retry, self._label_fn)

    copy = with_options  # openai's alias

    @property
    def with_raw_response(self) -> _Overlay:
        """`client.with_raw_response.chat.completions.create(...)` etc., labelled and retried
        (forwarded bare, the client-level variant's calls went unlabelled)."""
        return self._variant("with_raw_response")

    @property
    def with_streaming_response(self) -> _Overlay:
        """`client.with_streaming_response....create(...)`, labelled (see `with_raw_response`)."""
        return self._variant("with_streaming_response")

    def _variant(self, name: str) -> _Overlay:
        base = getattr(self._inner, name)
        endpoints = {"completions": getattr(self.completions, name)}
        if hasattr(self, "responses"):
            endpoints["responses"] = getattr(self.responses, name)
        return _Overlay(base, chat=_Overlay(base.chat, completions=getattr(self.chat.completions, name)), **endpoints)

    @property
    def beta(self) -> Any:
        """`client.beta`, with `beta.chat.completions` (`parse`, `stream`: where openai 1.40-1.91
        keeps them) labelled and retried like `chat.completions`; forwarded bare, they went
        unlabelled."""
        beta = self._inner.beta
        chat = getattr(beta, "chat", None)
        if chat is None or not hasattr(chat, "completions"):
            return beta
        is_async = isinstance(self._client, openai.AsyncOpenAI)
        return _Overlay(beta, chat=_Overlay(chat, completions=_Endpoint(chat.completions, self._retry, is_async,
                                                                         self._label_fn)))

    @property
    def api_key(self) -> Any:
        """The key its calls send. The calls go through a copy of the wrapped client, and
        with a key provider (openai >= 2: api_key=callable) only that copy stores each
        refreshed key."""
        return self._inner.api_key

    @property
    def raw(self) -> Any:
        """The wrapped client (unlabelled calls)."""
        return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def labelled(client: Any, retry: RetryConfig | None = None) -> LabelledClient:
    """Wrap `client` so every chat/completions call carries the current Topas label."""
    return LabelledClient(client, retry)
