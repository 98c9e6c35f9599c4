"""OpenAI response objects and SSE framing for chat completions and completions, the
request's function tools (`tools`, `tool_choice`): parsed here, answered with `tool_calls`,
and its `response_format` (parsed here; the responders answer JSON for the JSON formats).

A call that answers with a tool call carries a `ToolCall` (`Call.tool_call`); its `Call.text`
is the call's JSON arguments, so streaming sends the arguments in pieces exactly as it sends
text, with OpenAI's tool-call deltas (id and name first, then `function.arguments` pieces).
"""

from __future__ import annotations

import json
import re
import reprlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .api_errors import ApiError, bad_request
from .tokens import count_tokens

if TYPE_CHECKING:
    from .calls import Call

DONE = b"data: [DONE]\n\n"

# ---------------------------------------------------------------------------- tools (request)

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
ToolChoiceMode = Literal["none", "auto", "required", "function"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One `{"type": "function", "function": {...}}` entry of `tools`."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)  # JSON schema of the arguments


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: ToolChoiceMode
    name: str | None = None  # mode "function": the function the client forces


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """The request's tools; `prompt_tokens`: the definitions as the model reads them."""

    tools: tuple[ToolSpec, ...] = ()
    choice: ToolChoice = ToolChoice("none")
    prompt_tokens: int = 0

    @property
    def wanted(self) -> bool:
        """Whether the reply may be a tool call (tools given, tool_choice not "none")."""
        return bool(self.tools) and self.choice.mode != "none"

    def spec(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)


NO_TOOLS = ToolRequest()


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A reply that calls function `name`; `arguments` is a JSON object's text."""

    id: str
    name: str
    arguments: str


def short_repr(value: Any) -> str:
    """User input in an error message: bounded, and never raising (a 5000-digit int's repr does)."""
    try:
        return reprlib.repr(value)
    except ValueError:  # a huge int's repr raises
        return "a huge integer"


def _tool(raw: Any, i: int) -> ToolSpec:
    where = f"tools[{i}]"
    if not isinstance(raw, Mapping) or raw.get("type") != "function":
        raise bad_request(f"{where} must be an object with \"type\": \"function\", got {short_repr(raw)}", "tools")
    fn = raw.get("function")
    if not isinstance(fn, Mapping):
        raise bad_request(f"{where}.function must be an object", "tools")
    name = fn.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise bad_request(f"{where}.function.name must be 1-64 letters, digits, '_' or '-', got {short_repr(name)}",
                          "tools")
    desc = fn.get("description")
    if desc is not None and not isinstance(desc, str):
        raise bad_request(f"{where}.function.description must be a string", "tools")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, Mapping):
        raise bad_request(f"{where}.function.parameters must be a JSON schema object, got {short_repr(params)}",
                          "tools")
    for key, kind in (("properties", Mapping), ("required", list)):
        if params is not None and params.get(key) is not None and not isinstance(params[key], kind):
            raise bad_request(f"{where}.function.parameters.{key} must be "
                              f"{'an object' if kind is Mapping else 'a list'}", "tools")
    return ToolSpec(name, desc or "", params or {})


