"""The label path through real SGLang code: OpenAI request models, the real
`_convert_to_internal_request`, `handle_request`'s HTTP 400, the batch `__getitem__` fix, and
`Scheduler._create_generation_req` putting the label on a real `Req`."""

from __future__ import annotations

import asyncio
import json
import logging
import types
from typing import Any

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.usefixtures("no_adapter")]
pytest.importorskip("sglang")

from sglang.srt.entrypoints.openai import protocol  # noqa: E402
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion  # noqa: E402
from sglang.srt.managers.io_struct import GenerateReqInput  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from starlette.requests import Request  # noqa: E402
from test_sglang_fixtures import (  # noqa: E402
    ScriptedPolicy,
    World,
    applied_hooks,
    make_adapter,
    no_adapter,  # noqa: F401 (fixture, used by marks)
    published,  # noqa: F401 (fixture, used by marks)
)

from topas_agents.labels import Label  # noqa: E402
from topas_agents.server.sglang import plugin  # noqa: E402
from topas_agents.server.sglang.labels_http import ROUTING_PREFIX, decode_routing_key, request_models  # noqa: E402

CHAT = "sglang.srt.entrypoints.openai.protocol.ChatCompletionRequest"
COMPLETION = "sglang.srt.entrypoints.openai.protocol.CompletionRequest"
LABEL = {"task_id": "t1", "stage": "s1", "agent": "a", "workflow": "chain3", "prefix_tokens": 7}


