"""Bad input to the HTTP server gets a clear 4xx (never a 500, a false
success, or a held event loop): linear `[CONTENT]` matching, bounded schema literals, huge
schema bounds, honest cut tool calls, uploads held to the KV budget and to a few worker
threads, strict UTF-8 uploads, the right `param` for over-budget calls, tenant names."""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml

import topas_agents.server.app as app_module
from topas_agents.bench.work import check_fits
from topas_agents.errors import ConfigError
from topas_agents.server import ServerConfig, schema_fill, start_server_in_thread
from topas_agents.server.api_errors import ApiError
from topas_agents.server.protocol import Message
from topas_agents.server.responders import ResponseContext, content_block_rule
from topas_agents.server.schema_fill import MAX_LITERAL_CHARS, tool_arguments
from topas_agents.server.tenancy import tenant_names
from topas_agents.workflow import parse_workflow

KV_BUDGET = 4000  # small, so a prompt, a label's prefix or max_tokens can each exceed it alone
CUT_CHARS = 64  # the chat server's max_response_chars: a 200-char tool argument is cut


@pytest.fixture(scope="module")
def chat():
    handle = start_server_in_thread(ServerConfig(time_scale=1000.0, kv_budget=KV_BUDGET,
                                                 max_response_chars=CUT_CHARS))
    with httpx.Client(base_url=handle.base_url, timeout=30) as client:
        yield client
    handle.stop()


@pytest.fixture(scope="module")
def uploads():
    # offload_bytes=1024: every upload and chat body below is parsed in a worker thread
    handle = start_server_in_thread(ServerConfig(time_scale=1000.0, kv_budget=KV_BUDGET, offload_bytes=1024))
    with httpx.Client(base_url=handle.base_url, timeout=30) as client:
        yield client
    handle.stop()


def _error(rsp: httpx.Response, status: int) -> dict:
    assert rsp.status_code == status, rsp.text[:300]
    return rsp.json()["error"]


def _ctx(text: str) -> ResponseContext:
    return ResponseContext("chat", (Message("user", text),), text, "t", "s", "a", 0, False, None)


# ---------------------------------------------------------------- 1: [CONTENT] matching

# The rule's former regexes: the reference for what it answers on ordinary prompts.
_OLD_FORMAT_EXAMPLE = re.compile(r"##\s*format example\s*\n\s*\[CONTENT\](.*?)\[/CONTENT\]", re.S | re.I)
_OLD_ANY_BLOCK = re.compile(r"\[CONTENT\](.*?)\[/CONTENT\]", re.S)


def _old_rule(text: str) -> str | None:
    found = _OLD_FORMAT_EXAMPLE.findall(text) or _OLD_ANY_BLOCK.findall(text)
    return f"[CONTENT]\n{found[-1].strip()}\n[/CONTENT]" if found else None


@pytest.mark.parametrize("text", [
    "## format example\n[CONTENT]\n{\"a\": 1}\n[/CONTENT]\nFormat: output wrapped inside [CONTENT][/CONTENT]",
    "intro [CONTENT] a [CONTENT] b [/CONTENT] tail [CONTENT] c [/CONTENT] [CONTENT] open",
    "## Format Example  \n\n  [content]x[/Content] then ## format example [CONTENT]no newline[/CONTENT]",
    "## format example\n[CONTENT]first[/CONTENT]\n## format example\n[CONTENT]second[/CONTENT]",
    "## format example\n[CONTENT] never closed ## format example\n[CONTENT] x",
    "[CONTENT][/CONTENT]", "[/CONTENT][CONTENT]", "no blocks at all",
])
def test_content_blocks_are_found_as_before(text):
    assert content_block_rule(_ctx(text)) == _old_rule(text)


