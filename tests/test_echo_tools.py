"""Function tools on the echo responder: `tools`/`tool_choice` parsing (400s), placeholder
arguments from JSON schemas, the tool-call rules, the OpenAI response/chunk shapes, and the
real `openai` client against the server (streaming and not)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topas_agents.server import ServerConfig, start_server_in_thread
from topas_agents.server.api_errors import ApiError
from topas_agents.server.openai_format import ChunkWriter, ToolCall, full_response, parse_tools
from topas_agents.server.protocol import Message
from topas_agents.server.responders import EchoResponder, ResponseContext
from topas_agents.server.schema_fill import MAX_ARRAY_ITEMS, MAX_STRING_CHARS, tool_arguments

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}, "detailed": {"type": "boolean"},
        "when": {"type": "string", "format": "date"}, "tags": {"type": "array", "items": {"type": "string"},
                                                               "minItems": 2},
        "where": {"$ref": "#/$defs/Point"}, "note": {"type": "string"}},
        "required": ["city", "unit", "days", "detailed", "when", "tags", "where"],
        "$defs": {"Point": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                            "required": ["lat", "lon"]}}}}}
SEARCH = {"type": "function", "function": {"name": "web_search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string", "minLength": 3}}, "required": ["query"]}}}
WEATHER_ARGS = {"city": "example", "unit": "celsius", "days": 1, "detailed": False, "when": "1970-01-01",
                "tags": ["example", "example"], "where": {"lat": 0.0, "lon": 0.0}}


def _strict_json(text: str):
    def bad(c: str):
        raise ValueError(c)
    return json.loads(text, parse_constant=bad)


# ---------------------------------------------------------------------- parsing (400s)

@pytest.mark.parametrize(("body", "param", "words"), [
    ({"tools": {"type": "function"}}, "tools", "must be a list"),
    ({"tools": [{"type": "retrieval"}]}, "tools", 'tools[0] must be an object with "type": "function"'),
    ({"tools": ["x"]}, "tools", "tools[0] must be an object"),
    ({"tools": [{"type": "function"}]}, "tools", "tools[0].function must be an object"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools", "function.name"),
    ({"tools": [{"type": "function", "function": {"name": "x" * 65}}]}, "tools", "function.name"),
    ({"tools": [SEARCH, {"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools",
     "tools[1].function.parameters must be a JSON schema object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"required": "a"}}}]}, "tools",
     "parameters.required must be a list"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 3}}]}, "tools", "description"),
    ({"tools": [SEARCH], "tool_choice": "always"}, "tool_choice", "tool_choice must be"),
    ({"tools": [SEARCH], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not in 'tools'"),
    ({"tool_choice": "required"}, "tool_choice", "needs a non-empty 'tools'"),
])
def test_malformed_tools_are_400_naming_the_field(body, param, words) -> None:
    with pytest.raises(ApiError) as err:
        parse_tools(body)
    assert err.value.status == 400 and err.value.param == param and words in err.value.message


def test_parse_tools_choices_and_prompt_cost() -> None:
    assert not parse_tools({}).wanted and not parse_tools({"tools": []}).wanted
    req = parse_tools({"tools": [WEATHER, SEARCH]})
    assert [t.name for t in req.tools] == ["get_weather", "web_search"] and req.choice.mode == "auto"
    assert req.wanted and req.prompt_tokens > 50 and req.tools[0].description == "Current weather in a city"
    assert not parse_tools({"tools": [SEARCH], "tool_choice": "none"}).wanted
    forced = parse_tools({"tools": [WEATHER, SEARCH], "tool_choice": {"type": "function",
                                                                       "function": {"name": "web_search"}}})
    assert (forced.choice.mode, forced.choice.name) == ("function", "web_search")
    assert parse_tools({"tool_choice": "auto"}).choice.mode == "auto"  # harmless without tools


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                 max_size=3), max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["tools", "tool_choice", "messages"]), JSON | st.lists(JSON, max_size=3)))
def test_parse_tools_is_a_result_or_a_400(body) -> None:
    try:
        req = parse_tools(body)
    except ApiError as exc:
        assert exc.status == 400 and exc.param in ("tools", "tool_choice")
    else:
        for spec in req.tools:
            assert isinstance(_strict_json(tool_arguments(spec.parameters)), dict)


# ---------------------------------------------------------------------- placeholder arguments

KEYWORDS = ["type", "properties", "required", "items", "enum", "const", "default", "$ref", "anyOf", "oneOf",
            "allOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems", "minLength",
            "maxLength", "format", "$defs", "a", "b"]
SCHEMAISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.sampled_from(
        ["object", "array", "string", "integer", "number", "boolean", "null", "#/$defs/a", "#", "#/x", "date", "a"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYWORDS), inner, max_size=4),
    max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYWORDS), SCHEMAISH, max_size=5))
def test_tool_arguments_are_always_a_strict_json_object(schema) -> None:
    assert isinstance(_strict_json(tool_arguments(schema)), dict)


def _typed_property() -> st.SearchStrategy:
    ints = st.integers(-10**6, 10**6)
    return st.one_of(
        st.tuples(ints, ints).map(lambda b: {"type": "integer", "minimum": min(b), "maximum": max(b)}),
        st.tuples(ints, ints).map(lambda b: {"type": "number", "exclusiveMinimum": min(b) - 1,
                                             "maximum": max(b)}),
        st.integers(0, 1000).map(lambda n: {"type": "string", "minLength": n}),
        st.integers(0, 3).map(lambda n: {"type": "string", "maxLength": n}),
        st.just({"type": "boolean"}), st.just({"type": ["null", "string"]}),
        st.lists(st.integers() | st.text(max_size=3), min_size=1, max_size=3).map(lambda e: {"enum": e}),
        st.integers(0, 100).map(lambda n: {"type": "array", "items": {"type": "integer"}, "minItems": n}),
    )


def _conforms(value, schema: dict) -> bool:
    kind = schema.get("type")
    if "enum" in schema:
        return value == schema["enum"][0]
    if kind == ["null", "string"] or kind == "string":
        return (isinstance(value, str) and len(value) >= min(schema.get("minLength", 0), MAX_STRING_CHARS)
                and len(value) <= schema.get("maxLength", 10**9))
    if kind in ("integer", "number"):
        lo = schema.get("minimum", schema.get("exclusiveMinimum", -10**9) + 1e-9)
        return isinstance(value, int if kind == "integer" else float) and lo <= value <= schema["maximum"]
    if kind == "array":
        return value == [0] * min(schema["minItems"], MAX_ARRAY_ITEMS)
    return value is False


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), _typed_property(), min_size=1, max_size=6),
       st.data())
def test_required_properties_get_conforming_placeholders(props, data) -> None:
    required = data.draw(st.lists(st.sampled_from(sorted(props)), unique=True))
    args = _strict_json(tool_arguments({"type": "object", "properties": props, "required": required}))
    assert sorted(args) == sorted(required)  # required ones only
    for name in required:
        assert _conforms(args[name], props[name]), (name, props[name], args[name])


def test_weather_arguments_and_recursion_bound() -> None:
    assert _strict_json(tool_arguments(WEATHER["function"]["parameters"])) == WEATHER_ARGS
    loop = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    assert len(tool_arguments(loop)) < 400  # a self-reference stops at the depth bound
    wide = {"type": "object", "properties": {"a": {"$ref": "#/$defs/w"}}, "required": ["a"],
            "$defs": {"w": {"type": "object", "properties": {k: {"$ref": "#/$defs/w"} for k in "abcdefgh"},
                            "required": list("abcdefgh")}}}
    assert len(tool_arguments(wide)) < 200_000  # 8-way fan-out: the node budget bounds it


# ---------------------------------------------------------------------- echo rules

def _ctx(messages: list[tuple[str, str]], body: dict, kind: str = "chat") -> ResponseContext:
    msgs = tuple(Message(r, c) for r, c in messages)
    last = next((m.content for m in reversed(msgs) if m.role == "user"), "")
    return ResponseContext(kind, msgs, last, "t", "s", "a", 0, False, None, parse_tools(body))


def test_echo_calls_the_named_forced_or_first_tool() -> None:
    echo = EchoResponder()
    both = {"tools": [WEATHER, SEARCH]}
    first = echo.respond(_ctx([("user", "what is the weather")], both))
    assert isinstance(first, ToolCall) and first.name == "get_weather" and first.id.startswith("call_")
    assert _strict_json(first.arguments) == WEATHER_ARGS
    named = echo.respond(_ctx([("user", "use web_search for it")], both))
    assert isinstance(named, ToolCall) and named.name == "web_search"
    assert _strict_json(named.arguments) == {"query": "example"}
    forced = {**both, "tool_choice": {"type": "function", "function": {"name": "web_search"}}}
    assert echo.respond(_ctx([("user", "get_weather please")], forced)).name == "web_search"
    assert echo.respond(_ctx([("user", "hi")], {**both, "tool_choice": "none"})) == "Echo: hi"
    assert echo.respond(_ctx([("user", "hi")], {})) == "Echo: hi"


def test_echo_answers_text_after_a_tool_result_unless_forced() -> None:
    echo = EchoResponder()
    convo = [("system", "s"), ("user", "weather?"), ("assistant", ""), ("tool", "21C and sunny")]
    assert echo.respond(_ctx(convo, {"tools": [WEATHER]})) == "Echo: tool result: 21C and sunny"
    assert isinstance(echo.respond(_ctx(convo, {"tools": [WEATHER], "tool_choice": "required"})), ToolCall)
    # a new user turn after the tool result may call a tool again
    assert isinstance(echo.respond(_ctx([*convo, ("assistant", "ok"), ("user", "again")], {"tools": [WEATHER]})),
                      ToolCall)


def test_tool_rules_survive_with_rule_and_can_be_turned_off() -> None:
    ctx = _ctx([("user", "please review")], {"tools": [SEARCH]})
    custom = EchoResponder().with_rule("lgtm", lambda c: "LGTM" if "review" in c.last_user else None)
    assert isinstance(custom.respond(ctx), ToolCall)
    assert EchoResponder(tool_rules=()).with_rule("lgtm", lambda c: "LGTM").respond(ctx) == "LGTM"


# ---------------------------------------------------------------------- response shapes

def _fake_call(tool: ToolCall | None, text: str, reason: str) -> SimpleNamespace:
    record = SimpleNamespace(rid="r", public_task_id="t", stage="s", public_agent="a", round=0, arrival_s=0.0,
                             first_token_s=0.0, finish_s=1.0)
    return SimpleNamespace(rid="chatcmpl-1", text=text, finish_reason=reason, tool_call=tool, record=record,
                           usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3})


def test_tool_call_message_and_chunks() -> None:
    tool = ToolCall("call_1", "get_weather", '{"city": "x"}')
    msg = full_response("chat", _fake_call(tool, tool.arguments, "tool_calls"), "m")["choices"][0]
    assert msg["finish_reason"] == "tool_calls" and msg["message"]["content"] is None
    assert msg["message"]["tool_calls"] == [{"id": "call_1", "type": "function",
                                             "function": {"name": "get_weather", "arguments": '{"city": "x"}'}}]
    writer = ChunkWriter("chat", _fake_call(tool, tool.arguments, "tool_calls"), "m", False)

    def delta(raw: bytes) -> dict:
        return json.loads(raw.removeprefix(b"data: "))["choices"][0]

    head = delta(writer.start())["delta"]
    assert head["tool_calls"] == [{"index": 0, "id": "call_1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": ""}}]
    assert delta(writer.text('{"ci'))["delta"] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}
    assert delta(writer.finish())["finish_reason"] == "tool_calls"
    plain = ChunkWriter("chat", _fake_call(None, "hi", "stop"), "m", False)
    assert delta(plain.text("hi"))["delta"] == {"content": "hi"}


# ---------------------------------------------------------------------- over HTTP, real openai client



@pytest.fixture(scope="module")
def server():
    handle = start_server_in_thread(ServerConfig(time_scale=200.0, drain_timeout_s=2.0))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30)


USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_openai_client_gets_a_tool_call_then_text(client) -> None:
    """One agent-loop round: tool call, the tool's answer, then plain text (loop over)."""
    r = client.chat.completions.create(model="m", messages=USER, tools=[WEATHER, SEARCH])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert _strict_json(call.function.arguments) == WEATHER_ARGS
    plain = client.chat.completions.create(model="m", messages=USER)
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens  # the tool definitions are prompt tokens
    history = [*USER, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18C, light rain"}]
    final = client.chat.completions.create(model="m", messages=history, tools=[WEATHER, SEARCH])
    assert final.choices[0].finish_reason == "stop" and not final.choices[0].message.tool_calls
    assert final.choices[0].message.content == "Echo: tool result: 18C, light rain"


def test_openai_client_streams_a_forced_tool_call(client) -> None:
    stream = client.chat.completions.create(
        model="m", messages=USER, tools=[WEATHER, SEARCH], stream=True, stream_options={"include_usage": True},
        tool_choice={"type": "function", "function": {"name": "web_search"}})
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    head = deltas[0].tool_calls[0]
    assert (head.index, head.function.name, head.type) == (0, "web_search", "function") and head.id
    pieces = [d.tool_calls[0].function.arguments for d in deltas if d.tool_calls]
    assert _strict_json("".join(pieces)) == {"query": "example"}
    assert all(d.content is None for d in deltas)
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].usage.completion_tokens > 0


def test_streamed_arguments_arrive_in_pieces(client) -> None:
    stream = client.chat.completions.create(model="m", messages=USER, tools=[WEATHER], stream=True)
    pieces = [c.choices[0].delta.tool_calls[0].function.arguments for c in stream
              if c.choices and c.choices[0].delta.tool_calls]
    assert len([p for p in pieces if p]) >= 2 and _strict_json("".join(pieces)) == WEATHER_ARGS


def test_tool_choice_none_and_no_tools_answer_text(client) -> None:
    r = client.chat.completions.create(model="m", messages=USER, tools=[WEATHER], tool_choice="none")
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content.startswith("Echo: What")
    assert r.choices[0].message.tool_calls is None


@pytest.mark.parametrize("extra", [
    {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
    {"tools": "get_weather"},
    {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}},
])
def test_malformed_tools_over_http_are_400(server, extra) -> None:
    r = httpx.post(f"{server.url}/chat/completions", json={"model": "m", "messages": USER, **extra}, timeout=10)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] in ("tools", "tool_choice")
