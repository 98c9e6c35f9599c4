"""`POST /v1/responses` on the simulated server: the Responses API that SGLang serves and the
OpenAI Agents SDK uses by default. Raw HTTP everywhere; the openai SDK's own parsing where the
installed openai has the Responses API (not 1.39, MetaGPT's pin in .venv; .venv-py310 has it)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from pydantic import BaseModel

from topas_agents import label
from topas_agents.integrations.openai_client import labelled
from topas_agents.server import ServerConfig, start_server_in_thread

HAS_RESPONSES = hasattr(openai.OpenAI(api_key="x"), "responses")  # openai >= 1.66
sdk = pytest.mark.skipif(not HAS_RESPONSES, reason="this openai has no Responses API")
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
LABEL = {"task_id": "resp-1", "stage": "s1", "agent": "a", "workflow": "chain3"}


@pytest.fixture(scope="module")
def server():
    handle = start_server_in_thread(ServerConfig(time_scale=500.0, workflows=("chain3",), task_idle_timeout_s=0.0))
    yield handle
    handle.stop()


def _post(server, body: dict, **kw) -> httpx.Response:
    return httpx.post(f"{server.url}/responses", json=body, timeout=30, **kw)


def _events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.strip().split("\n\n"):
        kind, data = block.split("\n", 1)
        assert kind.startswith("event: ") and data.startswith("data: "), block
        out.append((kind[len("event: "):], json.loads(data[len("data: "):])))
    return out


def test_a_text_answer_as_a_response_object_labelled_like_a_chat_call(server):
    rsp = _post(server, {"model": "m", "instructions": "Be terse.", "input": "hello there", "topas": LABEL})
    assert rsp.status_code == 200, rsp.text
    out = rsp.json()
    assert (out["object"], out["status"], out["model"], out["instructions"]) == ("response", "completed", "m", "Be terse.")
    [item] = out["output"]
    assert (item["type"], item["role"], item["status"]) == ("message", "assistant", "completed")
    assert item["content"][0] == {"type": "output_text", "text": "Echo: hello there", "annotations": [], "logprobs": []}
    usage = out["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] and usage["output_tokens"] > 0
    assert out["topas"]["task_id"] == "resp-1" and out["topas"]["stage"] == "s1"
    calls = httpx.get(f"{server.base_url}/v1/topas/stats", timeout=10).json()["calls"]
    assert [(c["stage"], c["label_source"]) for c in calls if c["task_id"] == "resp-1"] == [("s1", "body")]
    # the answer's id is its stats record's rid (it was resp_<hex> against resp-<hex>)
    assert out["id"].startswith("resp_") and [c["rid"] for c in calls if c["task_id"] == "resp-1"] == [out["id"]]


def test_image_and_file_parts_are_taken_and_add_no_text(server):
    # an agent attaching a screenshot was a 400 here, where chat takes image_url parts
    text = [{"type": "input_text", "text": "what is on it"}]
    media = [{"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
             {"type": "input_file", "file_id": "file-1"}]
    plain = _post(server, {"model": "m", "input": [{"role": "user", "content": text}]})
    mixed = _post(server, {"model": "m", "input": [{"role": "user", "content": [media[0], *text, media[1]]}]})
    assert plain.status_code == mixed.status_code == 200, mixed.text
    assert mixed.json()["output"][0]["content"][0]["text"] == plain.json()["output"][0]["content"][0]["text"]
    assert mixed.json()["usage"]["input_tokens"] == plain.json()["usage"]["input_tokens"]


def test_header_labels_and_a_function_call_round_trip(server):
    headers = {"X-Topas-Task-Id": "resp-2", "X-Topas-Stage": "s1", "X-Topas-Agent": "a"}
    first = _post(server, {"model": "m", "input": "weather in Paris?", "tools": TOOLS}, headers=headers).json()
    [call] = first["output"]
    assert (call["type"], call["name"], json.loads(call["arguments"])) == ("function_call", "get_weather",
                                                                          {"city": "example"})
    history = [{"role": "user", "content": [{"type": "input_text", "text": "weather in Paris?"}]},
               {"type": "function_call", "call_id": call["call_id"], "name": call["name"], "arguments": call["arguments"]},
               {"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny"},
               {"type": "reasoning", "id": "rs_1", "summary": []}]
    second = _post(server, {"model": "m", "input": history, "tools": TOOLS}, headers=headers).json()
    assert second["output"][0]["content"][0]["text"] == "Echo: tool result: Sunny"
    calls = httpx.get(f"{server.base_url}/v1/topas/stats", timeout=10).json()["calls"]
    assert [c["label_source"] for c in calls if c["task_id"] == "resp-2"] == ["headers", "headers"]


def test_a_label_in_metadata_is_read_after_the_body_and_headers(server):
    # what the cluster front sends through smg, which refuses a `topas` body field there
    meta = {"topas_task_id": "resp-meta", "topas_stage": "s2", "topas_agent": "b", "topas_workflow": "chain3",
            "topas_prefix_tokens": "40", "mine": "x"}
    out = _post(server, {"model": "m", "input": "hi", "metadata": meta}).json()
    assert (out["topas"]["task_id"], out["topas"]["stage"]) == ("resp-meta", "s2") and out["metadata"] == meta
    headers = {"X-Topas-Task-Id": "resp-hdr", "X-Topas-Stage": "s1", "X-Topas-Agent": "a"}
    assert _post(server, {"model": "m", "input": "hi", "metadata": meta}, headers=headers).json()["topas"][
        "task_id"] == "resp-hdr"
    bad = _post(server, {"model": "m", "input": "hi", "metadata": {**meta, "topas_prefix_tokens": "many"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "metadata.topas_prefix_tokens"


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_the_event_stream_builds_the_same_answer(server, tools):
    body = {"model": "m", "input": "stream me a longer answer please", "stream": True, "topas": LABEL}
    if tools:
        body["tools"] = tools
    rsp = _post(server, body)
    assert rsp.status_code == 200 and rsp.headers["content-type"].startswith("text/event-stream")
    events = _events(rsp.text)
    kinds = [k for k, _ in events]
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-2:] == ["response.output_item.done", "response.completed"]
    delta = "response.function_call_arguments.delta" if tools else "response.output_text.delta"
    streamed = "".join(e["delta"] for k, e in events if k == delta)
    final = events[-1][1]["response"]
    [item] = final["output"]
    assert streamed == (item["arguments"] if tools else item["content"][0]["text"]) and streamed


def test_max_output_tokens_ends_incomplete(server):
    out = _post(server, {"model": "m", "input": "a long answer please", "max_output_tokens": 2}).json()
    assert out["status"] == "incomplete" and out["incomplete_details"] == {"reason": "max_output_tokens"}
    assert out["output"][0]["status"] == "incomplete"  # the cut item too (it said "completed")
    events = _events(_post(server, {"model": "m", "input": "a long answer", "max_output_tokens": 2,
                                     "stream": True}).text)
    assert events[-1][0] == "response.incomplete"
    done = [data for kind, data in events if kind == "response.output_item.done"]
    assert [d["item"]["status"] for d in done] == ["incomplete"]


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),  # no response store
    ({"input": "x", "background": True}, "background"),
    ({"input": []}, "input"),
    ({}, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_video", "url": "u"}]}]}, "input[0].content[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 3}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format"),
    ({"input": "x", "instructions": 7}, "instructions"),
    ({"input": "x", "metadata": "tags"}, "metadata"),  # was taken and echoed back as {}
    ({"input": "x", "metadata": {"k": 1}}, "metadata"),
    # the chat parser's checks, in the Responses request's terms
    ({"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": 10**9}, "max_output_tokens"),  # over the KV budget
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": 5}}}, "text.format"),
    ({"input": "x", "tools": [{"type": "function", "name": 5}]}, "tools"),
    ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
    ({"input": "x", "topas": {"task_id": "t", "stage": "nope", "agent": "a", "workflow": "chain3"}}, "topas.stage"),
])
def test_bad_requests_are_400_naming_the_field(server, body, param):
    rsp = _post(server, {"model": "m", **body})
    assert rsp.status_code == 400, rsp.text
    err = rsp.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    for chat_term in ("max_tokens", "response_format", ".function.", '"function": {'):
        assert chat_term not in err["message"], err["message"]


def test_non_finite_numbers_in_echoed_fields_are_not_echoed(server):
    # the body may hold NaN/Infinity (Python's JSON reader takes them); a response cannot
    # (a metadata value that is not a string, NaN too, is a 400: test_bad_requests_are_400_naming_the_field)
    raw = ('{"model": "m", "input": "x", "user": Infinity, "parallel_tool_calls": NaN,'
           ' "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "default": NaN}}]}')
    rsp = httpx.post(f"{server.url}/responses", content=raw, headers={"Content-Type": "application/json"}, timeout=30)
    assert rsp.status_code == 200, rsp.text
    out = json.loads(rsp.text, parse_constant=lambda c: pytest.fail(f"{c} in the response"))
    assert (out["metadata"], out["user"], out["parallel_tool_calls"], out["tools"]) == ({}, None, True, [])


class Plan(BaseModel):
    steps: list[str]
    done: bool


@sdk
def test_the_openai_sdk_parses_every_answer(server):
    client = labelled(openai.OpenAI(base_url=server.url, api_key="x", max_retries=0))
    with label(task_id="resp-sdk", stage="s1", agent="a", workflow="chain3"):
        text = client.responses.create(model="m", input="hi")
        tool = client.responses.create(model="m", input="weather?", tools=TOOLS)
        parsed = client.responses.parse(model="m", input="plan it", text_format=Plan)
        with client.responses.stream(model="m", input="stream it") as stream:
            for _ in stream:
                pass
            streamed = stream.get_final_response()
    assert text.output_text == "Echo: hi" and text.usage.output_tokens > 0
    assert tool.output[0].type == "function_call" and tool.output[0].name == "get_weather"
    assert isinstance(parsed.output_parsed, Plan)
    assert streamed.output_text == "Echo: stream it" and streamed.status == "completed"
    calls = httpx.get(f"{server.base_url}/v1/topas/stats", timeout=10).json()["calls"]
    assert [c["label_source"] for c in calls if c["task_id"] == "resp-sdk"] == ["body"] * 4
