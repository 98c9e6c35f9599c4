"""Parsing and validating OpenAI request bodies (chat completions and completions).

Only what the simulator needs is interpreted: the prompt text (token counts, responder
input), `max_tokens`, `n` (must be 1), `stream`, `stream_options.include_usage`, a chat
request's `tools`/`tool_choice` (openai_format.parse_tools) and `response_format`
(openai_format.parse_response_format: the reply is JSON when JSON is asked for).
Sampling parameters are checked as SGLang checks them (`_check_sampling`: a request the real
server would refuse is refused here too, not served) and otherwise ignored. Errors are
`ApiError(400)` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from pydantic import TypeAdapter, ValidationError

from . import tokens
from .api_errors import bad_request
from .openai_format import (
    NO_TOOLS,
    TEXT_FORMAT,
    ResponseFormat,
    ToolRequest,
    parse_response_format,
    parse_tools,
    short_repr,
)

CallKind = Literal["chat", "completion"]
# Largest max_tokens accepted: above any KV budget (such a call is a 400 anyway), and it keeps
# every later integer computation small.
MAX_TOKENS = 2**31 - 1
MAX_MODEL_CHARS = 256  # the model name is echoed in every response and chunk
_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
# Sampling parameters as SGLang 0.5.23 reads them: the type of its OpenAI request models'
# field (pydantic, lax: "0.7" and true are numbers there too) and, for numbers, the range its
# SamplingParams.verify() accepts: (lowest, highest, whether the lowest itself is allowed).
_SAMPLING_TYPES: dict[str, TypeAdapter] = {
    "temperature": TypeAdapter(float), "top_p": TypeAdapter(float), "frequency_penalty": TypeAdapter(float),
    "presence_penalty": TypeAdapter(float), "seed": TypeAdapter(int), "stop": TypeAdapter(str | list[str]),
}
_INT = TypeAdapter(int)


class SamplingRange(NamedTuple):
    """A sampling parameter's accepted values: from `low` (itself accepted when `low_ok`) to
    `high` (None: no upper bound), as OpenAI's API takes them."""

    low: float
    high: float | None
    low_ok: bool


_SAMPLING_RANGES: dict[str, SamplingRange] = {
    "temperature": SamplingRange(0.0, None, True),
    "top_p": SamplingRange(0.0, 1.0, False),
    "frequency_penalty": SamplingRange(-2.0, 2.0, True),
    "presence_penalty": SamplingRange(-2.0, 2.0, True),
}


class CommonFields(NamedTuple):
    """What chat and completion bodies share, checked."""

    model: str | None
    max_tokens: int | None
    stream: bool
    include_usage: bool


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class ParsedCall:
    kind: CallKind
    model: str | None
    messages: tuple[Message, ...]  # a completion's prompt is one "user" message
    max_tokens: int | None
    stream: bool
    include_usage: bool
    prompt_tokens: int  # whole prompt, framing included (chat)
    system_tokens: int  # leading system messages: the default agent-prefix estimate
    tools: ToolRequest = NO_TOOLS  # chat: the function tools offered and tool_choice
    response_format: ResponseFormat = TEXT_FORMAT  # JSON asked for: the responders answer JSON
    stop: tuple[str, ...] = ()  # the text ends before the first of these (OpenAI's `stop`)

    @property
    def last_user(self) -> str:
        for m in reversed(self.messages):
            if m.role == "user":
                return m.content
        return self.messages[-1].content if self.messages else ""

    @property
    def full_text(self) -> str:
        return "\n".join(m.content for m in self.messages)


# Chat content parts OpenAI defines besides text: taken, adding no text (the simulated engine
# serves text; a multimodal call that SGLang would serve must not be refused here).
_MEDIA_PARTS = ("image_url", "input_audio", "file", "refusal", "audio")


