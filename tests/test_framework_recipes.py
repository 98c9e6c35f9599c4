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


# ---------------------------------------------------------------------- tool calls (echo responder)

def _weather_tool_log() -> tuple[list[str], object]:
    seen: list[str] = []

    def get_weather(city: str) -> str:
        """Current weather in a city."""
        seen.append(city)
        return f"Sunny in {city}"
    return seen, get_weather


async def test_autogen_assistant_agent_runs_a_tool_and_ends(server):
    pytest.importorskip("autogen_agentchat")
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.messages import ToolCallExecutionEvent, ToolCallRequestEvent
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    seen, get_weather = _weather_tool_log()
    client = OpenAIChatCompletionClient(
        model="topas-sim", base_url=server.url, api_key="x",
        model_info={"vision": False, "function_calling": True, "json_output": False, "family": "unknown",
                    "structured_output": False},
        http_client=labelled_async_http_client())
    for stream in (False, True):
        agent = AssistantAgent("weather", model_client=client, tools=[get_weather], reflect_on_tool_use=True,
                               model_client_stream=stream)
        with label(task_id=f"ag-tool-{stream}", stage="plan", agent="weather"):
            result = await asyncio.wait_for(agent.run(task="What is the weather in Paris?"), 60)
        kinds = [type(m) for m in result.messages]
        assert ToolCallRequestEvent in kinds and ToolCallExecutionEvent in kinds
        assert result.messages[-1].content.startswith("Echo: tool result: Sunny in ")
        assert _seen(server, f"ag-tool-{stream}") == [("plan", "weather", "body")] * 2
    assert seen == ["example", "example"]  # the schema's placeholder string, once per run
    await client.close()


def _crew_labels(stage: str | None = None, agent: str | None = None):
    from crewai.llms.hooks.base import BaseInterceptor

    from topas_agents.integrations.httpx_labels import label_request

    class TopasLabels(BaseInterceptor[httpx.Request, httpx.Response]):  # as in examples/crewai_tool_crew.py
        def _label(self, message):
            with label(stage=stage, agent=agent) as lab:
                return label_request(message, lab)

        def on_outbound(self, message):
            message.read()
            return self._label(message)

        def on_inbound(self, message):
            return message

        async def aon_outbound(self, message):
            await message.aread()
            return self._label(message)

        async def aon_inbound(self, message):
            return message
    return TopasLabels()


@pytest.mark.parametrize("path", ["native", "litellm"])
def test_crewai_agent_runs_a_tool_and_ends(server, monkeypatch, path):
    monkeypatch.setenv("CREWAI_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    crewai = pytest.importorskip("crewai")
    from crewai.tools import tool

    if path == "litellm":
        litellm = pytest.importorskip("litellm")
        monkeypatch.setattr(litellm, "client_session", labelled_http_client())
        monkeypatch.setattr(litellm, "aclient_session", labelled_async_http_client())
        # unknown to LiteLLM's model map: CrewAI would prompt for ReAct text and send no `tools`
        monkeypatch.setattr(litellm, "model_cost", dict(litellm.model_cost))  # restored after the test
        litellm.register_model({"openai/topas-sim": {"litellm_provider": "openai", "mode": "chat",
                                                     "supports_function_calling": True}})
        llm = crewai.LLM(model="openai/topas-sim", base_url=server.url, api_key="x", is_litellm=True)
    else:
        llm = crewai.LLM(model="openai/topas-sim", base_url=server.url, api_key="x",
                         interceptor=_crew_labels())
    seen, get_weather = _weather_tool_log()
    agent = crewai.Agent(role="Weather reporter", goal="Report the weather", backstory="Uses the tool.",
                         tools=[tool("get_weather")(get_weather)], llm=llm, max_iter=5)
    job = crewai.Task(description="What is the weather in Paris?", expected_output="One sentence.", agent=agent)
    with label(task_id=f"crew-tool-{path}", stage="research", agent="reporter"):
        out = crewai.Crew(agents=[agent], tasks=[job]).kickoff()
    assert seen == ["example"] and out.raw.startswith("Echo: tool result: Sunny in example")
    assert _seen(server, f"crew-tool-{path}") == [("research", "reporter", "body")] * 2


async def test_crewai_per_agent_stages_from_each_llms_interceptor(server, monkeypatch):
    monkeypatch.setenv("CREWAI_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    crewai = pytest.importorskip("crewai")

    def member(stage: str, name: str) -> object:
        llm = crewai.LLM(model="openai/topas-sim", base_url=server.url, api_key="x",
                         interceptor=_crew_labels(stage=stage, agent=name))
        return crewai.Agent(role=name, goal=stage, backstory="-", llm=llm, max_iter=2)

    researcher, writer = member("research", "researcher"), member("write", "writer")
    jobs = [crewai.Task(description="Research todo apps.", expected_output="notes", agent=researcher),
            crewai.Task(description="Write it up.", expected_output="a paragraph", agent=writer)]
    with label(task_id="crew-two"):  # the task id from the caller, stage/agent from each agent's LLM
        await crewai.Crew(agents=[researcher, writer], tasks=jobs).kickoff_async()
    assert _seen(server, "crew-two") == [("research", "researcher", "body"), ("write", "writer", "body")]


def _agents_sdk_model(server, stage: str, agent: str, api: str):
    """An OpenAI Agents SDK model on the Responses API (the SDK's default) or on chat
    completions, with a client of its own that fixes the agent's stage and agent."""
    import openai
    from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel

    http = labelled_async_http_client(stage=stage, agent=agent)
    client = openai.AsyncOpenAI(base_url=server.url, api_key="x", http_client=http)
    model = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    return model(model="topas-sim", openai_client=client)


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("streamed", [False, True])
async def test_openai_agents_sdk_tool_and_handoff_label_each_agent(server, streamed, api):
    pytest.importorskip("agents.models.openai_chatcompletions")
    from agents import Agent, Runner, function_tool, set_tracing_disabled

    from topas_agents.integrations.task import task

    set_tracing_disabled(True)  # the SDK's tracing exports to OpenAI's servers
    seen, get_weather = _weather_tool_log()
    writer = Agent(name="writer", instructions="Write one sentence.",
                   model=_agents_sdk_model(server, "write", "writer", api))
    researcher = Agent(name="researcher", instructions="Find the weather, then hand off.",
                       tools=[function_tool(get_weather)], handoffs=[writer],
                       model=_agents_sdk_model(server, "research", "researcher", api))
    tid = f"oa-agents-{api}-{streamed}"
    async with task(task_id=tid, base_url=server.url):
        # the echo responder calls the tool the message names: first the function, then the handoff
        ask = "What is the weather in Paris? Use get_weather."
        if streamed:
            run = Runner.run_streamed(researcher, ask, max_turns=4)
            async for _ in run.stream_events():
                pass
        else:
            run = await Runner.run(researcher, ask, max_turns=4)
        assert run.final_output.startswith("Echo: tool result: Sunny in ")
        handed = await Runner.run(researcher, "Done: transfer_to_writer.", max_turns=4)
        assert handed.last_agent is writer
    assert seen == ["example"]
    assert _seen(server, tid) == [("research", "researcher", "body")] * 3 + [("write", "writer", "body")]
    stats = httpx.get(f"{server.base_url}/v1/topas/stats", timeout=10).json()
    assert next(t for t in stats["tasks"]["items"] if t["task_id"] == tid)["done_reason"] == "explicit"
