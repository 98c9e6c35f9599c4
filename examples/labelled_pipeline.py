"""A custom three-agent pipeline (planner -> coder -> reviewer) labelled for Topas, using the
plain `openai` client against the embedded OpenAI-compatible simulator.

    python examples/labelled_pipeline.py [--tasks 3] [--time-scale 50]

What it shows:
- describe the workflow (stages, agents, static prefix sizes) and register it with the server;
- wrap the client once (`labelled(...)`) and mark each call with `label(task_id=..., stage=..., agent=...)`;
- keep each agent's static text first (system message) and the task's dynamic text last, so
  the agent prefix is shared by every task;
- tell the server when a task is done; read per-task JCT and per-call labels from its stats.
"""

from __future__ import annotations

import argparse
import asyncio

import httpx
import openai

from topas_agents import label
from topas_agents.cli.args import positive_int, run_module
from topas_agents.integrations.metagpt.server_api import embedded_server, register_workflow, server_root
from topas_agents.integrations.openai_client import labelled
from topas_agents.server.tokens import message_tokens
from topas_agents.workflow import parse_workflow

# Each agent's static text: identical for every task, so it goes first (the cacheable prefix).
SYSTEM = {
    "planner": "You are the planner. Break the user's request into at most five concrete steps. "
               "Number the steps. Name the files to write. Do not write code.",
    "coder": "You are the coder. Write the code for the plan you are given, one fenced python block per "
             "file, with docstrings and type hints. Do not change the plan.",
    "reviewer": "You are the reviewer. Check the code against the plan. Answer LGTM if it is complete, "
                "else list the problems, one per line.",
}

WORKFLOW = parse_workflow({
    "name": "example-pipeline",
    # prefix sizes with the server's approximate tokenizer (what it would count for the system message)
    "agents": [{"name": a, "prefix_tokens": message_tokens(text)} for a, text in SYSTEM.items()],
    "stages": [
        {"name": "plan", "agent": "planner", "after": [], "input_tokens": [20, 80], "output_tokens": [100, 200]},
        {"name": "code", "agent": "coder", "after": ["plan"], "input_tokens": [100, 300],
         "output_tokens": [200, 400]},
        {"name": "review", "agent": "reviewer", "after": ["code"], "input_tokens": [200, 500],
         "output_tokens": [50, 120]},
    ],
})


async def run_task(client: labelled, task_id: str, request: str) -> str:
    text = request
    for stage in WORKFLOW.stages:
        with label(task_id=task_id, stage=stage.name, agent=stage.agent, workflow=WORKFLOW.name):
            rsp = await client.chat.completions.create(
                model="topas-sim",
                messages=[{"role": "system", "content": SYSTEM[stage.agent]},  # static first
                          {"role": "user", "content": text}])  # dynamic last
        text = rsp.choices[0].message.content or ""
    return text


async def main_async(base_url: str, n_tasks: int) -> dict:
    client = labelled(openai.AsyncOpenAI(base_url=base_url, api_key="sk-local"))
    requests = [f"Write a command line tool number {i} that counts words in a file." for i in range(n_tasks)]
    ids = [f"pipe-{i}" for i in range(n_tasks)]
    await asyncio.gather(*(run_task(client, t, r) for t, r in zip(ids, requests, strict=True)))
    async with httpx.AsyncClient() as http:
        for t in ids:  # the task's JCT ends at its last call
            (await http.post(f"{server_root(base_url)}/v1/topas/tasks/{t}/done")).raise_for_status()
        stats = (await http.get(f"{server_root(base_url)}/v1/topas/stats")).json()
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=positive_int, default=3)
    ap.add_argument("--time-scale", type=float, default=50.0, help="simulated seconds per wall second")
    args = ap.parse_args()
    with embedded_server(policy="topas", time_scale=args.time_scale) as server:
        register_workflow(server.url, WORKFLOW)
        stats = asyncio.run(main_async(server.url, args.tasks))
    for task in stats["tasks"]["items"]:
        print(f"{task['task_id']}: JCT {task['jct_s']:.1f} simulated s, stages "
              f"{ {k: v['calls'] for k, v in task['stages'].items()} }")
    for c in stats["calls"]:
        print(f"  call {c['task_id']:<7} {c['stage']:<7} {c['agent']:<9} label from {c['label_source']}, "
              f"prefix {c['prefix_tokens']} + input {c['input_tokens']} tokens")


if __name__ == "__main__":
    run_module(main)  # a bad argument: one line `error: ...`, exit 2, as `topas`