def _content_text(content: Any, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                raise bad_request(f"messages[{i}].content[{j}] must be an object with a 'type'",
                                  f"messages[{i}].content")
            if part["type"] == "text":
                if not isinstance(part.get("text"), str):
                    raise bad_request(f"messages[{i}].content[{j}].text must be a string",
                                      f"messages[{i}].content")
                parts.append(part["text"])
            elif part["type"] not in _MEDIA_PARTS:  # an unknown type was served as an empty prompt
                raise bad_request(f"messages[{i}].content[{j}].type {part['type'][:40]!r} is not a chat content "
                                  f"part (text, {', '.join(_MEDIA_PARTS)})", f"messages[{i}].content")
        return "".join(parts)
    raise bad_request(f"messages[{i}].content must be a string or a list of parts", f"messages[{i}].content")


def _messages(body: Mapping[str, Any]) -> tuple[Message, ...]:
    raw = body.get("messages")
    if raw is None:
        raise bad_request("'messages' is required", "messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, Mapping):
            raise bad_request(f"messages[{i}] must be an object", f"messages[{i}]")
        role = m.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise bad_request(f"messages[{i}].role must be one of {sorted(_ROLES)}, got {short_repr(role)}",
                              f"messages[{i}].role")
        out.append(Message(role, _content_text(m.get("content"), i)))
    return tuple(out)


def _prompt(body: Mapping[str, Any]) -> tuple[str, int | None]:
    """A completion's prompt text, plus its token count when given as token ids."""
    raw = body.get("prompt")
    if raw is None:
        raise bad_request("'prompt' is required", "prompt")
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
        raw = raw[0]
    if isinstance(raw, str):
        if not raw:
            raise bad_request("'prompt' must not be empty", "prompt")
        return raw, None
    if isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool)
                                             and 0 <= t <= MAX_TOKENS for t in raw):
        return "", len(raw)
    raise bad_request("'prompt' must be a non-empty string, a list of one such string, or a list of token ids "
                      f"(integers 0 .. {MAX_TOKENS})", "prompt")


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    """`max_tokens`, else `max_completion_tokens`; each one given is checked (an invalid field
    is a 400 even when the other is valid, not silently ignored)."""
    given = []
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is None:
            continue
        try:  # as SGLang's pydantic field reads it (lax: 3.0 and "3" are 3; 3.5, "x" and true are not)
            number = _INT.validate_python(value) if not isinstance(value, bool) else None
        except ValidationError:
            number = None
        if number is None or not 1 <= number <= MAX_TOKENS:
            raise bad_request(f"'{key}' must be an integer >= 1 and <= {MAX_TOKENS}, got {short_repr(value)}", key)
        given.append(number)
    return given[0] if given else None


def _stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request(f"'stream' must be a boolean, got {short_repr(stream)}", "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, Mapping):
        raise bad_request("'stream_options' must be an object", "stream_options")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise bad_request("'stream_options.include_usage' must be a boolean", "stream_options.include_usage")
    return stream, usage


def _check_sampling(body: Mapping[str, Any]) -> None:
    """The sampling parameters a client sends (null means unset, as in the OpenAI API)."""
    for key, adapter in _SAMPLING_TYPES.items():
        raw = body.get(key)
        if raw is None:
            continue
        try:
            value = adapter.validate_python(raw)
        except ValidationError:
            what = {"seed": "an integer", "stop": "a string or a list of strings"}.get(key, "a number")
            raise bad_request(f"'{key}' must be {what}, got {short_repr(raw)}", key) from None
        if key not in _SAMPLING_RANGES:
            continue
        lo, hi, lo_ok = _SAMPLING_RANGES[key]
        if not math.isfinite(value) or value < lo or (value == lo and not lo_ok) or (hi is not None and value > hi):
            where = f"{'[' if lo_ok else '('}{lo:g}, {'inf)' if hi is None else f'{hi:g}]'}"
            raise bad_request(f"'{key}' must be a finite number in {where}, got {short_repr(raw)}", key)


def _common(body: Any) -> CommonFields:
    if not isinstance(body, Mapping):
        raise bad_request("request body must be a JSON object")
    _check_sampling(body)
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise bad_request(f"only n=1 is supported, got {short_repr(n)}", "n")
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or len(model) > MAX_MODEL_CHARS):
        raise bad_request(f"'model' must be a string of at most {MAX_MODEL_CHARS} characters", "model")
    return CommonFields(model, _max_tokens(body), *_stream_flags(body))


def parse_chat(body: Any) -> ParsedCall:
    model, max_tokens, stream, usage = _common(body)
    messages = _messages(body)
    leading = []
    for m in messages:
        if m.role not in ("system", "developer"):
            break
        leading.append(m.content)
    system = sum(tokens.message_tokens(c) for c in leading)
    tools = parse_tools(body)
    prompt = tokens.chat_tokens(m.content for m in messages) + tools.prompt_tokens
    return ParsedCall("chat", model, messages, max_tokens, stream, usage, prompt, system, tools,
                      parse_response_format(body), _stop(body))


def parse_completion(body: Any) -> ParsedCall:
    model, max_tokens, stream, usage = _common(body)
    text, given = _prompt(body)
    prompt = given if given is not None else max(1, tokens.count_tokens(text))
    return ParsedCall("completion", model, (Message("user", text),), max_tokens, stream, usage, prompt, 0,
                      response_format=parse_response_format(body), stop=_stop(body))


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    """`stop` (checked by `_check_sampling`) as the sequences that end the text; an empty one
    stops nothing."""
    stop = body.get("stop")
    sequences = (stop,) if isinstance(stop, str) else tuple(stop or ())
    return tuple(s for s in sequences if s)