def _tool_choice(raw: Any, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    if raw is None:
        return ToolChoice("auto" if tools else "none")
    if raw in ("none", "auto", "required"):
        if raw == "required" and not tools:
            raise bad_request("tool_choice \"required\" needs a non-empty 'tools'", "tool_choice")
        return ToolChoice(raw)
    fn = raw.get("function") if isinstance(raw, Mapping) and raw.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise bad_request("tool_choice must be \"none\", \"auto\", \"required\" or "
                          f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {short_repr(raw)}",
                          "tool_choice")
    if not any(t.name == name for t in tools):
        raise bad_request(f"tool_choice names function {short_repr(name)}, which is not in 'tools'", "tool_choice")
    return ToolChoice("function", name)


def parse_tools(body: Mapping[str, Any]) -> ToolRequest:
    """`tools` and `tool_choice` of a chat request; malformed ones are a 400 naming the field.
    An empty `tools` list means no tools (as vLLM and SGLang take it)."""
    raw = body.get("tools")
    if raw is not None and not isinstance(raw, list):
        raise bad_request(f"'tools' must be a list of function tools, got {short_repr(raw)}", "tools")
    tools = tuple(_tool(t, i) for i, t in enumerate(raw or ()))
    choice = _tool_choice(body.get("tool_choice"), tools)
    cost = count_tokens(json.dumps(raw, separators=(",", ":"))) if tools else 0
    return ToolRequest(tools, choice, cost)


# ---------------------------------------------------------------------------- response_format (request)

ResponseFormatKind = Literal["text", "json_object", "json_schema", "structural_tag"]


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """A request's `response_format` (SGLang 0.5.23 reads it on chat and completions). The
    echo and lorem responders answer JSON for `json_object` and `json_schema` (a value of the
    schema); `structural_tag` (SGLang's tags) is answered as text."""

    kind: ResponseFormatKind = "text"
    schema: Mapping[str, Any] = field(default_factory=dict)  # json_schema: the schema ({}: any)


TEXT_FORMAT = ResponseFormat()
_FORMAT_KINDS = ("text", "json_object", "json_schema", "structural_tag")


def parse_response_format(body: Mapping[str, Any]) -> ResponseFormat:
    """`response_format`, as SGLang takes it: `{"type": "json_schema", "json_schema": {"name":
    ..., "schema": {...}}}`, or the schema directly under `response_format.schema`; a
    malformed one is a 400 naming the field (SGLang answers those with an error too)."""
    raw = body.get("response_format")
    if raw is None:
        return TEXT_FORMAT
    kind = raw.get("type") if isinstance(raw, Mapping) else None
    if kind not in _FORMAT_KINDS:
        raise bad_request(f"'response_format' must be an object whose 'type' is one of {', '.join(_FORMAT_KINDS)}, "
                          f"got {short_repr(raw)}", "response_format")
    if kind != "json_schema":
        return TEXT_FORMAT if kind == "text" else ResponseFormat(kind)
    spec = raw.get("json_schema")
    if spec is None and isinstance(raw.get("schema"), Mapping):
        return ResponseFormat("json_schema", raw["schema"])
    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
        raise bad_request("response_format.json_schema must be an object with a string 'name' and a JSON "
                          f"schema object 'schema', got {short_repr(spec)}", "response_format")
    schema = spec.get("schema")
    if schema is not None and not isinstance(schema, Mapping):
        raise bad_request(f"response_format.json_schema.schema must be a JSON schema object, got {short_repr(schema)}",
                          "response_format")
    return ResponseFormat("json_schema", schema or {})


def tool_call_of(call: Call) -> ToolCall | None:
    """The tool call a call answers with (None: a text answer)."""
    return call.tool_call


def _tool_calls_json(tool: ToolCall, arguments: str, streaming: bool) -> list[dict[str, Any]]:
    item: dict[str, Any] = {"id": tool.id, "type": "function", "function": {"name": tool.name,
                                                                             "arguments": arguments}}
    return [{"index": 0, **item}] if streaming else [item]


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _head(kind: str, rid: str, created: int, model: str, streaming: bool) -> dict[str, Any]:
    if kind == "chat":
        obj = "chat.completion.chunk" if streaming else "chat.completion"
    else:
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "system_fingerprint": None}


def topas_info(call: Call) -> dict[str, Any]:
    r = call.record
    return {"rid": r.rid, "task_id": r.public_task_id, "stage": r.stage, "agent": r.public_agent, "round": r.round,
            "arrival_s": r.arrival_s, "first_token_s": r.first_token_s, "finish_s": r.finish_s}


def full_response(kind: str, call: Call, model: str) -> dict[str, Any]:
    out = _head(kind, call.rid, int(time.time()), model, False)
    tool = tool_call_of(call)
    if kind == "chat" and tool is not None:
        message = {"role": "assistant", "content": None, "tool_calls": _tool_calls_json(tool, call.text, False)}
        choice: dict[str, Any] = {"index": 0, "message": message}
    elif kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": call.text}}
    else:
        choice = {"index": 0, "text": call.text}
    choice.update(logprobs=None, finish_reason=call.finish_reason)
    out.update(choices=[choice], usage=call.usage, topas=topas_info(call))
    return out


class ChunkWriter:
    """Builds the SSE chunks of one streamed response."""

    def __init__(self, kind: str, call: Call, model: str, include_usage: bool) -> None:
        self.kind = kind
        self.call = call
        self.model = model
        self.include_usage = include_usage
        self.created = int(time.time())
        self.tool = tool_call_of(call) if kind == "chat" else None

    def _delta(self, text: str | None, first: bool) -> dict[str, Any]:
        if self.tool is None:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            return delta
        if first:  # id, type and name once, then argument pieces (what the OpenAI API sends)
            return {"role": "assistant", "content": None,
                    "tool_calls": _tool_calls_json(self.tool, "", True)}
        return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]} if text else {}

    def _chunk(self, text: str | None, finish: str | None, first: bool = False) -> bytes:
        out = _head(self.kind, self.call.rid, self.created, self.model, True)
        if self.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "delta": self._delta(text, first)}
        else:
            choice = {"index": 0, "text": text or ""}
        choice.update(logprobs=None, finish_reason=finish)
        out["choices"] = [choice]
        if self.include_usage:
            out["usage"] = None
        return sse(out)

    def start(self) -> bytes | None:
        return self._chunk(None, None, first=True) if self.kind == "chat" else None

    def text(self, text: str) -> bytes:
        return self._chunk(text, None)

    def finish(self) -> bytes:
        return self._chunk(None, self.call.finish_reason)

    def usage(self) -> bytes:
        out = _head(self.kind, self.call.rid, self.created, self.model, True)
        out.update(choices=[], usage=self.call.usage)
        return sse(out)

    def end(self) -> bytes:
        """The last chunk, the usage chunk when asked for, and [DONE]."""
        return self.finish() + (self.usage() if self.include_usage else b"") + DONE

    def failed(self, err: ApiError) -> bytes:
        return sse(err.body()) + DONE
