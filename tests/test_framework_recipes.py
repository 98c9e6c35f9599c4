"""The framework recipes of docs/integrations.md ("Other frameworks"), run for real where the
framework is installed (not in .venv: MetaGPT's pins exclude them; see the doc for the
throwaway-venv command), each against the embedded simulator server. The client construction
they rely on (openai clients with `http_client=`) is tested in .venv by test_httpx_labels.py."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from topas_agents import label
from topas_agents.integrations.httpx_labels import labelled_async_http_client, labelled_http_client
from topas_agents.server import ServerConfig, start_server_in_thread


@pytest.fixture(scope="module")
def server():
    handle = start_server_in_thread(ServerConfig(time_scale=200.0, policy="topas", task_idle_timeout_s=0.0))
    yield handle
    handle.stop()


def _calls(server, task_id: str) -> list[dict]:
    stats = httpx.get(f"{server.base_url}/v1/topas/stats", timeout=10).json()
    return sorted((c for c in stats["calls"] if c["task_id"] == task_id), key=lambda c: c["arrival_s"])


def _seen(server, task_id: str) -> list[tuple[str, str, str]]:
    return [(c["stage"], c["agent"], c["label_source"]) for c in _calls(server, task_id)]


async def test_langchain_chat_openai(server):
    lc = pytest.importorskip("langchain_openai")
    from langchain_core.runnables import RunnableLambda

    llm = lc.ChatOpenAI(base_url=server.url, api_key="x", model="m", max_tokens=8,
                        http_client=labelled_http_client(), http_async_client=labelled_async_http_client())
    with label(task_id="lc-task", stage="plan", agent="planner"):
        llm.invoke("plan a todo app")
    with label(task_id="lc-task", stage="code", agent="coder"):
        await llm.ainvoke("write it")
    # a sync step inside an async chain runs in an executor thread: the label must follow
    chain = RunnableLambda(lambda text: llm.invoke(text))
    with label(task_id="lc-task", stage="review", agent="reviewer"):
        await chain.ainvoke("review it")
    assert _seen(server, "lc-task") == [("plan", "planner", "body"), ("code", "coder", "body"),
                                        ("review", "reviewer", "body")]


async def test_autogen_openai_chat_completion_client(server):
    pytest.importorskip("autogen_ext.models.openai")
    from autogen_core.models import UserMessage
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    client = OpenAIChatCompletionClient(
        model="topas-sim", base_url=server.url, api_key="x", max_tokens=8,
        model_info={"vision": False, "function_calling": False, "json_output": False, "family": "unknown",
                    "structured_output": False},
        http_client=labelled_async_http_client())

    async def agent(i: int) -> None:
        with label(task_id=f"ag-{i}", stage="plan", agent=f"agent{i}"):
            await client.create([UserMessage(content="plan a todo app", source="user")])

    await asyncio.gather(agent(0), agent(1))
    assert _seen(server, "ag-0") == [("plan", "agent0", "body")]
    assert _seen(server, "ag-1") == [("plan", "agent1", "body")]


def test_litellm_openai_compatible_client(server):
    litellm = pytest.importorskip("litellm")
    from openai import OpenAI

    # CrewAI calls LiteLLM; LiteLLM's OpenAI-compatible path takes a prebuilt openai client
    client = OpenAI(base_url=server.url, api_key="x", http_client=labelled_http_client())
    with label(task_id="ll-task", stage="plan", agent="planner"):
        litellm.completion(model="openai/topas-sim", api_base=server.url, api_key="x", max_tokens=8,
                           messages=[{"role": "user", "content": "plan"}], client=client)
    assert _seen(server, "ll-task") == [("plan", "planner", "body")]


async def test_litellm_global_sessions_as_crewai_uses_them(server, monkeypatch):
    litellm = pytest.importorskip("litellm")
    # CrewAI's LLM calls litellm.completion itself: set LiteLLM's process-wide httpx clients
    monkeypatch.setattr(litellm, "client_session", labelled_http_client())
    monkeypatch.setattr(litellm, "aclient_session", labelled_async_http_client())
    with label(task_id="crew-task", stage="research", agent="researcher"):
        litellm.completion(model="openai/topas-sim", api_base=server.url, api_key="x", max_tokens=8,
                           messages=[{"role": "user", "content": "research"}])
    with label(task_id="crew-task", stage="write", agent="writer"):
        await litellm.acompletion(model="openai/topas-sim", api_base=server.url, api_key="x", max_tokens=8,
                                  messages=[{"role": "user", "content": "write"}])
    assert _seen(server, "crew-task") == [("research", "researcher", "body"), ("write", "writer", "body")]
