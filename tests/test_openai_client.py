"""The openai client wrapper against a real loopback HTTP server that records requests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from topas_agents import label
from topas_agents.integrations.openai_client import RetryConfig, labelled, with_label

FAST_RETRY = RetryConfig(attempts=3, wait_min_s=0.01, wait_max_s=0.02)


class Recorder:
    def __init__(self) -> None:
        self.requests: list[tuple[dict, dict]] = []  # (headers, body)
        self.paths: list[str] = []  # of the requests, in the same order
        # (content type, body) of the 200 answer to the n-th request (from 1): a completion unless set
        self.reply: Callable[[dict, int], tuple[str, bytes]] | None = None
        self.statuses: list[int] = []  # statuses to answer next (then 200)
        self.lock = threading.Lock()


def _completion(body: dict) -> dict:
    text = "ok"
    return {
        "id": "cmpl-1", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _handler(rec: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.loads(raw) if raw else {}  # the task-done call has no body
            with rec.lock:
                rec.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                rec.paths.append(self.path)
                status = rec.statuses.pop(0) if rec.statuses else 200
            payload = _completion(body) if status == 200 else {"error": {"message": f"status {status}"}}
            kind, data = "application/json", json.dumps(payload).encode()
            if status == 200 and rec.reply is not None:
                kind, data = rec.reply(body, len(rec.requests))
            self.send_response(status)
            if status == 429:
                self.send_header("Retry-After", "0.3")
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@pytest.fixture()
def server() -> Iterator[tuple[str, Recorder]]:
    rec = Recorder()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(rec))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", rec
    finally:
        httpd.shutdown()
        httpd.server_close()


MSG = [{"role": "user", "content": "hi"}]


def test_label_goes_in_body_and_headers_without_mutating_caller_dicts(server):
    url, rec = server
    client = labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY)
    extra_body = {"keep": 1}
    extra_headers = {"X-Custom": "y"}
    with label(task_id="t1", stage="plan", agent="planner", workflow="chain3"):
        client.chat.completions.create(model="m", messages=MSG, extra_body=extra_body,
                                       extra_headers=extra_headers)
    assert extra_body == {"keep": 1} and extra_headers == {"X-Custom": "y"}
    headers, body = rec.requests[-1]
    assert body["topas"] == {"task_id": "t1", "stage": "plan", "agent": "planner", "workflow": "chain3"}
    assert body["keep"] == 1
    assert headers["x-topas-task-id"] == "t1" and headers["x-topas-agent"] == "planner"
    assert headers["x-custom"] == "y"


def test_a_non_ascii_label_travels_in_the_body(server):
    # before: httpx encodes the headers the openai client builds as ASCII, so every call of a
    # task named "café" raised UnicodeEncodeError
    url, rec = server
    client = labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY)
    with label(task_id="café-1", stage="设计", agent="architect"):
        client.chat.completions.create(model="m", messages=MSG)
    headers, body = rec.requests[-1]
    assert body["topas"] == {"task_id": "café-1", "stage": "设计", "agent": "architect"}
    assert "x-topas-task-id" not in headers  # body only: every Topas server reads it first


def test_unlabelled_call_carries_no_label(server):
    url, rec = server
    client = labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY)
    client.completions.create(model="m", prompt="hello")
    headers, body = rec.requests[-1]
    assert "topas" not in body and "x-topas-task-id" not in headers


def test_nested_label_inherits_and_overrides():
    with label(task_id="t9", agent="a", stage="s1"), label(stage="s2") as inner:
        assert (inner.task_id, inner.stage, inner.agent) == ("t9", "s2", "a")
        assert with_label({}, inner)["extra_body"]["topas"]["stage"] == "s2"


def test_explicit_per_call_label_wins():
    with label(task_id="t", stage="s", agent="a") as current:
        out = with_label({"extra_body": {"topas": {"task_id": "mine", "stage": "x", "agent": "y"}}}, current)
    assert out["extra_body"]["topas"]["task_id"] == "mine"


def test_explicit_per_call_header_label_wins_whole():
    # before: the context label went into the body (which servers read first), so an explicit
    # header label lost; and a lower-case header name got a second, context value merged in
    explicit = {"x-topas-task-id": "mine", "x-topas-stage": "x", "x-topas-agent": "y"}
    with label(task_id="t", stage="s", agent="a") as current:
        out = with_label({"extra_headers": explicit}, current)
    assert out["extra_headers"] == explicit and "extra_body" not in out


def test_explicit_header_label_reaches_the_server(server):
    url, rec = server
    client = labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY)
    with label(task_id="ctx", stage="s", agent="a"):
        client.completions.create(model="m", prompt="hi", extra_headers={"X-Topas-Task-Id": "mine"})
    headers, body = rec.requests[-1]
    assert "topas" not in body and headers["x-topas-task-id"] == "mine" and "x-topas-stage" not in headers


def test_with_options_and_response_variants_stay_labelled(server):
    # before: with_options() returned the plain client and with_raw_response /
    # with_streaming_response reached the unwrapped endpoint: all three went out unlabelled
    url, rec = server
    client = labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY)
    with label(task_id="t-var", stage="s", agent="a"):
        client.with_options(timeout=5).chat.completions.create(model="m", messages=MSG)
        raw = client.chat.completions.with_raw_response.create(model="m", messages=MSG)
        with client.chat.completions.with_streaming_response.create(model="m", messages=MSG) as rsp:
            rsp.read()
        client.completions.with_raw_response.create(model="m", prompt="hi")
    assert raw.parse().choices[0].message.content == "ok"
    assert [(h["x-topas-task-id"], b["topas"]["task_id"]) for h, b in rec.requests] == [("t-var", "t-var")] * 4


def test_client_level_response_variants_and_beta_stay_labelled(server):
    """`client.with_raw_response.chat.completions...`, `client.with_streaming_response...` and
    `client.beta.chat.completions.parse` (where openai 1.40-1.91 keeps parse) were forwarded to
    the raw client: unlabelled. Other resources through them are the raw client's."""
    url, rec = server
    client = labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY)
    with label(task_id="t-cvar", stage="s", agent="a"):
        raw = client.with_raw_response.chat.completions.create(model="m", messages=MSG)
        with client.with_streaming_response.chat.completions.create(model="m", messages=MSG) as rsp:
            rsp.read()
        client.with_raw_response.completions.create(model="m", prompt="hi")
        beta_chat = getattr(client.beta, "chat", None)
        if beta_chat is not None and hasattr(beta_chat.completions, "parse"):
            beta_chat.completions.parse(model="m", messages=MSG)
    assert raw.parse().choices[0].message.content == "ok"
    assert {(h["x-topas-task-id"], b["topas"]["task_id"]) for h, b in rec.requests} == {("t-cvar", "t-cvar")}
    assert len(rec.requests) == 3 + int(beta_chat is not None and hasattr(beta_chat.completions, "parse"))
    assert client.with_raw_response.models is not None  # the rest is forwarded


