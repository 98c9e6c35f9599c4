"""The OpenAI Responses API (`POST /v1/responses`) on the simulated engine.

SGLang 0.5.23 serves it, and the OpenAI Agents SDK uses it by default. A Responses request is
translated into the chat-completions body it means (`chat_body`), so the chat parser, the
label, the engine and the responders serve it unchanged; the answer is rendered back as a
`response` object (`response_object`) or as its event stream (`ResponsesWriter`).

Taken: `input` (a string, or message / function_call / function_call_output items; reasoning
items are skipped), `instructions`, function `tools` and `tool_choice`, `max_output_tokens`,
`stream`, `text.format` (text, json_object, json_schema), the sampling fields chat checks,
and the `topas` label (body, X-Topas-* headers, or `metadata` entries `topas_*`). Refused with a 400 naming the field:
`previous_response_id` and `background` (the simulator stores no responses: send the whole
conversation), built-in tool types, and content parts other than text and media (image, file
and audio parts are taken and add no text, as chat's non-text parts). Other fields are echoed
or ignored.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

from .api_errors import ApiError, bad_request
from .calls import Call
from .openai_format import short_repr, topas_info

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text")
# Media parts are taken and carry no text, as chat's image_url parts: the simulated engine
# serves text, and an agent that attaches a screenshot or a file must not be refused here
# when SGLang (with a multimodal model) would serve it.
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")
_PASSED = ("model", "temperature", "top_p", "stream", "topas")  # same name, same meaning in chat


def chat_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat-completions body a Responses request means (400 naming the Responses field)."""
    for key in ("previous_response_id", "background"):
        if body.get(key):
            raise bad_request(f"'{key}' needs a response store; the simulated server keeps none: "
                              "send the whole conversation in 'input'", key)
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        # OpenAI refuses it too; it was taken and echoed back as {}
        raise bad_request(f"'metadata' must be an object of string values, got {short_repr(metadata)}", "metadata")
    out: dict[str, Any] = {k: body[k] for k in _PASSED if k in body}
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request(f"'instructions' must be a string, got {short_repr(instructions)}", "instructions")
        messages.append({"role": "system", "content": instructions})
    messages += _input_messages(body.get("input"))
    out["messages"] = messages
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    fmt = _text_format(body.get("text"))
    if fmt is not None:
        out["response_format"] = fmt
    return out


def _input_messages(raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise bad_request(f"'input' must be a string or a non-empty list of items, got {short_repr(raw)}", "input")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise bad_request(f"'{where}' must be an object, got {short_repr(item)}", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise bad_request(f"'{where}.role' must be one of {', '.join(_ROLES)}, got {short_repr(role)}", where)
            messages.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where), "arguments": _string(item, "arguments", where)}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)  # parallel calls of one turn: one assistant message
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                             "content": _text(item.get("output"), f"{where}.output")})
        elif kind != "reasoning":  # a reasoning item carries nothing the simulator reads
            raise bad_request(f"'{where}.type' {short_repr(kind)} is not supported by the simulated server "
                              "(message, function_call, function_call_output, reasoning)", where)
    return messages


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise bad_request(f"'{where}.{key}' must be a string, got {short_repr(value)}", f"{where}.{key}")
    return value


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of text parts (joined) and media parts
    (which add no text)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"'{where}' must be a string or a list of text parts, got {short_repr(content)}", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _MEDIA_PARTS:
            continue
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad_request(f"'{where}[{j}]' must be a text part ({', '.join(_TEXT_PARTS)}) or a media part "
                              f"({', '.join(_MEDIA_PARTS)}), got {short_repr(part)}", f"{where}[{j}]")
        texts.append(part["text"])
    return "".join(texts)


