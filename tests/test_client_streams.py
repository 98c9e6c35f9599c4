"""A labelled client's streams against a loopback SSE server: what the caller's own close() and a
cut after the final chunk do (neither may send the call again)."""

from __future__ import annotations

import asyncio
import json
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import openai
import pytest

from topas_agents.integrations.openai_client import labelled

MSG = [{"role": "user", "content": "hi"}]


def _chunk(delta: dict, finish: str | None = None) -> dict:
    return {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _frame(data: bytes) -> bytes:
    """One HTTP/1.1 chunk of a chunked body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _event(obj: dict) -> bytes:
    return _frame(f"data: {json.dumps(obj)}\n\n".encode())


@dataclass(frozen=True, slots=True)
class Answer:
    """How the server answers one request: these content pieces (a pause before each), then the
    finish chunk and `[DONE]`; `cut`: the connection is dropped "before_finish" (after the
    pieces) or "after_finish" (before `[DONE]`), without the body's end."""
    pieces: tuple[str, ...]
    pause_s: float = 0.0
    cut: Literal["no", "before_finish", "after_finish"] = "no"
    usage: bool = False  # a usage chunk after the finish (a cut "after_finish" comes before it)


@dataclass
class SseServer:
    plan: Callable[[int], Answer]  # the n-th request's answer (from 1)
    bodies: list[dict] = field(default_factory=list)

    def handle(self, conn: socket.socket) -> None:
        self.bodies.append(_read_body(conn))
        answer = self.plan(len(self.bodies))
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        try:
            conn.sendall(_event(_chunk({"role": "assistant", "content": ""})))
            for piece in answer.pieces:
                time.sleep(answer.pause_s)
                conn.sendall(_event(_chunk({"content": piece})))
            if answer.cut != "before_finish":
                conn.sendall(_event(_chunk({}, "stop")))
            if answer.cut != "no":
                time.sleep(0.05)  # what was sent is read before the cut
                conn.shutdown(socket.SHUT_RDWR)
                return
            if answer.usage:
                conn.sendall(_event({**_chunk({}), "choices": [],
                                     "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}))
            conn.sendall(_frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        except OSError:  # the client closed its end (the close test)
            pass


def _read_body(conn: socket.socket) -> dict:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, rest = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(rest) < length:
        rest += conn.recv(65536)
    return json.loads(rest)


@pytest.fixture()
def sse() -> Iterator[Callable[[Callable[[int], Answer]], tuple[str, SseServer]]]:
    servers: list[socketserver.ThreadingTCPServer] = []

    def start(plan: Callable[[int], Answer]) -> tuple[str, SseServer]:
        state = SseServer(plan)

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                state.handle(self.request)

        srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/v1", state

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


LONG = Answer(tuple(f"w{i} " for i in range(40)), pause_s=0.01)  # still streaming when the caller closes
CLOSE_AT = 3  # the caller closes the stream after this many chunks


def test_a_stream_the_caller_closes_ends_and_is_not_sent_again(sse):
    # before: the closed stream's ReadError counted as a network break: the wrapper sent the
    # whole call again and kept yielding its text after the caller's close()
    url, state = sse(lambda n: LONG)
    client = labelled(openai.OpenAI(base_url=url, api_key="x", max_retries=0))
    stream = client.chat.completions.create(model="m", messages=MSG, stream=True)
    seen = 0
    for _ in stream:
        seen += 1
        if seen == CLOSE_AT:
            stream.close()
    assert seen == CLOSE_AT and len(state.bodies) == 1
    assert list(stream) == []  # iterating a closed stream again yields nothing, sends nothing
    assert len(state.bodies) == 1


def test_an_async_stream_the_caller_closes_ends_and_is_not_sent_again(sse):
    url, state = sse(lambda n: LONG)

    async def run() -> int:
        client = labelled(openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0))
        stream = await client.chat.completions.create(model="m", messages=MSG, stream=True)
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == CLOSE_AT:
                await stream.close()
        return seen

    assert asyncio.run(run()) == CLOSE_AT and len(state.bodies) == 1


WHOLE = Answer(("Hel", "lo"))
CUT_AFTER_FINISH = Answer(WHOLE.pieces, cut="after_finish")
CUT_BEFORE_FINISH = Answer(WHOLE.pieces[:1], cut="before_finish")


def _finishes(chunks: list) -> list[str]:
    return [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]


@pytest.mark.parametrize(("first", "requests"), [(CUT_AFTER_FINISH, 1), (CUT_BEFORE_FINISH, 2)],
                         ids=["cut after finish: not sent again", "cut before finish: resumed"])
def test_a_cut_stream_is_resumed_only_before_its_finish_chunk(sse, first, requests):
    # before: a cut after finish_reason but before [DONE] re-issued the call (twice the cost)
    # and handed the caller the finish chunk twice; a cut before it must still be resumed
    url, state = sse(lambda n: first if n == 1 else WHOLE)
    client = labelled(openai.OpenAI(base_url=url, api_key="x", max_retries=0))
    chunks = list(client.chat.completions.create(model="m", messages=MSG, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "".join(WHOLE.pieces)
    assert _finishes(chunks) == ["stop"] and len(state.bodies) == requests


def test_an_async_cut_after_the_finish_chunk_is_not_sent_again(sse):
    url, state = sse(lambda n: CUT_AFTER_FINISH if n == 1 else WHOLE)

    async def run() -> list:
        client = labelled(openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0))
        return [c async for c in await client.chat.completions.create(model="m", messages=MSG, stream=True)]

    chunks = asyncio.run(run())
    assert _finishes(chunks) == ["stop"] and len(state.bodies) == 1


def test_a_cut_between_the_finish_and_the_asked_for_usage_chunk_is_resumed(sse):
    """With stream_options.include_usage the usage chunk comes after the finish: a break between
    them lost it, silently. The call is re-issued and the caller gets the usage, and the
    finish chunk once."""
    url, state = sse(lambda n: Answer(WHOLE.pieces, cut="after_finish", usage=True) if n == 1
                     else Answer(WHOLE.pieces, usage=True))
    client = labelled(openai.OpenAI(base_url=url, api_key="x", max_retries=0))
    chunks = list(client.chat.completions.create(model="m", messages=MSG, stream=True,
                                                 stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "".join(WHOLE.pieces)
    assert _finishes(chunks) == ["stop"] and len(state.bodies) == 2
    assert [c.usage.total_tokens for c in chunks if c.usage is not None] == [3]


def test_a_stream_of_several_choices_is_complete_only_when_each_has_finished():
    """With n > 1 one choice's finish_reason is not the others': a break after choice 0 finished
    and before choice 1 did would have ended the stream quietly with choice 1 cut short."""
    from openai.types.chat import ChatCompletionChunk

    from topas_agents.cluster.stream_retry import chunk_progress

    def chunk(*choices: dict) -> ChatCompletionChunk:
        return ChatCompletionChunk.model_validate({**_chunk({}), "choices": list(choices)})

    progress = chunk_progress({"n": 2})()
    progress.admit(chunk({"index": 0, "delta": {"content": "a"}, "finish_reason": None},
                         {"index": 1, "delta": {"content": "b"}, "finish_reason": None}))
    progress.admit(chunk({"index": 0, "delta": {}, "finish_reason": "stop"}))
    assert progress.finished and not progress.complete
    progress.admit(chunk({"index": 1, "delta": {}, "finish_reason": "stop"}))
    assert progress.complete
