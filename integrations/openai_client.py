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
`topas`, or any X-Topas-* label header in `extra_headers` or in the client's `default_headers`)
keeps it whole and gets nothing of the one in force. Calls are retried
with tenacity on connection errors, timeouts, 5xx, 408 and 429 answers, `max_retries` times
(the client's, openai's default 2; or `RetryConfig(attempts=...)`: the wrapper's `max_retries`
then reports attempts - 1), never on other 4xx; a stream that
breaks mid-way is re-issued once and resumed (`topas_agents.cluster.stream_retry`). The inner
client's own retries are switched off (`with_options(max_retries=0)`) so there is exactly one
retry policy. Works with openai 1.x, 2.x and 3.x (only `extra_body`, `extra_headers`,
`with_options` and the exception classes are used, all stable across those majors).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import openai
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from topas_agents.cluster.stream_retry import (
    AsyncResumingStream,
    ResponsesProgress,
    ResumingStream,
    chunk_progress,
)
from topas_agents.integrations.task import note_unlabelled_call
from topas_agents.labels import BODY_KEY, Label, carries_label, current_label


@dataclass(frozen=True, slots=True)
class RetryConfig:
    attempts: int = 4  # the first call and its retries (`labelled()` without one: max_retries + 1)
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


def with_label(kwargs: Mapping[str, Any], lab: Label | None, client_headers: Iterable[str] = ()) -> dict[str, Any]:
    """A copy of `kwargs` whose extra_body/extra_headers carry `lab` (caller dicts untouched).
    `client_headers`: the names of the headers the client sends on every call (its
    `default_headers`)."""
    out = dict(kwargs)
    if lab is None or _carries_label(out, client_headers):
        return out  # an explicit label (per call, or the client's own headers) wins, whole
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


def _carries_label(kwargs: Mapping[str, Any], client_headers: Iterable[str]) -> bool:
    """The call is labelled already: its extra_body or extra_headers, or the client's default
    headers (which httpx_labels sees on the request: the two paths disagreed on who won)."""
    headers = [*(kwargs.get("extra_headers") or ()), *client_headers]
    return carries_label(kwargs.get("extra_body"), headers)


