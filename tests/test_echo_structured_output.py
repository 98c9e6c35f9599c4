"""`response_format` on the simulated server: JSON formats are parsed (400s as SGLang's
request model gives them), the echo and lorem responders answer JSON that the real `openai`
client parses into the caller's pydantic model, streaming or not."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from topas_agents.server import ServerConfig, start_server_in_thread
from topas_agents.server.api_errors import ApiError
from topas_agents.server.openai_format import TEXT_FORMAT, ResponseFormat, parse_response_format
from topas_agents.server.protocol import Message
from topas_agents.server.responders import EchoResponder, LoremResponder, ResponseContext
from topas_agents.server.schema_fill import schema_value

USER = [{"role": "user", "content": "Plan a trip to Paris"}]


class Stop(BaseModel):
    city: str
    nights: int


class Plan(BaseModel):  # nested: the SDK's schema has $defs and $ref, strict, every field required
    title: str
    stops: list[Stop]
    budget: float
    confirmed: bool


# ---------------------------------------------------------------------- parsing


@pytest.mark.parametrize(("raw", "words"), [
    ("json", "'type' is one of"),
    ({"type": "xml"}, "'type' is one of"),
    ({"type": "json_schema"}, "string 'name'"),
    ({"type": "json_schema", "json_schema": {"schema": {}}}, "string 'name'"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "schema must be a JSON schema object"),
])
def test_malformed_response_formats_are_400_naming_the_field(raw, words) -> None:
    with pytest.raises(ApiError) as err:
        parse_response_format({"response_format": raw})
    assert err.value.status == 400 and err.value.param == "response_format" and words in err.value.message


def test_the_formats_sglang_accepts() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    assert parse_response_format({}) is TEXT_FORMAT
    assert parse_response_format({"response_format": {"type": "text"}}) is TEXT_FORMAT
    assert parse_response_format({"response_format": {"type": "json_object"}}) == ResponseFormat("json_object")
    assert parse_response_format({"response_format": {"type": "structural_tag"}}) == ResponseFormat("structural_tag")
    named = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    assert parse_response_format({"response_format": named}) == ResponseFormat("json_schema", schema)
    # SGLang also takes the schema directly under response_format (vLLM's spelling)
    assert parse_response_format({"response_format": {"type": "json_schema", "schema": schema}}).schema == schema


@settings(max_examples=150, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=12))
def test_parse_response_format_is_a_result_or_a_400(raw) -> None:
    try:
        fmt = parse_response_format({"response_format": raw})
    except ApiError as exc:
        assert exc.status == 400 and exc.param == "response_format"
        return
    assert fmt.kind in ("text", "json_object", "json_schema", "structural_tag")
    json.loads(schema_value(fmt.schema))  # whatever the schema, the reply is JSON


# ---------------------------------------------------------------------- responders


def _ctx(fmt: ResponseFormat, *messages: Message) -> ResponseContext:
    msgs = messages or (Message("user", "Plan a trip to Paris"),)
    return ResponseContext("chat", msgs, "Plan a trip to Paris", "t", "s", "a", 0, True, 64, response_format=fmt)


def test_echo_and_lorem_answer_a_value_of_the_schema() -> None:
    schema = Plan.model_json_schema()
    for responder in (EchoResponder(), LoremResponder()):
        reply = responder.respond(_ctx(ResponseFormat("json_schema", schema)))
        assert isinstance(Plan.model_validate_json(reply), Plan)  # a value of the schema
        assert json.loads(responder.respond(_ctx(ResponseFormat("json_object")))) == {"echo": "Plan a trip to Paris"}
    assert EchoResponder().respond(_ctx(TEXT_FORMAT)) == "Echo: Plan a trip to Paris"


def test_the_answer_after_a_tool_result_keeps_the_format() -> None:
    ctx = _ctx(ResponseFormat("json_object"), Message("user", "weather?"), Message("tool", "18C, rain"))
    assert json.loads(EchoResponder().respond(ctx)) == {"echo": "18C, rain"}


# ---------------------------------------------------------------------- over HTTP, real openai client


@pytest.fixture(scope="module", params=["echo", "lorem"])
def client(request):
    handle = start_server_in_thread(ServerConfig(time_scale=200.0, drain_timeout_s=2.0, responder=request.param))
    yield openai.OpenAI(base_url=handle.url, api_key="unused", max_retries=0, timeout=30)
    handle.stop()


def test_the_reply_validates_as_the_callers_model(client) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "Plan", "strict": True, "schema": Plan.model_json_schema()}}
    r = client.chat.completions.create(model="m", messages=USER, response_format=fmt)
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(Plan.model_validate_json(r.choices[0].message.content), Plan)
    # the SDK's own helper where this openai has it (1.40+: beta; 2.x: chat.completions.parse)
    parse = getattr(client.chat.completions, "parse", None) or getattr(getattr(client.beta, "chat", None),
                                                                       "completions", None)
    if parse is not None and not callable(parse):
        parse = parse.parse
    if parse is not None:
        assert isinstance(parse(model="m", messages=USER, response_format=Plan).choices[0].message.parsed, Plan)


def test_a_streamed_json_reply_is_whole_json(client) -> None:
    stream = client.chat.completions.create(model="m", messages=USER, stream=True,
                                            response_format={"type": "json_object"})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert json.loads(text) == {"echo": "Plan a trip to Paris"}


def test_completions_take_response_format_too(client) -> None:
    r = client.completions.create(model="m", prompt="Plan a trip", max_tokens=50,
                                  extra_body={"response_format": {"type": "json_object"}})
    assert json.loads(r.choices[0].text) == {"echo": "Plan a trip"}


def test_a_malformed_response_format_over_http_is_400(client) -> None:
    r = httpx.post(f"{client.base_url}chat/completions", timeout=10,
                   json={"model": "m", "messages": USER, "response_format": {"type": "yaml"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
