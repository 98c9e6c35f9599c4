"""OpenAI response objects and SSE framing for chat completions and completions."""

from __future__ import annotations

import json
import time
from typing import Any

from .calls import Call

DONE = b"data: [DONE]\n\n"


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
    if kind == "chat":
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

    def _chunk(self, text: str | None, finish: str | None, first: bool = False) -> bytes:
        out = _head(self.kind, self.call.rid, self.created, self.model, True)
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta}
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