async def test_async_labels_are_isolated_between_tasks(server):
    url, rec = server
    client = labelled(openai.AsyncOpenAI(base_url=url, api_key="x"), FAST_RETRY)

    async def one(i: int) -> None:
        with label(task_id=f"task-{i}", stage=f"stage-{i}", agent=f"agent-{i % 3}"):
            await asyncio.sleep(0.001 * (5 - i))
            await client.chat.completions.create(model="m", messages=MSG)

    await asyncio.gather(*(one(i) for i in range(5)))
    seen = {body["topas"]["task_id"]: body["topas"] for _, body in rec.requests}
    assert set(seen) == {f"task-{i}" for i in range(5)}
    for i in range(5):
        assert seen[f"task-{i}"]["stage"] == f"stage-{i}"
        assert seen[f"task-{i}"]["agent"] == f"agent-{i % 3}"


def test_rejects_non_openai_client():
    with pytest.raises(TypeError):
        labelled(object())


def test_client_import_path_is_light():
    """Labelling calls needs only the base install: no server, plotting, numpy or MetaGPT."""
    code = ("import sys, json; import topas_agents;"
            "from topas_agents.integrations.openai_client import labelled;"
            "from topas_agents.integrations.httpx_labels import labelled_http_client;"
            "from topas_agents.integrations.task import task;"
            "from topas_agents import label, labelled, task, labelled_http_client, StreamCutError, LabelError;"
            "heavy = ('fastapi', 'uvicorn', 'starlette', 'matplotlib', 'numpy', 'metagpt', 'tqdm');"
            "print(json.dumps([m for m in heavy if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


# openai >= 2 takes api_key=callable (a key provider: sync for OpenAI, async for AsyncOpenAI);
# the client holds no key until a call refreshes it
_PROVIDERS = hasattr(openai.OpenAI, "_refresh_api_key")


def _done_auth(rec: Recorder, task_id: str) -> str | None:
    done = f"/v1/topas/tasks/{task_id}/done"
    hits = [h.get("authorization") for (h, _), path in zip(rec.requests, rec.paths, strict=True) if path == done]
    assert len(hits) == 1, f"one done call for {task_id}, got {len(hits)}"
    return hits[0]


@pytest.mark.skipif(not _PROVIDERS, reason="this openai takes no key provider (api_key=callable)")
def test_task_done_call_sends_a_key_providers_key(server):
    from topas_agents.integrations.task import task

    url, rec = server
    keys = iter(["k1", "k2", "k3"])
    client = labelled(openai.OpenAI(base_url=url, api_key=lambda: next(keys)), FAST_RETRY)
    with task("provided", client=client), label(stage="s", agent="a"):
        client.chat.completions.create(model="m", messages=MSG)
        client.chat.completions.create(model="m", messages=MSG)
    # before: the key was read when the scope was built (empty then), and the done call went
    # without one (a keyed server answered 401 and the task stayed open)
    assert _done_auth(rec, "provided") == "Bearer k2"  # the key the last call used


@pytest.mark.skipif(not _PROVIDERS, reason="this openai takes no key provider (api_key=callable)")
async def test_async_task_done_call_sends_an_async_key_providers_key(server):
    from topas_agents.integrations.task import task

    url, rec = server

    async def provide() -> str:
        return "ak"

    client = labelled(openai.AsyncOpenAI(base_url=url, api_key=provide), FAST_RETRY)
    async with task("provided-async", client=client):
        with label(stage="s", agent="a"):
            await client.chat.completions.create(model="m", messages=MSG)
    assert _done_auth(rec, "provided-async") == "Bearer ak"


_HAS_RESPONSES = hasattr(openai.OpenAI(api_key="x"), "responses")  # openai >= 1.66
_HAS_PARSE = hasattr(openai.OpenAI(api_key="x").chat.completions, "parse")  # openai >= 1.40


@pytest.mark.skipif(not _HAS_RESPONSES, reason="this openai has no Responses API")
def test_responses_api_calls_are_labelled(server):
    # before: labelled(client).responses went to the raw client, unlabelled (SGLang's
    # Responses API now takes the label: tests/test_sglang_launch.py)
    url, rec = server
    client = labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY)
    with label(task_id="resp-t", stage="plan", agent="planner"):
        client.responses.create(model="m", input="hi")
    headers, body = rec.requests[-1]
    assert rec.paths[-1] == "/v1/responses"
    assert body["topas"] == {"task_id": "resp-t", "stage": "plan", "agent": "planner"}
    assert headers["x-topas-task-id"] == "resp-t"