def _tools(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise bad_request(f"'tools' must be a list, got {short_repr(raw)}", "tools")
    out = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else tool
            raise bad_request(f"'tools[{i}]': only function tools are served by the simulated server, "
                              f"got {short_repr(kind)}", f"tools[{i}]")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(raw: Any) -> Any:
    if isinstance(raw, Mapping) and raw.get("type") == "function":
        return {"type": "function", "function": {"name": raw.get("name")}}
    return raw  # "auto" / "none" / "required"; anything else: chat's 400 on tool_choice


def _text_format(raw: Any) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format` (None: plain text)."""
    if raw is None:
        return None
    fmt = raw.get("format") if isinstance(raw, Mapping) else None
    if not isinstance(fmt, Mapping) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request(f"'text.format' must be an object whose 'type' is text, json_object or json_schema, "
                          f"got {short_repr(raw)}", "text.format")
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema")}}


# A Responses request is checked as the chat body it means: the chat parser's errors name
# chat fields, said here in the Responses request's own terms.
_CHAT_TERMS = (("max_new_tokens", "max_output_tokens"), ("max_tokens", "max_output_tokens"),
               ("response_format.json_schema", "text.format"), ("response_format", "text.format"),
               (".function.", "."), ('{"type": "function", "function": {"name": ...}}', '{"type": "function", "name": ...}'),
               ("messages", "input"))


def in_responses_terms(err: ApiError) -> ApiError:
    message, param = err.message, err.param
    for chat, responses in _CHAT_TERMS:
        message = message.replace(chat, responses)
        param = param.replace(chat, responses) if param is not None else None
    return ApiError(err.status, message, param, err.type, err.code)


# ---------------------------------------------------------------------------- answers


def _json_or(value: Any, default: Any) -> Any:
    """`value` if it is strict JSON, else `default`: the request body may hold NaN or Infinity
    (Python's JSON reader takes them), which a response cannot carry."""
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return default
    return value


def _echo(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request fields a `response` object repeats, each as the request gave it when it is
    of the field's type (the call was served, so the chat parser accepted the rest)."""
    def typed(key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        value = body.get(key, default)
        if isinstance(value, bool) and kind is not bool:  # True is an int, not a count or a number
            return default
        return _json_or(value, default) if isinstance(value, kind) else default

    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), Mapping) else None
    text = {"format": {"type": fmt["type"]}} if isinstance(fmt, Mapping) and fmt.get("type") in (
        "json_object", "json_schema") else {"format": {"type": "text"}}
    if isinstance(fmt, Mapping) and isinstance(fmt.get("name"), str):
        text["format"]["name"] = fmt["name"]
    metadata = body.get("metadata")
    return {"instructions": typed("instructions", str, None), "max_output_tokens": typed("max_output_tokens", int, None),
            "metadata": metadata if isinstance(metadata, Mapping) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()) else {},
            "parallel_tool_calls": typed("parallel_tool_calls", bool, True), "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None}, "store": False,
            "temperature": typed("temperature", (int, float), None), "text": text,
            "tool_choice": _json_or(body.get("tool_choice", "auto"), "auto"),
            "tools": _json_or(body.get("tools") or [], []), "top_p": typed("top_p", (int, float), None),
            "truncation": "disabled", "user": typed("user", str, None)}


def _usage(call: Call) -> dict[str, Any]:
    u = call.usage
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": u["prompt_tokens"], "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": u["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["total_tokens"]}


class ResponseShape:
    """One Responses call's ids and echoed request fields, shared by its object and events."""

    def __init__(self, body: Mapping[str, Any], call: Call, model: str) -> None:
        self.call = call
        self.id = call.rid
        self.item_id = f"{'fc' if call.tool_call is not None else 'msg'}_{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model
        self.echo = _echo(body)

    @property
    def incomplete(self) -> bool:
        return self.call.finish_reason == "length"

    def item(self, done: bool) -> dict[str, Any]:
        # an answer cut at max_output_tokens leaves its item "incomplete", as the response
        call = self.call
        status = ("incomplete" if self.incomplete else "completed") if done else "in_progress"
        if call.tool_call is not None:
            return {"type": "function_call", "id": self.item_id, "call_id": call.tool_call.id,
                    "name": call.tool_call.name, "arguments": call.text if done else "", "status": status}
        return {"type": "message", "id": self.item_id, "status": status, "role": "assistant",
                "content": [self.part(call.text)] if done else []}

    @staticmethod
    def part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def response(self, done: bool) -> dict[str, Any]:
        status = ("incomplete" if self.incomplete else "completed") if done else "in_progress"
        out = {"id": self.id, "object": "response", "created_at": self.created, "model": self.model,
               "status": status, "output": [self.item(True)] if done else [], "error": None,
               "incomplete_details": {"reason": "max_output_tokens"} if done and self.incomplete else None,
               **self.echo, "usage": _usage(self.call) if done else None}
        if done:
            out["topas"] = topas_info(self.call)
        return out


def response_object(body: Mapping[str, Any], call: Call, model: str) -> dict[str, Any]:
    return ResponseShape(body, call, model).response(done=True)


class ResponsesWriter:
    """The event stream of one streamed Responses call (the writer `_stream` drives)."""

    def __init__(self, body: Mapping[str, Any], call: Call, model: str) -> None:
        self.shape = ResponseShape(body, call, model)
        self.seq = 0

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

    def _where(self) -> dict[str, Any]:
        where: dict[str, Any] = {"item_id": self.shape.item_id, "output_index": 0}
        if self.shape.call.tool_call is None:
            where["content_index"] = 0
        return where

    def start(self) -> bytes:
        s = self.shape
        out = [self._event("response.created", response=s.response(False)),
               self._event("response.in_progress", response=s.response(False)),
               self._event("response.output_item.added", output_index=0, item=s.item(False))]
        if s.call.tool_call is None:
            out.append(self._event("response.content_part.added", **self._where(), part=s.part("")))
        return b"".join(out)

    def text(self, delta: str) -> bytes:
        if self.shape.call.tool_call is not None:
            return self._event("response.function_call_arguments.delta", **self._where(), delta=delta)
        return self._event("response.output_text.delta", **self._where(), delta=delta, logprobs=[])

    def end(self) -> bytes:
        s, text = self.shape, self.shape.call.text
        if s.call.tool_call is not None:
            out = [self._event("response.function_call_arguments.done", **self._where(), arguments=text,
                               name=s.call.tool_call.name)]
        else:
            out = [self._event("response.output_text.done", **self._where(), text=text, logprobs=[]),
                   self._event("response.content_part.done", **self._where(), part=s.part(text))]
        out.append(self._event("response.output_item.done", output_index=0, item=s.item(True)))
        final = "response.incomplete" if s.incomplete else "response.completed"
        out.append(self._event(final, response=s.response(True)))
        return b"".join(out)

    def failed(self, err: ApiError) -> bytes:
        e = err.body()["error"]
        return self._event("error", code=e["code"], message=e["message"], param=e["param"])
