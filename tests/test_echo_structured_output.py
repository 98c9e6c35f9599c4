"""`response_format` on the simulated server: JSON formats are parsed (400s as SGLang's
request model gives them), the echo and lorem responders answer JSON that the real `openai`
client parses into the caller's pydantic model, streaming or not."""

from __future__ import annotations

import json
import math
import re

import httpx
import openai
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, conint

from topas_agents.server import ServerConfig, start_server_in_thread
from topas_agents.server.api_errors import ApiError
from topas_agents.server.openai_format import TEXT_FORMAT, ResponseFormat, parse_response_format
from topas_agents.server.protocol import Message
from topas_agents.server.responders import EchoResponder, LoremResponder, ResponseContext
from topas_agents.server.schema_fill import schema_value, tool_arguments

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


class Constrained(BaseModel):
    """The constraints frameworks put on fields (found failing with AutoGen tools and `.parse()`):
    the placeholder broke each of them before."""

    confidence: float = Field(gt=0, lt=1)  # was 1.0: exclusive bounds moved by 1, also on floats
    share: float = Field(gt=0.0, le=0.7)
    point: tuple[float, float]  # prefixItems: was [null, null]
    mixed: tuple[int, str, bool]
    weekly: conint(multiple_of=7, ge=1)  # was 1
    order: str = Field(pattern="^ORD-[0-9]{4}$")  # was "example"
    phone: str = Field(pattern=r"^\+?[1-9]\d{1,14}$")
    address: str = Field(json_schema_extra={"format": "ipv4"})
    negative: int = Field(lt=0)


def test_a_value_of_a_constrained_schema_validates() -> None:
    schema = Constrained.model_json_schema()
    Constrained.model_validate_json(schema_value(schema))
    Constrained.model_validate_json(tool_arguments(schema))
    # draft 4's boolean exclusive bounds
    assert json.loads(schema_value({"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1})) > 0


_BOUND = st.one_of(st.none(), st.integers(-50, 50), st.floats(-50, 50, allow_nan=False).map(lambda x: round(x, 2)))


@settings(max_examples=300, deadline=None)
@given(integer=st.booleans(), low=_BOUND, high=_BOUND, low_excl=st.booleans(), high_excl=st.booleans(),
       multiple=st.one_of(st.none(), st.integers(1, 9)))
def test_a_number_meets_its_bounds_whenever_they_allow_one(integer, low, high, low_excl, high_excl, multiple) -> None:
    spec: dict = {"type": "integer" if integer else "number"}
    if low is not None:
        spec["exclusiveMinimum" if low_excl else "minimum"] = low
    if high is not None:
        spec["exclusiveMaximum" if high_excl else "maximum"] = high
    if multiple is not None:
        spec["multipleOf"] = multiple
    step = multiple or (1 if integer else None)

    def ok(x: float) -> bool:
        return (low is None or (x > low if low_excl else x >= low)) and \
            (high is None or (x < high if high_excl else x <= high))

    # only ranges that hold a value: a multiple of the step in [-60, 60], or a float gap
    if step is not None:
        assume(any(ok(j * step) for j in range(-60 // step - 1, 60 // step + 2)))
    else:
        assume((-math.inf if low is None else low) + 0.01 < (math.inf if high is None else high))
    x = json.loads(schema_value(spec))
    assert ok(x), x
    if step is not None:
        assert isinstance(x, int) == integer and x % step == 0


def test_a_pattern_is_built_not_matched() -> None:
    from topas_agents.server.pattern_fill import pattern_example

    for pattern in ("^ORD-[0-9]{4}$", r"^\d{3}-\w+$", "^(foo|bar)+[^a-z]?$", r"(\w)\1", r"^#(?:[0-9a-fA-F]{3}){1,2}$"):
        text = pattern_example(pattern, 256)
        assert text is not None and re.search(pattern, text), pattern
    # nothing it cannot build safely: a lookahead, a bad regex, too long, nested empty repeats
    for pattern in ("^(?=x)y", "[", "a{1000}", "(((){250}){250}){250}", "a" * 2000, 7):
        assert pattern_example(pattern, 256) is None
    # the placeholder then: a pattern never costs a match against client input (`(a+)+$`)
    assert json.loads(schema_value({"type": "string", "pattern": "^(?=x)y"})) == "example"
    assert pattern_example("(?i)[^a-z]", 256) is None  # "A" would not match: no case-folded build


class Bounded(BaseModel):
    """Found by review: a pattern's string ignored minLength, a 6-position tuple was cut to 4,
    and a tiny multipleOf beside a big bound was an OverflowError (a 500)."""

    slug: str = Field(pattern="^[a-z0-9_-]+$", min_length=3)
    six: tuple[int, int, int, int, int, int]


def test_pattern_length_and_tuple_bounds_hold_and_no_number_is_a_500() -> None:
    Bounded.model_validate_json(schema_value(Bounded.model_json_schema()))
    for spec in ({"type": "number", "minimum": 1e10, "multipleOf": 1e-300},
                 {"type": "integer", "maximum": -1e300, "multipleOf": 1e-10},
                 {"type": "number", "multipleOf": 1e308, "minimum": 1}):
        assert math.isfinite(json.loads(schema_value(spec)))