@pytest.mark.skipif(not _HAS_PARSE, reason="this openai has no chat.completions.parse")
def test_parse_and_stream_helpers_are_labelled(server):
    # before: chat.completions.parse / .stream were forwarded bare: their calls went unlabelled
    url, rec = server
    client = labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY)
    with label(task_id="parse-t", stage="plan", agent="planner"):
        client.chat.completions.parse(model="m", messages=MSG)
        # the recorder answers JSON, not an event stream: only the request matters here
        with contextlib.suppress(Exception), client.chat.completions.stream(model="m", messages=MSG) as stream:
            for _ in stream:
                pass
    assert [body["topas"]["task_id"] for _, body in rec.requests] == ["parse-t", "parse-t"]
    assert rec.requests[1][1]["stream"] is True


@pytest.mark.skipif(not _HAS_PARSE, reason="this openai has no chat.completions.parse")
async def test_async_parse_is_labelled_and_retried(server):
    url, rec = server
    rec.statuses = [503]  # retried once, with the same label
    client = labelled(openai.AsyncOpenAI(base_url=url, api_key="x"), FAST_RETRY)
    with label(task_id="aparse-t", stage="plan", agent="planner"):
        out = await client.chat.completions.parse(model="m", messages=MSG)
    assert out.choices[0].message.content == "ok"
    assert [body["topas"]["task_id"] for _, body in rec.requests] == ["aparse-t", "aparse-t"]