@pytest.mark.parametrize("text", [
    "[CONTENT]" * 2000 + " " * 1_000_000 + "x",  # the old regex took ~38 s on this
    "## format example\n[CONTENT]" * 2000 + " " * 1_000_000,
    "## format example" + " \n" * 500_000 + "x",
])
def test_unclosed_content_blocks_are_linear(text):
    start = time.perf_counter()
    assert content_block_rule(_ctx(text)) is None
    assert time.perf_counter() - start < 5.0  # generous: linear is milliseconds, quadratic minutes


# ---------------------------------------------------------------- 2, 3: schema literals and bounds

def _one_property(prop: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "required": required or ["a"], "properties": {"a": prop}}


def test_a_huge_default_is_replaced_and_never_serialized(monkeypatch):
    serialized: list[int] = []
    real_dumps = json.dumps

    def counting_dumps(value, *args, **kwargs):
        text = real_dumps(value, *args, **kwargs)
        serialized.append(len(text))
        return text

    monkeypatch.setattr(schema_fill.json, "dumps", counting_dumps)
    schema = _one_property({"type": "string", "default": " " * 8_000_000 + "x"}, ["a"] * 2000)
    assert json.loads(tool_arguments(schema)) == {"a": "example"}
    assert sum(serialized) < 10_000  # before: 2000 serializations of the 8 MB default


def test_small_literals_are_kept_and_big_ones_fall_back():
    assert json.loads(tool_arguments(_one_property({"type": "string", "default": "kept"}))) == {"a": "kept"}
    big = "x" * (MAX_LITERAL_CHARS + 1)
    assert json.loads(tool_arguments(_one_property({"type": "string", "const": big, "enum": ["e"]}))) == {"a": "e"}
    assert json.loads(tool_arguments(_one_property({"default": list(range(10**6))}))) == {"a": None}


def test_a_required_name_listed_many_times_is_filled_once():
    args = json.loads(tool_arguments(_one_property({"type": "integer", "minimum": 3}, ["a"] * 5000 + ["b"])))
    assert args == {"a": 3, "b": None}


@pytest.mark.parametrize("key", ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems",
                                 "minLength", "maxLength"])
def test_bounds_beyond_float_range_are_ignored_not_a_500(chat, key):
    for kind in ("integer", "string", "array"):
        schema = _one_property({"type": kind, key: 10**400})
        assert isinstance(json.loads(tool_arguments(schema)), dict)
    body = {"messages": [{"role": "user", "content": "call f"}], "max_tokens": 50,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}
    rsp = chat.post("/v1/chat/completions", json=body)
    assert rsp.status_code == 200, rsp.text[:300]


# ---------------------------------------------------------------- 4: a cut tool call says so

def _tool_call(chat: httpx.Client, default: str) -> tuple[str, str]:
    body = {"messages": [{"role": "user", "content": "call f"}],
            "tools": [{"type": "function", "function": {
                "name": "f", "parameters": _one_property({"type": "string", "default": default})}}]}
    rsp = chat.post("/v1/chat/completions", json=body)
    assert rsp.status_code == 200, rsp.text[:300]
    choice = rsp.json()["choices"][0]
    return choice["finish_reason"], choice["message"]["tool_calls"][0]["function"]["arguments"]


def test_tool_arguments_cut_at_max_response_chars_finish_with_length(chat):
    reason, arguments = _tool_call(chat, "y" * 200)
    assert len(arguments) == CUT_CHARS
    assert reason == "length"  # not "tool_calls" with arguments that are not JSON
    reason, arguments = _tool_call(chat, "short")
    assert reason == "tool_calls" and json.loads(arguments) == {"a": "short"}


# ---------------------------------------------------------------- 5: uploads fit the KV budget

TOO_BIG = ("name: toobig\nagents: [{name: z, prefix_tokens: 1000}]\n"
           "stages: [{name: s1, agent: z, input_tokens: 1000, output_tokens: 100000}]\n")


