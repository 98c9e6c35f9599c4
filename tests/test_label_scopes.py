"""Label scopes as a framework author nests them: what an inner scope inherits, label values of
other types, and scopes that exit in another context (generators)."""

from __future__ import annotations

import asyncio
import contextvars
import enum
import logging

import httpx
import numpy as np
import pytest

from topas_agents.errors import ConfigError, LabelError
from topas_agents.integrations import task as task_module
from topas_agents.integrations.httpx_labels import add_label_headers
from topas_agents.integrations.task import task
from topas_agents.labels import Label, current_fields, current_label, label, label_fields


class Stage(str, enum.Enum):
    PLAN = "plan"


def test_label_is_keyword_only() -> None:
    # label("code", agent="coder") inside a task silently moved the calls to a task named "code"
    with pytest.raises(TypeError):
        label("code", agent="coder")  # type: ignore[misc]


def test_a_new_task_id_starts_afresh() -> None:
    with label(task_id="parent", workflow="wf", stage="plan", agent="planner", prefix_tokens=50):
        with label(task_id="child"):
            assert current_fields() == {"task_id": "child"}
        with label(task_id="parent", stage="code", agent="planner"):  # the same task: inherits
            assert current_fields()["workflow"] == "wf" and current_fields()["prefix_tokens"] == 50
        with task("sub", workflow="chain3", close=False), label(stage="s1"):
            assert current_fields() == {"task_id": "sub", "workflow": "chain3", "stage": "s1"}
    assert current_fields() == {}


def test_a_new_agent_does_not_inherit_the_prefix_size() -> None:
    # the coder's calls went out with the planner's 50 tokens, which fixed the coder's prefix
    # on the server for good
    with label(task_id="t", stage="plan", agent="planner", prefix_tokens=50):
        with label(stage="code", agent="coder") as lab:
            assert lab == Label("t", "code", "coder")
        with label(stage="plan2", agent="planner") as same:
            assert same == Label("t", "plan2", "planner", None, 50)


def test_a_new_workflow_does_not_inherit_the_stage() -> None:
    with label(task_id="t", workflow="a", stage="s", agent="x"), label(workflow="b") as lab:
        assert lab is None and current_fields() == {"task_id": "t", "workflow": "b", "agent": "x"}


def test_a_str_enum_is_sent_as_its_value_by_every_wrapper() -> None:
    with label(task_id="t", stage=Stage.PLAN, agent="a") as lab:  # type: ignore[arg-type]
        assert lab is not None and type(lab.stage) is str and lab.stage == "plan"
        request = httpx.Request("POST", "http://x/v1/chat/completions", json={"model": "m", "messages": []})
        add_label_headers(request)
        assert request.headers["X-Topas-Stage"] == "plan"  # was "Stage.PLAN": a 400 for an unknown stage


def test_an_integer_type_is_accepted_and_a_float_is_named() -> None:
    fields = label_fields({"task_id": "t", "stage": "s", "agent": "a", "prefix_tokens": np.int64(5)})
    assert fields["prefix_tokens"] == 5 and type(fields["prefix_tokens"]) is int
    with pytest.raises(LabelError, match="got 5.0 \\(float\\)"):
        label_fields({"task_id": "t", "stage": "s", "agent": "a", "prefix_tokens": 5.0})


def test_a_label_exited_in_another_context_does_not_raise() -> None:
    # a sync generator stepped through copy_context().run (what Starlette/anyio do to stream
    # one): its label exits in a context that did not enter it
    def steps():
        with label(task_id="g", stage="s", agent="a"):
            yield current_label()
            yield current_label()

    gen = steps()
    first = contextvars.copy_context().run(next, gen)
    assert first == Label("g", "s", "a")
    contextvars.copy_context().run(gen.close)  # raised ValueError ("created in a different Context")
    assert current_fields() == {}


def test_an_inner_block_still_open_keeps_its_label_when_an_outer_one_exits() -> None:
    def out_of_order() -> dict:
        outer, inner = label(task_id="gen", stage="s", agent="a"), label(task_id="consumer", stage="c", agent="b")
        outer.__enter__()
        inner.__enter__()
        outer.__exit__(None, None, None)  # a generator's scope, closed while its consumer's is open
        fields = current_fields()
        inner.__exit__(None, None, None)
        return fields

    # in a context of its own: after an out-of-order exit the outer label stays in force
    assert contextvars.copy_context().run(out_of_order)["task_id"] == "consumer"


async def test_a_task_scope_in_an_abandoned_async_generator_still_sends_its_done_call(monkeypatch) -> None:
    closed: list[str] = []

    async def record(base_url: str, task_id: str, api_key: str | None = None, **_: object) -> bool:
        closed.append(task_id)
        return True

    monkeypatch.setattr(task_module, "aclose_task", record)

    async def agen():
        async with task("K3", base_url="http://127.0.0.1:9/v1"):
            with label(stage="s", agent="a"):
                yield 1
                yield 2

    errors: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))

    async def consume() -> None:
        async for _ in agen():
            break  # the loop's finaliser closes the generator later, from a task of its own

    await asyncio.create_task(consume())
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert closed == ["K3"] and not errors  # the done call was lost to a ValueError


def test_a_closed_task_scope_cannot_be_entered_again(monkeypatch) -> None:
    monkeypatch.setattr(task_module, "close_task", lambda *a, **k: True)
    t = task("RE1", base_url="http://127.0.0.1:9/v1")
    with t:
        pass
    with pytest.raises(ConfigError, match="was closed when its scope ended"), t:
        pass
    quiet = task("RE2", close=False)  # no done call: the server task stays open, re-entry is fine
    with quiet:
        pass
    with quiet:
        assert current_fields()["task_id"] == "RE2"


@pytest.mark.parametrize(("status", "body", "says"), [
    (404, {"error": {"message": "unknown task 'F1'", "type": "invalid_request_error"}}, "none of its calls was accepted"),
    (404, {"detail": "Not Found"}, "an SGLang server with the Topas plugin has none"),
])
def test_a_done_call_that_finds_nothing_says_why(caplog, status: int, body: dict, says: str) -> None:
    rsp = httpx.Response(status, json=body, request=httpx.Request("POST", "http://x/v1/topas/tasks/F1/done"))
    with caplog.at_level(logging.WARNING, logger="topas.task"):
        assert task_module._report("F1", rsp, None) is False
    assert says in caplog.text