def _responses_sse(text: str, cut: bool) -> bytes:
    """A Responses API event stream for `text` in two-character deltas (cut: the connection
    ends after the first delta, without the final event, as a replica dying behind smg does)."""
    item = {"type": "message", "id": "msg_1", "status": "in_progress", "role": "assistant", "content": []}
    resp = {"id": "resp_1", "object": "response", "created_at": 0, "model": "m", "status": "in_progress",
            "output": [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    events = [("response.created", {"response": resp}), ("response.in_progress", {"response": resp}),
              ("response.output_item.added", {"output_index": 0, "item": item}),
              ("response.content_part.added", {**where, "part": part})]
    events += [("response.output_text.delta", {**where, "delta": text[i:i + 2], "logprobs": []})
               for i in range(0, len(text), 2)]
    if cut:
        events = events[:5]
    else:
        done_item = {**item, "status": "completed", "content": [{**part, "text": text}]}
        events += [("response.output_item.done", {"output_index": 0, "item": done_item}),
                   ("response.completed", {"response": {**resp, "status": "completed", "output": [done_item]}})]
    return b"".join(f"event: {k}\ndata: {json.dumps({'type': k, 'sequence_number': n, **e})}\n\n".encode()
                    for n, (k, e) in enumerate(events))


@pytest.mark.skipif(not _HAS_RESPONSES, reason="this openai has no Responses API")
def test_a_cut_responses_stream_is_reissued_once_and_resumed(server):
    url, rec = server
    rec.reply = lambda body, n: ("text/event-stream", _responses_sse("hello world", cut=n == 1))
    client = labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY)
    with label(task_id="cut-r", stage="s", agent="a"):
        stream = client.responses.create(model="m", input="hi", stream=True)
        events = list(stream)
    # before: a cut Responses stream ended quietly, handing the caller partial text
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "hello world"
    assert [e.type for e in events].count("response.created") == 1 and events[-1].type == "response.completed"
    assert stream.resumed == 1 and [b["topas"]["task_id"] for _, b in rec.requests] == ["cut-r", "cut-r"]


def test_chats_own_response_variants_are_there_and_labelled(server):
    # before: labelled(c).chat.with_raw_response / .with_streaming_response raised AttributeError
    url, rec = server
    client = labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY)
    with label(task_id="t-chat-var", stage="s", agent="a"):
        raw = client.chat.with_raw_response.completions.create(model="m", messages=MSG)
        with client.chat.with_streaming_response.completions.create(model="m", messages=MSG) as rsp:
            rsp.read()
    assert raw.parse().choices[0].message.content == "ok"
    assert [(h["x-topas-task-id"], b["topas"]["task_id"]) for h, b in rec.requests] == [("t-chat-var",) * 2] * 2


def test_a_label_in_the_clients_default_headers_wins_on_both_paths(server):
    # before: labelled() added the label in force to the body (which servers read first) over the
    # client's X-Topas-* default headers, while the httpx transport kept the headers' label
    from topas_agents.integrations.httpx_labels import labelled_http_client

    url, rec = server
    own = {"X-Topas-Task-Id": "hdr", "X-Topas-Stage": "hs", "X-Topas-Agent": "ha"}
    clients = [labelled(openai.OpenAI(base_url=url, api_key="x", default_headers=own), FAST_RETRY),
               openai.OpenAI(base_url=url, api_key="x", default_headers=own, http_client=labelled_http_client())]
    with label(task_id="ctx", stage="cs", agent="ca"):
        for client in clients:
            client.chat.completions.create(model="m", messages=MSG)
    assert [("topas" in b, h["x-topas-task-id"], h["x-topas-stage"]) for h, b in rec.requests] == \
        [(False, "hdr", "hs")] * len(clients)


def test_labelled_twice_is_the_same_wrapper():
    # before: labelled(labelled(c)) raised TypeError
    once = labelled(openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="x"))
    assert labelled(once) is once
    again = labelled(once, FAST_RETRY)
    assert again.raw is once.raw and again.max_retries == FAST_RETRY.attempts - 1
