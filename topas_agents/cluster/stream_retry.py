"""Client side of failover for streams: a stream that breaks is re-opened once and resumed.

A replica dying mid-stream ends the client's stream without `[DONE]` and without an error
event (smg passes the cut through as a clean end), or the gateway sends an error event
(openai raises `APIError`). `ResumingStream` / `AsyncResumingStream` wrap an `openai` stream:
when it ends before any choice has a `finish_reason`, or raises a transient error, they
re-issue the same call once (a second break raises: `StreamCutError`, or the error itself) (the gateway re-homes it; the new replica rebuilds the task from
the label) and skip the text already delivered, so the caller sees every character once and
the usage chunk of the call that finished. Resuming assumes the replay produces the same
text prefix (true for the simulated replicas; for a sampled LLM the caller gets the new
call's text after the delivered length). Nothing is re-issued after the caller's own `close()`,
nor once everything the call sends has arrived (every choice's `finish_reason` and, when asked
for, the usage chunk; or the final response event) and only `[DONE]` was lost: iteration then
simply ends, each chunk handed once.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from typing import Any

import httpx
import openai

from ..errors import TopasError

RESUME_ATTEMPTS = 1  # one retry, so a hopeless call fails fast


class StreamCutError(TopasError, ConnectionError):
    """A stream ended before any choice finished, and again after its re-issue. Raised, not
    swallowed: ending the iteration quietly handed the caller partial text as a success."""


def _cut(resumed: int) -> StreamCutError:
    return StreamCutError(f"the stream ended without a finish_reason or a final response event (re-issued "
                          f"{resumed} time(s)): the server or the gateway cut it")


def transient(exc: BaseException) -> bool:
    """Errors worth one re-issue: transport breaks, 5xx, and error events inside a stream."""
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500
    return isinstance(exc, (openai.APIConnectionError, openai.APIError, httpx.TransportError))


def _text_field(choice: Any) -> tuple[Any, str]:
    delta = getattr(choice, "delta", None)
    return (delta, "content") if delta is not None else (choice, "text")


class _Replay:
    """What a call has delivered per text stream (a choice, or an output item's content part),
    and where a replay has got to; `finished` once the stream's end was seen."""

    def __init__(self) -> None:
        self.delivered: dict[Any, int] = {}
        self.replayed: dict[Any, int] = {}
        self.finished = False
        self.replaying = False

    def restart(self) -> None:
        self.replaying = True
        self.replayed = {}

    @property
    def complete(self) -> bool:
        """Everything the call will send has arrived: a break now loses nothing."""
        return self.finished

    def trim(self, key: Any, text: str) -> str:
        """`text`, the next piece of stream `key`, less what the caller already has."""
        done = self.delivered.get(key, 0)
        if not self.replaying:
            self.delivered[key] = done + len(text)
            return text
        seen = self.replayed.get(key, 0)
        self.replayed[key] = seen + len(text)
        self.delivered[key] = max(done, self.replayed[key])
        return text[min(len(text), max(0, done - seen)):]


class _Progress(_Replay):
    """`_Replay` of chat and completion chunks, per choice index: their text, and a chat
    delta's tool calls (each call's id and name once, its argument pieces trimmed like text).
    Only the text was tracked before: a replayed tool call was dropped, and the caller got
    arguments cut mid-JSON, or no call at all, under finish_reason "tool_calls"."""

    def __init__(self, wants_usage: bool = False) -> None:
        super().__init__()
        self.announced: set[tuple[int, int]] = set()  # (choice, tool call) whose id/name the caller has
        self.wants_usage = wants_usage  # stream_options.include_usage: a usage chunk ends the stream
        self.open_choices: set[int] = set()  # choices seen without their finish_reason yet
        self.done_choices: set[int] = set()  # choices whose finish_reason the caller has
        self.usage_seen = False

    @property
    def complete(self) -> bool:
        # with n > 1 one choice's finish is not the others', and the usage chunk comes last
        return self.finished and not self.open_choices and (self.usage_seen or not self.wants_usage)

    def admit(self, chunk: Any) -> Any | None:
        """The chunk to hand to the caller (text trimmed on a replay), or None to drop it."""
        keep = not self.replaying or not chunk.choices  # a usage-only chunk always passes
        for choice in chunk.choices:
            owner, attr = _text_field(choice)
            text = getattr(owner, attr, None) or ""
            kept = self.trim(choice.index, text)
            calls = self._admit_tool_calls(choice)
            if self.replaying:
                if len(kept) != len(text):
                    setattr(owner, attr, kept)
                # a finish the caller already has (the break came after it) is not handed twice
                keep = keep or bool(kept) or bool(calls) or (choice.finish_reason is not None
                                                             and choice.index not in self.done_choices)
            if choice.finish_reason is not None:
                self.finished = True
                self.open_choices.discard(choice.index)
                self.done_choices.add(choice.index)
            else:
                self.open_choices.add(choice.index)
        if getattr(chunk, "usage", None) is not None:
            self.usage_seen = True
        return chunk if keep else None

    def _admit_tool_calls(self, choice: Any) -> list[Any]:
        """The tool-call deltas of `choice` that carry something new (all, outside a replay)."""
        delta = getattr(choice, "delta", None)
        calls = getattr(delta, "tool_calls", None)
        if not calls:
            return []
        kept = []
        for call in calls:
            key = (choice.index, call.index)
            fn = call.function
            if call.id is not None or (fn is not None and fn.name):  # the call's announcement
                if self.replaying and key in self.announced:
                    call.id = call.type = None
                    if fn is not None:
                        fn.name = None
                self.announced.add(key)
            args = (fn.arguments if fn is not None else None) or ""
            rest = self.trim(("tool_call", *key), args)
            if self.replaying and fn is not None and len(rest) != len(args):
                fn.arguments = rest
            if not self.replaying or rest or call.id is not None or (fn is not None and fn.name):
                kept.append(call)
        if self.replaying:
            delta.tool_calls = kept or None
        return kept


# The Responses API's stream: its deltas, and the events that end it.
_RESPONSE_DELTAS = ("response.output_text.delta", "response.function_call_arguments.delta")
_RESPONSE_ENDS = ("response.completed", "response.incomplete", "response.failed")
_RESPONSE_OPENERS = ("response.created", "response.in_progress")


class ResponsesProgress(_Replay):
    """`_Replay` of a Responses API event stream: it is over at its `response.completed`
    (or `.incomplete` / `.failed`) event; on a replay, the opening and `.added` events the
    caller has already seen are dropped, and text and argument deltas are trimmed by what was
    delivered (per output item and content part)."""

    def __init__(self) -> None:
        super().__init__()
        self.announced: set[tuple[str, int, int]] = set()

    def admit(self, event: Any) -> Any | None:
        kind = getattr(event, "type", "")
        where = (getattr(event, "output_index", -1), getattr(event, "content_index", -1) or 0)
        if kind in _RESPONSE_ENDS:
            self.finished = True
        if kind in _RESPONSE_OPENERS or kind.endswith(".added"):
            seen = (kind, *where)
            if self.replaying and seen in self.announced:
                return None  # the caller has it from the first attempt
            self.announced.add(seen)
        if kind not in _RESPONSE_DELTAS:
            return event
        text = getattr(event, "delta", "") or ""
        kept = self.trim(where, text)
        if not self.replaying:
            return event
        if len(kept) != len(text):
            event.delta = kept
        return event if event.delta else None


def _over(progress: _Replay, closed: bool, broke: bool) -> bool:
    """The stream needs no re-issue: the caller closed it (its own read then fails or stops
    short); or it ended after a finish_reason (the rule for a clean end); or it broke after
    everything the call sends had arrived (every choice's finish_reason, and the usage chunk
    when asked for: re-issuing then sent the call twice and repeated the final chunk)."""
    return closed or (progress.complete if broke else progress.finished)


def chunk_progress(call_kwargs: dict[str, Any]) -> Callable[[], _Replay]:
    """The progress of a chat or completions stream made with `call_kwargs`."""
    wants_usage = bool((call_kwargs.get("stream_options") or {}).get("include_usage"))
    return partial(_Progress, wants_usage=wants_usage)


class ResumingStream:
    """Iterate like the `openai.Stream` it wraps; re-opens the call once if it breaks.
    `progress`: what a chunk or event delivers (default: chat and completion chunks;
    `ResponsesProgress` for Responses API events)."""

    def __init__(self, stream: Any, reopen: Callable[[], Any], attempts: int = RESUME_ATTEMPTS,
                 progress: Callable[[], _Replay] | None = None) -> None:
        self._stream = stream
        self._reopen = reopen
        self._attempts = attempts
        self._progress = progress or _Progress
        self.resumed = 0  # how many times the call was re-issued
        self._it: Iterator[Any] | None = None
        # The caller closed it: the read error (or early end) that follows is the close, not a
        # break, and re-issuing it sent the whole call again and kept yielding text.
        self._closed = False

    def __next__(self) -> Any:
        if self._it is None:
            self._it = iter(self)
        return next(self._it)

    def __iter__(self) -> Iterator[Any]:
        progress = self._progress()
        while not self._closed:
            try:
                for chunk in self._stream:
                    out = progress.admit(chunk)
                    if out is not None:
                        yield out
                error: BaseException | None = None
            except Exception as exc:
                if not transient(exc) and not self._closed:
                    raise
                error = exc
            if _over(progress, self._closed, error is not None):
                return
            if self.resumed >= self._attempts:
                raise error if error is not None else _cut(self.resumed)
            with contextlib.suppress(Exception):
                self._stream.close()
            self.resumed += 1
            progress.restart()
            self._stream = self._reopen()

    def close(self) -> None:
        """Close the response; iterating after this ends at once (nothing is re-issued)."""
        self._closed = True
        self._stream.close()

    def __enter__(self) -> ResumingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class AsyncResumingStream:
    """The `openai.AsyncStream` counterpart of `ResumingStream`."""

    def __init__(self, stream: Any, reopen: Callable[[], Awaitable[Any]], attempts: int = RESUME_ATTEMPTS,
                 progress: Callable[[], _Replay] | None = None) -> None:
        self._stream = stream
        self._reopen = reopen
        self._attempts = attempts
        self._progress = progress or _Progress
        self.resumed = 0
        self._ait: AsyncIterator[Any] | None = None
        self._closed = False  # the caller closed it (see ResumingStream)

    async def __anext__(self) -> Any:
        if self._ait is None:
            self._ait = self.__aiter__()
        return await self._ait.__anext__()

    async def __aiter__(self) -> AsyncIterator[Any]:
        progress = self._progress()
        while not self._closed:
            try:
                async for chunk in self._stream:
                    out = progress.admit(chunk)
                    if out is not None:
                        yield out
                error: BaseException | None = None
            except Exception as exc:
                if not transient(exc) and not self._closed:
                    raise
                error = exc
            if _over(progress, self._closed, error is not None):
                return
            if self.resumed >= self._attempts:
                raise error if error is not None else _cut(self.resumed)
            with contextlib.suppress(Exception):
                await self._stream.close()
            self.resumed += 1
            progress.restart()
            self._stream = await self._reopen()

    async def close(self) -> None:
        """Close the response; iterating after this ends at once (nothing is re-issued)."""
        self._closed = True
        await self._stream.close()

    async def __aenter__(self) -> AsyncResumingStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
