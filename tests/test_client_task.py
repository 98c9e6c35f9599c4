"""`task(...)` scopes: the outcome a block's exit reports, a done call that never raises, nesting
the same task, and the warning for calls that go out unlabelled inside a task."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import openai
import pytest

from topas_agents.errors import ConfigError, LabelError
from topas_agents.integrations import task as task_module
from topas_agents.integrations.httpx_labels import add_label_headers, labelled_http_client
from topas_agents.integrations.openai_client import labelled
from topas_agents.integrations.task import aclose_task, close_task, task
from topas_agents.labels import label

MSG = [{"role": "user", "content": "hi"}]
URL = "http://127.0.0.1:9/v1"  # never reached: the done call is recorded, or the transport mocked


@dataclass(frozen=True, slots=True)
class DoneCall:
    task_id: str
    failed: bool
    unlabelled_calls: int


@pytest.fixture()
def done_calls(monkeypatch) -> list[DoneCall]:
    """The done calls the task scopes send (recorded, not sent)."""
    calls: list[DoneCall] = []

    def record(base_url: str, task_id: str, api_key: str | None = None, *, failed: bool = False,
               unlabelled_calls: int = 0, **_: object) -> bool:
        calls.append(DoneCall(task_id, failed, unlabelled_calls))
        return True

    async def arecord(*args: object, **kwargs: object) -> bool:
        return record(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(task_module, "close_task", record)
    monkeypatch.setattr(task_module, "aclose_task", arecord)
    return calls


def _raise(exc: BaseException) -> Callable[[], None]:
    def go() -> None:
        raise exc
    return go


@pytest.mark.parametrize(("how", "failed"), [
    (lambda: None, False),
    (lambda: sys.exit(0), False),  # a CLI that finished its work
    (lambda: sys.exit(), False),
    (lambda: sys.exit(2), True),
    (_raise(ValueError("boom")), True),
    (_raise(KeyboardInterrupt()), True),
])
def test_the_outcome_a_block_reports(done_calls, how, failed):
    # before: sys.exit(0) inside the block reported the task failed (no JCT)
    try:
        with task("OUT", base_url=URL):
            how()
    except (SystemExit, ValueError, KeyboardInterrupt):
        pass
    assert done_calls == [DoneCall("OUT", failed, 0)]


def test_a_generator_its_consumer_stops_early_is_not_a_failed_task(done_calls):
    # before: the GeneratorExit of the consumer's early stop reported the task failed
    def steps():
        with task("GEN", base_url=URL):
            yield from range(3)

    for step in steps():
        if step == 1:
            break
    assert done_calls == [DoneCall("GEN", False, 0)]


def test_a_cancelled_or_timed_out_async_block_is_a_failed_task(done_calls):
    async def slow() -> None:
        async with task("SLOW", base_url=URL):
            await asyncio.sleep(10)

    async def main() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(slow(), 0.05)

    asyncio.run(main())
    assert done_calls == [DoneCall("SLOW", True, 0)]


@pytest.mark.parametrize("base_url", ["http://[::1/v1", "http://h\x00/v1"])
def test_a_malformed_base_url_never_replaces_the_blocks_own_error(caplog, base_url):
    # before: httpx.InvalidURL escaped the done call and replaced the block's exception
    with caplog.at_level(logging.WARNING, logger="topas.task"):
        with pytest.raises(ValueError, match="the block's own"), task("BAD", base_url=base_url):
            raise ValueError("the block's own error")
        assert close_task(base_url, "BAD") is False
    assert "task-done for BAD failed: InvalidURL" in caplog.text


def test_an_async_done_call_to_an_impossible_port_only_warns(caplog):
    # before: anyio's ExceptionGroup(OverflowError) escaped __aexit__ over the block's own error
    async def main() -> None:
        with pytest.raises(ValueError, match="the block's own"):
            async with task("PORT", base_url="http://127.0.0.1:99999/v1"):
                raise ValueError("the block's own error")
        assert await aclose_task("http://127.0.0.1:99999/v1", "PORT") is False

    with caplog.at_level(logging.WARNING, logger="topas.task"):
        asyncio.run(main())
    assert "task-done for PORT failed: OverflowError" in caplog.text  # the group's member, which says why


def test_ctrl_c_during_the_done_call_still_propagates(monkeypatch):
    def interrupted(*args: object, **kwargs: object) -> httpx.Response:
        raise KeyboardInterrupt
    monkeypatch.setattr(task_module.httpx, "post", interrupted)
    with pytest.raises(KeyboardInterrupt):
        close_task(URL, "INT")


def test_a_nested_task_of_the_same_id_is_refused_on_entry(done_calls):
    # before: the inner scope's exit sent the done call of the outer, still running task
    with task("N1", base_url=URL):
        with pytest.raises(ConfigError, match="open already in an enclosing task"), task("N1", base_url=URL):
            pass
        with task("N1-sub", base_url=URL):  # a sub-task of its own id is fine
            pass
        with task("N1", close=False):  # an inner scope that sends no done call closes nothing
            pass
    with task("N1", close=False):  # once the outer one is over, the id may be scoped again
        pass
    assert [c.task_id for c in done_calls] == ["N1-sub", "N1"]


def test_a_whitespace_only_task_id_is_named_so():
    # before: "\u2028" was refused as "must not be empty"
    for blank in ("\u2028", " "):
        with pytest.raises(LabelError, match="whitespace only"), task(task_id=blank):
            pass
    with pytest.raises(LabelError, match="must not be empty"), task(task_id=""):
        pass


def _answer(request: httpx.Request) -> httpx.Response:
    if request.url.path.endswith("/done"):
        return httpx.Response(404, json={"error": {"message": "unknown task 'U1'"}})
    return httpx.Response(200, json={
        "id": "c", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]})


def _unlabelled_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "went out unlabelled: no" in r.getMessage()]


CLIENTS = {
    "labelled": lambda: labelled(openai.OpenAI(base_url=URL, api_key="x",
                                               http_client=httpx.Client(transport=httpx.MockTransport(_answer)))),
    "transport": lambda: openai.OpenAI(base_url=URL, api_key="x", http_client=labelled_http_client(
        transport=httpx.MockTransport(_answer))),
    "hook": lambda: openai.OpenAI(base_url=URL, api_key="x", http_client=httpx.Client(
        transport=httpx.MockTransport(_answer), event_hooks={"request": [add_label_headers]})),
}


@pytest.mark.parametrize("kind", sorted(CLIENTS))
def test_calls_without_stage_and_agent_inside_a_task_warn_once_naming_the_fix(caplog, done_calls, kind):
    # before: an outer label(stage=, agent=) around task() is dropped, and its calls went out
    # unlabelled without a word
    client = CLIENTS[kind]()
    with caplog.at_level(logging.WARNING, logger="topas.task"), label(stage="plan", agent="planner"), \
            task("U1", base_url=URL):
        for _ in range(2):
            client.chat.completions.create(model="m", messages=MSG)
        client.models.with_raw_response.list()  # not an LLM call: not counted
        with label(stage="s", agent="a"):
            client.chat.completions.create(model="m", messages=MSG)  # labelled: not counted
    warnings = _unlabelled_warnings(caplog)
    assert len(warnings) == 1 and "U1" in warnings[0] and "label(stage=..., agent=...) inside the task" in warnings[0]
    assert done_calls == [DoneCall("U1", False, 2)]


def test_no_warning_outside_a_task_or_for_a_call_with_its_own_label(caplog):
    client = CLIENTS["labelled"]()
    own = {"topas": {"task_id": "U2", "stage": "s", "agent": "a"}}
    with caplog.at_level(logging.WARNING, logger="topas.task"):
        client.chat.completions.create(model="m", messages=MSG)  # no task: an unlabelled call is fine
        with task("U2", close=False):
            client.chat.completions.create(model="m", messages=MSG, extra_body=own)
    assert _unlabelled_warnings(caplog) == []


def test_the_done_calls_warning_names_unlabelled_calls_as_the_reason(caplog):
    # before: it said the calls were refused or went to another server
    rsp = _answer(httpx.Request("POST", "http://x/v1/topas/tasks/U1/done"))
    with caplog.at_level(logging.WARNING, logger="topas.task"):
        assert task_module._report("U1", rsp, None, unlabelled_calls=2) is False
    assert "2 call(s) made inside it went out unlabelled" in caplog.text
    assert "none of its calls was accepted" not in caplog.text