@dataclass(frozen=True, slots=True)
class _Labeller:
    """How a client's calls get their label: the label in force (`label_fn`), unless the call or
    the client (`client_headers`: its default headers' names) carries one."""
    label_fn: Callable[[], Label | None]
    client_headers: frozenset[str] = frozenset()

    def apply(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        out = with_label(kwargs, self.label_fn(), self.client_headers)
        if not _carries_label(out, self.client_headers):
            note_unlabelled_call()  # inside task(...): a warning, once per task
        return out


class _Endpoint:
    """Wraps one `create` endpoint (chat.completions, completions or responses) and its
    `parse` and `stream` helpers."""

    def __init__(self, target: Any, retry: RetryConfig, is_async: bool, labeller: _Labeller,
                 resume_streams: bool = True, progress: Callable[[], Any] | None = None) -> None:
        self._target = target
        self._retry = retry
        self._async = is_async
        self._labeller = labeller
        self._resume = resume_streams
        self._progress = progress  # what a stream's chunks deliver (stream_retry; None: chat's)

    @property
    def with_raw_response(self) -> _Endpoint:
        """openai's raw-response variant, labelled and retried like `create` (a raw stream is
        the caller's to read, so it is not resumed). Forwarded bare, its calls went unlabelled."""
        return _Endpoint(self._target.with_raw_response, self._retry, self._async, self._labeller,
                         resume_streams=False)

    @property
    def with_streaming_response(self) -> _LabelledOnly:
        """openai's streaming-response variant (a context manager), labelled; not retried:
        the response is opened by the caller's `with`, after this call returns."""
        return _LabelledOnly(self._target.with_streaming_response, self._labeller)

    def _retrying_kwargs(self) -> dict[str, Any]:
        r = self._retry
        return {
            "stop": stop_after_attempt(r.attempts),
            "wait": _honouring_retry_after(wait_exponential(min=r.wait_min_s, max=r.wait_max_s)),
            "retry": retry_if_exception(is_retryable),
            "reraise": True,
        }

    def create(self, **kwargs: Any) -> Any:
        call_kwargs = self._labeller.apply(kwargs)
        if self._async:
            return self._acreate(call_kwargs)
        result = self._create_once(call_kwargs)
        if call_kwargs.get("stream") and self._resume:
            # A stream cut mid-way (a replica died behind the gateway: no [DONE], or an error
            # event) is re-issued once, with the same label, and resumed after what was delivered.
            return ResumingStream(result, lambda: self._create_once(call_kwargs),
                                  progress=self._progress or chunk_progress(call_kwargs))
        return result

    @property
    def parse(self) -> Callable[..., Any]:
        """openai's structured-output helper (`chat.completions.parse`, `responses.parse`),
        labelled and retried like `create`. Forwarded bare, its calls went unlabelled. An
        openai without it (1.x before 1.40) raises AttributeError here, as it would."""
        getattr(self._target, "parse")  # noqa: B009 - the target's AttributeError, at access

        def parse(**kwargs: Any) -> Any:
            call_kwargs = self._labeller.apply(kwargs)
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
            return target(**self._labeller.apply(kwargs))
        return stream

    def _create_once(self, call_kwargs: dict[str, Any], method: str = "create") -> Any:
        for attempt in Retrying(**self._retrying_kwargs()):
            with attempt:
                return getattr(self._target, method)(**call_kwargs)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _acreate(self, call_kwargs: dict[str, Any]) -> Any:
        result = await self._acreate_once(call_kwargs)
        if call_kwargs.get("stream") and self._resume:
            return AsyncResumingStream(result, lambda: self._acreate_once(call_kwargs),
                                       progress=self._progress or chunk_progress(call_kwargs))
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

    def __init__(self, target: Any, labeller: _Labeller) -> None:
        self._target = target
        self._labeller = labeller

    def create(self, **kwargs: Any) -> Any:
        return self._target.create(**self._labeller.apply(kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


class _Overlay:
    """`base` (an openai resource group) with its chat/completion endpoints labelled; every
    other attribute forwarded (embeddings, files, ... go as they are)."""

    def __init__(self, base: Any, **labelled: Any) -> None:
        self._base = base
        self.__dict__.update(labelled)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


class _ChatOverlay(_Overlay):
    """`client.chat`: `completions` labelled, its `with_raw_response` / `with_streaming_response`
    variants too (a bare namespace had neither: AttributeError), the rest forwarded."""

    completions: _Endpoint

    @property
    def with_raw_response(self) -> _Overlay:
        return _Overlay(self._base.with_raw_response, completions=self.completions.with_raw_response)

    @property
    def with_streaming_response(self) -> _Overlay:
        return _Overlay(self._base.with_streaming_response, completions=self.completions.with_streaming_response)


def _retry_for(client: Any, retry: RetryConfig | None) -> RetryConfig:
    """The one retry policy: `retry` if given, else the client's `max_retries` retries (openai's
    default 2 included: a 4-attempt default made `max_retries` say 2 while 3 retries happened,
    and an explicit max_retries=2 could not be told from the default)."""
    return retry if retry is not None else RetryConfig(attempts=client.max_retries + 1)


class LabelledClient:
    """A thin proxy over an `openai.OpenAI` / `openai.AsyncOpenAI` client."""

    def __init__(self, client: Any, retry: RetryConfig | None = None,
                 label_fn: Callable[[], Label | None] = current_label) -> None:
        is_async = isinstance(client, openai.AsyncOpenAI)
        if not is_async and not isinstance(client, openai.OpenAI):
            raise TypeError(f"expected openai.OpenAI or openai.AsyncOpenAI, got {type(client).__name__}")
        retry = _retry_for(client, retry)
        inner = client.with_options(max_retries=0)
        self._client = client
        self._inner = inner
        self._retry = retry
        self._label_fn = label_fn
        labeller = _Labeller(label_fn, frozenset(client.default_headers))
        self._labeller = labeller
        self.chat = _ChatOverlay(inner.chat, completions=_Endpoint(inner.chat.completions, retry, is_async, labeller))
        self.completions = _Endpoint(inner.completions, retry, is_async, labeller)
        responses = getattr(inner, "responses", None)  # the Responses API: openai >= 1.66
        if responses is not None:
            # labelled and retried; a cut event stream is re-issued once and resumed
            self.responses = _Endpoint(responses, retry, is_async, labeller, progress=ResponsesProgress)

    @property
    def max_retries(self) -> int:
        """How many times a failed call is retried (the wrapper's policy; its inner client's are off)."""
        return self._retry.attempts - 1

    def with_options(self, **options: Any) -> LabelledClient:
        """`client.with_options(...)`, still labelled (forwarded bare, it returned the plain
        client, whose calls went unlabelled). `max_retries=N` sets the wrapper's retries (N + 1
        attempts, the same waits); it was ignored."""
        retry = self._retry
        if options.get("max_retries") is not None:
            retry = replace(retry, attempts=options["max_retries"] + 1)
        return LabelledClient(self._client.with_options(**options), retry, self._label_fn)

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
        return _Overlay(base, chat=getattr(self.chat, name), **endpoints)

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
        return _Overlay(beta, chat=_ChatOverlay(chat, completions=_Endpoint(chat.completions, self._retry, is_async,
                                                                             self._labeller)))

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
    """Wrap `client` so every chat/completions call carries the current Topas label. A client
    wrapped already is returned as it is (or re-wrapped with `retry`, when given): wrapping
    twice raised TypeError."""
    if isinstance(client, LabelledClient):
        return client if retry is None else LabelledClient(client.raw, retry, client._label_fn)
    return LabelledClient(client, retry)