def raw_request(**headers: str) -> Request:
    pairs = [(k.lower().replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": pairs})


def serving() -> OpenAIServingCompletion:
    tm = types.SimpleNamespace(server_args=None, served_model_name="m",
                               request_logger=types.SimpleNamespace(log_requests=False, log_requests_level=0))
    return OpenAIServingCompletion(tm, types.SimpleNamespace(completion_template_name=None))


@pytest.fixture
def http_hooks() -> Any:
    scheduler = {plugin.CREATE_REQ_TARGET, plugin.PREFILL_TARGET, plugin.PRIORITY_TARGET, plugin.RETRACT_TARGET}
    specs = [s for s in plugin.hook_specs() if s[0] not in scheduler]
    adapter = make_adapter(ScriptedPolicy(), workflows=("chain3",))
    with applied_hooks(specs):
        plugin.install(adapter)
        yield adapter


def test_request_model_subclasses_keep_the_topas_field() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "topas": LABEL}
    assert not hasattr(protocol.ChatCompletionRequest.model_validate(body), "topas")  # stock drops it
    assert request_models()[CHAT].model_validate(body).topas == LABEL
    assert request_models()[COMPLETION].model_validate({"model": "m", "prompt": "x"}).topas is None


def test_body_label_reaches_the_internal_request(http_hooks: Any) -> None:
    assert protocol.CompletionRequest is request_models()[COMPLETION]  # REPLACE applied
    req = protocol.CompletionRequest(model="m", prompt="hello", max_tokens=3, topas=LABEL)
    adapted, _ = serving()._convert_to_internal_request(req, raw_request(x_topas_task_id="other"))
    assert adapted.routing_key.startswith(ROUTING_PREFIX)
    assert decode_routing_key(adapted.routing_key) == Label("t1", "s1", "a", "chain3", 7)  # body wins


def test_header_label_reaches_the_internal_request(http_hooks: Any) -> None:
    req = protocol.CompletionRequest(model="m", prompt="hello")
    headers = {"X_Topas_Task_Id": "t9", "X_Topas_Stage": "s2", "X_Topas_Agent": "b", "X_Topas_Workflow": "chain3"}
    adapted, _ = serving()._convert_to_internal_request(req, raw_request(**headers))
    assert decode_routing_key(adapted.routing_key) == Label("t9", "s2", "b", "chain3", None)
    unlabelled, _ = serving()._convert_to_internal_request(req, raw_request())
    assert unlabelled.routing_key is None


@pytest.mark.parametrize(("body", "headers", "field"), [
    ({"task_id": "t1", "stage": "s1"}, {}, "agent"),
    ({**LABEL, "prefix_tokens": -1}, {}, "prefix_tokens"),
    ({**LABEL, "colour": "red"}, {}, "colour"),
    ("not-an-object", {}, "topas"),
    (None, {"X_Topas_Task_Id": "t1", "X_Topas_Stage": "s1", "X_Topas_Agent": "a",
            "X_Topas_Prefix_Tokens": "lots"}, "prefix_tokens"),
    ({**LABEL, "stage": "s9"}, {}, "stage"),  # not a stage of the registered workflow
    ({**LABEL, "agent": "b"}, {}, "agent"),  # stage s1 of chain3 is run by agent a
])
def test_malformed_label_is_http_400_naming_the_field(http_hooks: Any, body: Any, headers: dict,
                                                      field: str) -> None:
    req = protocol.CompletionRequest(model="m", prompt="hello", topas=body)
    response = asyncio.run(serving().handle_request(req, raw_request(**headers)))
    assert response.status_code == 400
    assert f"topas label field '{field}'" in json.loads(response.body)["message"]


def test_batch_and_n_expansion_keep_the_label(http_hooks: Any) -> None:
    key = ROUTING_PREFIX + json.dumps(LABEL)
    batch = GenerateReqInput(text=["a", "b"], routing_key=key, sampling_params={"max_new_tokens": 4})
    batch.normalize_batch_and_arguments()
    parallel = GenerateReqInput(text="a", routing_key=key, sampling_params={"max_new_tokens": 4, "n": 2})
    parallel.normalize_batch_and_arguments()
    assert [batch[i].routing_key for i in range(2)] == [key, key]
    assert parallel[1].routing_key == key


def test_without_an_active_adapter_the_hooks_do_nothing(http_hooks: Any) -> None:
    plugin.uninstall()
    req = protocol.CompletionRequest(model="m", prompt="hello", topas={"bogus": 1})
    adapted, _ = serving()._convert_to_internal_request(req, raw_request())
    assert adapted.routing_key is None  # no label, and no 400 either
    batch = GenerateReqInput(text=["a", "b"], routing_key="topas1:{}", sampling_params={"max_new_tokens": 4})
    batch.normalize_batch_and_arguments()
    assert batch[0].routing_key is None  # SGLang's own behaviour: the key is dropped


@pytest.mark.usefixtures("published")
def test_label_lands_on_the_scheduler_req(http_hooks: Any, caplog: Any) -> None:
    # HTTP side: the real conversion produces the routing key ...
    req = protocol.CompletionRequest(model="m", prompt="hello", topas=LABEL)
    adapted, _ = serving()._convert_to_internal_request(req, raw_request())
    # ... which the tokenizer manager copies into TokenizedGenerateReqInput.routing_key and the
    # scheduler passes to _create_generation_req (scheduler.py:2983), hooked AFTER here.
    world = World()
    with applied_hooks([(plugin.CREATE_REQ_TARGET, plugin.after_create_req, "AFTER")]):
        made = world.sched._create_generation_req(
            None, "rid-1", "", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], SamplingParams(max_new_tokens=4),
            routing_key=adapted.routing_key)
        with caplog.at_level(logging.WARNING):
            bad = world.sched._create_generation_req(None, "rid-2", "", [1, 2], SamplingParams(),
                                                     routing_key=ROUTING_PREFIX + "{oops")
    assert type(made).__name__ == "Req" and made.topas_label == Label("t1", "s1", "a", "chain3", 7)
    book = plugin.active().book.meta
    assert (book["rid-1"].task_id, book["rid-1"].stage, book["rid-1"].agent) == ("t1", "s1", "a")
    assert plugin.active().residency.tokens("a") == 7
    assert bad.topas_label is None and book["rid-2"].task_id == "untagged-rid-2"
    assert "bad label in routing key" in caplog.text
