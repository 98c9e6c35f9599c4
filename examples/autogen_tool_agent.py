"""An AutoGen AssistantAgent with one function tool, labelled, against a Topas server.

    topas serve --port 8123 --workflow chain3 --time-scale 50 &
    python examples/autogen_tool_agent.py --base-url http://127.0.0.1:8123/v1

Needs `autogen-agentchat` and `autogen-ext[openai]` (not project dependencies; see
docs/integrations.md, "Tool calls with AutoGen and CrewAI"). The echo responder answers the
first call with a `get_weather` call, AutoGen runs the tool, and (reflect_on_tool_use) the
second call, which carries the tool result, is answered with text: the run ends. Prints one
JSON line: the tool's invocations, the final message, and the calls the server saw for the
task (`GET /v1/topas/stats`); exits 1 if the tool did not run or a call went unlabelled.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid

import httpx
import openai

try:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_ext.models.openai import OpenAIChatCompletionClient
except ImportError as exc:  # the framework is optional: say what to install, no traceback
    sys.exit(f"this example needs AutoGen: pip install autogen-agentchat 'autogen-ext[openai]' ({exc})")

from topas_agents import label
from topas_agents.cli.args import positive_float, run_module
from topas_agents.integrations.httpx_labels import labelled_async_http_client
from topas_agents.integrations.task import task

INVOCATIONS: list[dict[str, str]] = []


async def get_weather(city: str) -> str:
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


async def main(args: argparse.Namespace) -> int:
    client = OpenAIChatCompletionClient(
        model=args.model, base_url=args.base_url, api_key="x",
        # an unknown model name: AutoGen needs to be told it can call functions
        model_info={"vision": False, "function_calling": True, "json_output": False,
                    "family": "unknown", "structured_output": False},
        http_client=labelled_async_http_client())
    agent = AssistantAgent("weather_agent", model_client=client, tools=[get_weather],
                           reflect_on_tool_use=True, model_client_stream=args.stream,
                           system_message="Answer with the weather tool.")
    task_id = f"autogen-{uuid.uuid4().hex[:8]}"
    before = calls_received(args.base_url)
    async with task(task_id=task_id, base_url=args.base_url, workflow=args.workflow):
        with label(stage=args.stage, agent=args.agent):
            result = await asyncio.wait_for(agent.run(task="What is the weather in Paris?"), args.timeout)
    await client.close()
    seen = server_calls(args.base_url, task_id)
    out = {"task_id": task_id, "invocations": INVOCATIONS, "stop_reason": result.stop_reason,
           "messages": [type(m).__name__ for m in result.messages],
           "final": str(result.messages[-1].content), "server_calls": seen}
    print(json.dumps(out))
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
    p.add_argument("--stream", action="store_true", help="stream the model's replies (SSE)")
    p.add_argument("--timeout", type=positive_float, default=120.0, help="give up after this many wall seconds")
    return p.parse_args()


def run(args: argparse.Namespace) -> int:
    """main(), with a failed run (no server at --base-url, a call it refused: say, an unknown
    --workflow) reported in one line, exit 1, not a traceback."""
    try:
        return asyncio.run(main(args))
    except (httpx.HTTPError, openai.APIError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
    except TimeoutError:
        print(f"error: the agent did not finish within --timeout {args.timeout:g} s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    run_module(lambda: run(parse_args()))  # a bad argument: one line `error: ...`, exit 2, as `topas`