def test_an_upload_that_can_never_fit_is_a_400_with_the_startup_message(uploads):
    with pytest.raises(ConfigError) as startup:
        check_fits(parse_workflow(yaml.safe_load(TOO_BIG)), KV_BUDGET)
    err = _error(uploads.post("/v1/topas/workflows", content=TOO_BIG), 400)
    assert err["message"] == str(startup.value)
    assert "toobig" not in uploads.get("/v1/topas/workflows").json()["workflows"]
    fits = TOO_BIG.replace("toobig", "fits").replace("100000", "100")
    assert uploads.post("/v1/topas/workflows", content=fits).status_code == 201


# ---------------------------------------------------------------- 6: uploads cannot take every thread

def test_slow_uploads_leave_worker_threads_for_chat_parsing(uploads, monkeypatch):
    release, lock = threading.Event(), threading.Lock()
    inside, most = [0], [0]

    def slow_parse(text: str):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            release.wait(60)
            raise ApiError(400, "refused by the test")
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(app_module, "parse_upload", slow_parse)
    body = "name: slow\n" + "# padding\n" * 200  # above offload_bytes: parsed in a thread
    n_uploads = 40  # more than asyncio's default pool can ever have (32)
    with ThreadPoolExecutor(n_uploads) as pool:
        pending = [pool.submit(uploads.post, "/v1/topas/workflows", content=body) for _ in range(n_uploads)]
        try:
            deadline = time.monotonic() + 30
            while inside[0] < app_module.MAX_CONCURRENT_UPLOAD_PARSES:
                assert time.monotonic() < deadline, "uploads never reached the parser"
                time.sleep(0.01)
            big_chat = {"messages": [{"role": "user", "content": "hi " * 1000}], "max_tokens": 3}
            assert uploads.post("/v1/chat/completions", json=big_chat).status_code == 200
        finally:
            release.set()
        assert [f.result().status_code for f in pending] == [400] * n_uploads
    assert most[0] <= app_module.MAX_CONCURRENT_UPLOAD_PARSES


# ---------------------------------------------------------------- 7: UTF-8, params, tenants

def test_a_non_utf8_upload_is_a_400_and_registers_nothing(uploads):
    err = _error(uploads.post("/v1/topas/workflows", content=b"name: caf\xe9\nagents: []\n"), 400)
    assert "UTF-8" in err["message"]
    good = ("name: caf\xe9\nagents: [{name: a, prefix_tokens: 1}]\n"
            "stages: [{name: s, agent: a, input_tokens: 1, output_tokens: 1}]\n")
    assert "UTF-8" in _error(uploads.post("/v1/topas/workflows", content=good.encode("latin-1")), 400)["message"]
    assert not any(name.startswith("caf") for name in uploads.get("/v1/topas/workflows").json()["workflows"])


@pytest.mark.parametrize(("extra", "param"), [
    ({"messages": [{"role": "user", "content": "word " * (KV_BUDGET + 100)}], "max_tokens": 5}, "messages"),
    ({"topas": {"task_id": "t-big", "stage": "s", "agent": "a", "prefix_tokens": KV_BUDGET + 1}}, "topas.prefix_tokens"),
    ({"max_tokens": KV_BUDGET + 1}, "max_tokens"),
])
def test_an_over_budget_call_names_the_field_that_is_too_big(chat, extra, param):
    body = {"messages": [{"role": "user", "content": "hello"}], **extra}
    err = _error(chat.post("/v1/chat/completions", json=body), 400)
    assert "KV budget" in err["message"] and err["param"] == param
    # what frameworks recognise a context overflow by (they trim and retry on it)
    assert err["code"] == "context_length_exceeded" and "maximum context length" in err["message"]


def test_tenant_names_unqualifies_only_the_start_of_quoted_names():
    with pytest.raises(ApiError) as exc, tenant_names("key1"):
        raise ApiError(400, "task 'key1/a/key1/b' uses workflow 'key1/wf', got None")
    assert exc.value.message == "task 'a/key1/b' uses workflow 'wf', got None"
