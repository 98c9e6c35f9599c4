"""Fuzzing the HTTP API (issue 11): bodies, labels, headers, query strings and workflow
uploads. For every input: no 500, an OpenAI-shaped error for every 4xx, an answer within
the client timeout (a stall fails the test), and afterwards the server is intact: /health
and /v1/topas/stats are 200 and a good call still succeeds. Against a real uvicorn, one
keep-alive connection, so a reset connection would fail too."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topas_agents.labels import HEADERS
from topas_agents.server import ServerConfig, start_server_in_thread

TIMEOUT_S = 20.0  # the stall bound: a request that takes longer fails the test
FUZZ = settings(max_examples=100, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
MSG = [{"role": "user", "content": "hello"}]

# text with the troublemakers: lone surrogates, NULs, huge lengths are bounded by max_size
TEXT = st.text(alphabet=st.characters(codec=None), max_size=40) | st.sampled_from(
    ["\ud800", "a\udfffb", "", " ", "s1", "a", "chain3", "t", "\x00", "9" * 5000])
INTS = st.integers() | st.sampled_from([0, 1, -1, 2**31, 2**63, 10**4200])  # > 4300 digits: raw bodies
SCALARS = st.none() | st.booleans() | INTS | st.floats(allow_nan=True, allow_infinity=True) | TEXT
JSON = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(TEXT, kids, max_size=4),
                    max_leaves=12)
LABEL = st.fixed_dictionaries({}, optional={k: SCALARS for k in [*HEADERS, "extra"]})
MESSAGES = st.lists(st.fixed_dictionaries({}, optional={"role": st.sampled_from(["user", "system", "bad"]) | JSON,
                                                       "content": JSON}), max_size=3) | JSON
CHAT = st.fixed_dictionaries({}, optional={"messages": MESSAGES, "model": SCALARS, "max_tokens": SCALARS,
                                           "max_completion_tokens": SCALARS, "n": SCALARS, "stream": SCALARS,
                                           "stream_options": JSON, "topas": LABEL | JSON, "prompt": JSON})
PARTS = st.lists(st.fixed_dictionaries({}, optional={"type": st.sampled_from(["input_text", "output_text", "input_image"])
                                                    | JSON, "text": TEXT | JSON}), max_size=2)
ITEMS = st.lists(st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "bad"]) | JSON,
    "role": st.sampled_from(["user", "system", "assistant", "developer", "tool"]) | JSON, "content": TEXT | PARTS | JSON,
    "call_id": TEXT | JSON, "name": TEXT | JSON, "arguments": TEXT | JSON, "output": TEXT | PARTS | JSON}), max_size=4)
TOOL = st.fixed_dictionaries({}, optional={"type": st.sampled_from(["function", "web_search"]) | JSON,
                                           "name": TEXT | JSON, "parameters": JSON, "strict": SCALARS})
RESPONSES = st.fixed_dictionaries({}, optional={
    "input": TEXT | ITEMS | JSON, "instructions": TEXT | JSON, "model": SCALARS, "max_output_tokens": SCALARS,
    "stream": SCALARS, "tools": st.lists(TOOL, max_size=2) | JSON, "tool_choice": JSON,
    "text": st.fixed_dictionaries({"format": st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["text", "json_object", "json_schema"]) | JSON, "name": TEXT | JSON, "schema": JSON})})
    | JSON, "previous_response_id": SCALARS, "metadata": JSON, "user": SCALARS, "parallel_tool_calls": SCALARS,
    "temperature": SCALARS, "topas": LABEL | JSON})
PLAIN = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20)
FUNCTION = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}
# well-formed calls with fuzzed optional parts: the answers themselves (text, tool calls, JSON,
# streams, echoed fields) are exercised, not only the refusals
GOOD_RESPONSES = st.fixed_dictionaries(
    {"input": st.sampled_from(["hi", [{"role": "user", "content": [{"type": "input_text", "text": "hi f"}]}],
                               [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                                {"type": "function_call_output", "call_id": "c", "output": "ok"}]]) | PLAIN,
     "max_output_tokens": st.integers(1, 40)},
    optional={"stream": st.booleans(), "tools": st.just([FUNCTION]),
              "tool_choice": st.sampled_from(["auto", "none", "required", {"type": "function", "name": "f"}]),
              "text": st.sampled_from([{"format": {"type": "json_object"}}, {"format": {"type": "text"}},
                                       {"format": {"type": "json_schema", "name": "s", "schema": FUNCTION["parameters"]}}]),
              "instructions": PLAIN, "metadata": JSON, "user": SCALARS, "parallel_tool_calls": SCALARS,
              "temperature": st.floats(0, 2), "topas": st.just({"task_id": "fz", "stage": "s1", "agent": "a"})})
# header values as a client can send them (h11 refuses surrounding whitespace)
HEADER_TEXT = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30).map(str.strip) | (
    st.sampled_from(["9" * 5000, "", "12", "-1", "Bearer x", "\u00e9"]))
HEADER_SET = st.dictionaries(st.sampled_from([*HEADERS.values(), "Authorization", "Content-Type"]), HEADER_TEXT,
                             max_size=5)


@pytest.fixture(scope="module")
def srv():
    cfg = ServerConfig(time_scale=1000.0, workflows=("chain3",), max_body_bytes=2**20, max_workflow_bytes=2**20,
                       default_max_tokens=64, max_call_history=500, max_task_history=500)
    handle = start_server_in_thread(cfg)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(base_url=srv.base_url, timeout=TIMEOUT_S) as client:
        yield client


def _check(rsp: httpx.Response) -> None:
    assert rsp.status_code < 500, (rsp.status_code, rsp.text[:300])
    if rsp.status_code >= 400:
        err = rsp.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert len(err["message"]) < 2000  # user input is not echoed at length


def _intact(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    assert http.get("/v1/topas/stats").status_code == 200
    ok = http.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 4})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]


@FUZZ
@given(body=CHAT, path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]), headers=HEADER_SET)
def test_fuzzed_call_bodies_and_headers(http, body, path, headers):
    headers.pop("Authorization", None)
    raw = json.dumps(body, allow_nan=True)  # ensure_ascii: surrogates travel as escapes
    sent = {k: v.encode("latin-1") for k, v in headers.items()}  # header bytes as the server decodes them
    rsp = http.post(path, content=raw, headers={**sent, "Content-Type": "application/json"})
    _check(rsp)
    if rsp.status_code == 200 and body.get("stream") is True:
        assert rsp.text.rstrip().endswith("data: [DONE]")


@FUZZ
@given(body=RESPONSES | GOOD_RESPONSES, headers=HEADER_SET)
def test_fuzzed_responses_api_bodies(http, body, headers):
    headers.pop("Authorization", None)
    sent = {k: v.encode("latin-1") for k, v in headers.items()}
    rsp = http.post("/v1/responses", content=json.dumps(body, allow_nan=True),
                    headers={**sent, "Content-Type": "application/json"})
    _check(rsp)
    if rsp.status_code != 200:
        return
    if body.get("stream") is True:  # an event stream that ends with the final response
        last = rsp.text.rstrip().rsplit("\n\n", 1)[-1]
        assert last.startswith(("event: response.completed", "event: response.incomplete")), last[:200]
    else:  # strict JSON (no NaN/Infinity echoed from the body)
        assert json.loads(rsp.text, parse_constant=lambda c: pytest.fail(c))["object"] == "response"


@FUZZ
@given(raw=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()) | st.sampled_from(
    [b"[" * 50_000, b'{"a":' * 50_000, b"9" * 5000, b"\xff\xfe", b'"\\ud800"']))
def test_fuzzed_raw_bodies(http, raw):
    _check(http.post("/v1/chat/completions", content=raw))


@FUZZ
@given(query=st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30))
def test_fuzzed_stats_queries(http, query):
    _check(http.get("/v1/topas/stats", params={"calls": query}))


@FUZZ
@given(task=st.text(min_size=1, max_size=30), stage=st.text(min_size=1, max_size=30))
def test_fuzzed_done_calls(http, task, stage):
    from urllib.parse import quote

    t, s = quote(task.encode("utf-8", "surrogatepass"), safe=""), quote(stage.encode("utf-8", "surrogatepass"), safe="")
    for path in (f"/v1/topas/tasks/{t}/done", f"/v1/topas/tasks/{t}/stages/{s}/done"):
        _check(http.post(path))


STAGE = st.fixed_dictionaries({"name": TEXT, "agent": st.sampled_from(["a", "b"]) | TEXT},
                              optional={"after": st.lists(st.sampled_from(["s0", "s1", "s2"]) | TEXT, max_size=3)
                                        | JSON, "requests": INTS | JSON, "input_tokens": INTS | JSON,
                                        "output_tokens": INTS | JSON, "tool_wait_s": SCALARS})
WORKFLOW = st.fixed_dictionaries({}, optional={
    "name": TEXT, "agents": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["a", "b"]) | TEXT,
                                                            "prefix_tokens": INTS}), max_size=3) | JSON,
    "stages": st.lists(STAGE, max_size=4) | JSON, "loads": JSON, "rates": JSON, "description": JSON})


def _as_yaml_or_json(doc: dict, as_json: bool) -> str:
    import yaml

    if as_json:
        return json.dumps(doc, allow_nan=True)
    try:
        return yaml.safe_dump(doc, allow_unicode=False)
    except (yaml.YAMLError, ValueError):
        return json.dumps(doc)


@FUZZ
@given(doc=WORKFLOW, as_json=st.booleans())
def test_fuzzed_workflow_uploads(http, doc, as_json):
    rsp = http.post("/v1/topas/workflows", content=_as_yaml_or_json(doc, as_json))
    _check(rsp)
    assert rsp.status_code in (200, 201, 400, 409, 413)


@FUZZ
@given(text=st.text(max_size=300) | st.sampled_from(["[" * 10_000, "- " * 10_000, "&a [*a]", "!!python/object:os.system x",
                                                      "a: !!binary x", "{a: 1, a: 2}", "chain3", "\t- x"]))
def test_fuzzed_workflow_text(http, text):
    _check(http.post("/v1/topas/workflows", content=text.encode("utf-8", "surrogatepass")))


def test_the_server_is_intact_after_fuzzing(http):
    _intact(http)
    stats = http.get("/v1/topas/stats").json()
    assert not any(s >= 500 for row in stats["requests"]["http"] for s in [row["status"]])
