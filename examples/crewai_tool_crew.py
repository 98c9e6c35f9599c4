"""A one-task CrewAI crew whose agent has one tool, labelled, against a Topas server.

    topas serve --port 8123 --workflow chain3 --time-scale 50 &
    python examples/crewai_tool_crew.py --base-url http://127.0.0.1:8123/v1

Needs `crewai` (not a project dependency; see docs/integrations.md, "Tool calls with AutoGen
and CrewAI"). CrewAI 1.x calls `openai/...` models through its own native OpenAI provider
(LiteLLM only when installed and asked for); its `interceptor=` hook sees every raw httpx
request, sync and async, so `TopasLabels` below labels them. The echo responder answers the
first call with a `get_weather` call (CrewAI uses native function calling for OpenAI models),
CrewAI runs the tool, and the next call, which carries the tool result, gets text: the crew
ends. Prints one JSON line: the tool's invocations, the crew's output and the calls the
server saw for the task; exits 1 if the tool did not run or a call went unlabelled.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid

import httpx
import openai

# CrewAI sends anonymous telemetry by default; keep this example local (set before import)
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM fetches it from GitHub at import

try:
    from crewai import LLM, Agent, Crew, Task
    from crewai.llms.hooks.base import BaseInterceptor
    from crewai.tools import tool
except ImportError as exc:  # the framework is optional: say what to install, no traceback
    sys.exit(f"this example needs CrewAI: pip install crewai ({exc})")

from topas_agents import label
from topas_agents.cli.args import positive_int, run_module
from topas_agents.integrations.httpx_labels import label_request
from topas_agents.integrations.task import task

INVOCATIONS: list[dict[str, str]] = []


class TopasLabels(BaseInterceptor[httpx.Request, httpx.Response]):
    """Adds the label in force (headers + `topas` body field) to each request CrewAI sends.
    `stage`/`agent` given here override the context's: one interceptor per agent's LLM labels
    each agent's calls (CrewAI runs its agents' turns itself, so no caller `label` block can)."""

    def __init__(self, stage: str | None = None, agent: str | None = None) -> None:
        self.fields = {"stage": stage, "agent": agent}

    def _label(self, message: httpx.Request) -> httpx.Request:
        with label(**self.fields) as lab:  # merged with the caller's (task_id, workflow, ...)
            return label_request(message, lab)

    def on_outbound(self, message: httpx.Request) -> httpx.Request:
        message.read()  # label_request rewrites the JSON body
        return self._label(message)

    def on_inbound(self, message: httpx.Response) -> httpx.Response:
        return message

    async def aon_outbound(self, message: httpx.Request) -> httpx.Request:
        await message.aread()
        return self._label(message)

    async def aon_inbound(self, message: httpx.Response) -> httpx.Response:
        return message


@tool("get_weather")
def get_weather(city: str) -> str:
    """Current weather in a city."""
    INVOCATIONS.append({"city": city})
    return f"Sunny, 21 C in {city}"


def server_stats(base_url: str) -> dict:
    rsp = httpx.get(f"{base_url.rstrip('/')}/topas/stats", timeout=10)
    return rsp.raise_for_status().json()  # a refusal is an error, not a body without the counts


def calls_received(base_url: str) -> int:
    """Every call the server has taken: an unlabelled call gets an id of its own, so it is
    missing from the task's calls and is seen only here (run against a server of your own)."""
    return sum(server_stats(base_url)["requests"]["calls_by_status"].values())


def server_calls(base_url: str, task_id: str) -> list[dict]:
    calls = [c for c in server_stats(base_url)["calls"] if c["task_id"] == task_id]
    return [{k: c.get(k) for k in ("stage", "agent", "workflow", "label_source")}
            for c in sorted(calls, key=lambda c: c["arrival_s"])]


def main(args: argparse.Namespace) -> int:
    if args.litellm:  # LiteLLM's OpenAI-compatible path: it sends with these process-wide clients
        import litellm

        from topas_agents.integrations.httpx_labels import labelled_async_http_client, labelled_http_client

        litellm.client_session = labelled_http_client()
        litellm.aclient_session = labelled_async_http_client()
        if not args.react:  # LiteLLM does not know the model: without this CrewAI sends no `tools`
            litellm.register_model({f"openai/{args.model}": {
                "litellm_provider": "openai", "mode": "chat", "supports_function_calling": True}})
        llm = LLM(model=f"openai/{args.model}", base_url=args.base_url, api_key="x", is_litellm=True,
                  stream=args.stream)
    else:
        llm = LLM(model=f"openai/{args.model}", base_url=args.base_url, api_key="x",
                  interceptor=TopasLabels(), stream=args.stream)
    agent = Agent(role="Weather reporter", goal="Report the weather using the get_weather tool",
                  backstory="You answer weather questions with the tool.", tools=[get_weather],
                  llm=llm, max_iter=args.max_iter, verbose=False)
    job = Task(description="What is the weather in Paris?", expected_output="One sentence on the weather.",
               agent=agent)
    task_id = f"crewai-{uuid.uuid4().hex[:8]}"
    before = calls_received(args.base_url)
    with task(task_id=task_id, base_url=args.base_url, workflow=args.workflow), \
            label(stage=args.stage, agent=args.agent):
        output = Crew(agents=[agent], tasks=[job], verbose=False).kickoff()
    seen = server_calls(args.base_url, task_id)
    print(json.dumps({"task_id": task_id, "invocations": INVOCATIONS, "final": str(output.raw),
                      "server_calls": seen}))
    labelled = all(c["label_source"] != "none" and c["stage"] == args.stage for c in seen)
    others = calls_received(args.base_url) - before - len(seen)  # unlabelled calls (or another client's)
    if others:
        print(f"{others} call(s) reached the server outside task {task_id}: unlabelled", file=sys.stderr)
    return 0 if INVOCATIONS and seen and labelled and not others else 1


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8123/v1")
    p.add_argument("--model", default="topas-sim")
    p.add_argument("--workflow", default="chain3", help="a workflow the server knows (its stage/agent below)")
    p.add_argument("--stage", default="s1")
    p.add_argument("--agent", default="a")
    p.add_argument("--litellm", action="store_true",
                   help="call the model through LiteLLM (pip install 'crewai[litellm]')")
    p.add_argument("--react", action="store_true",
                   help="with --litellm: skip register_model (CrewAI then prompts for ReAct text, no tool call)")
    p.add_argument("--stream", action="store_true", help="stream the model's replies (SSE)")
    p.add_argument("--max-iter", type=positive_int, default=5, help="CrewAI's cap on the agent's LLM turns")
    return p.parse_args()


def run(args: argparse.Namespace) -> int:
    """main(), with a failed run (no server at --base-url, a call it refused: say, an unknown
    --workflow) reported in one line, exit 1, not a traceback."""
    try:
        return main(args)
    except (httpx.HTTPError, openai.APIError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    run_module(lambda: run(parse_args()))  # a bad argument: one line `error: ...`, exit 2, as `topas`
