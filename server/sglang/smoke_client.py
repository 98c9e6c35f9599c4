"""Smoke client: run N concurrent workflow tasks against a Topas-labelled OpenAI server.

    python -m topas_agents.server.sglang.smoke_client --base-url http://127.0.0.1:30000/v1 \\
        --workflow chain3 --tasks 2 [--model-dir DIR] [--out result.json]

Each task walks its workflow DAG: a stage starts when its predecessors are done and issues
its rounds sequentially (`requests`' lower bound); every call is a chat completion whose
system message is the agent's static prompt (its prefix) and whose `extra_body` carries the
Topas label plus `ignore_eos` (random-weight models stop at random otherwise). Prints each
task's job completion time; exits 1 if any call fails or the run exceeds --timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

from ...labels import Label
from ...realbench.client import WORDS as _WORDS
from ...workflow import Workflow, load_workflow


@dataclass(frozen=True, slots=True)
class Call:
    task_id: str
    stage: str
    agent: str
    round: int
    messages: tuple[dict[str, str], ...]
    label: Label
    max_tokens: int


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="smoke_client", description=__doc__.splitlines()[0])
    p.add_argument("--base-url", required=True, help="OpenAI base URL, e.g. http://127.0.0.1:30000/v1")
    p.add_argument("--model", default=None, help="model id (default: the server's first /v1/models entry)")
    p.add_argument("--model-dir", default=None, help="local tokenizer dir: labels get exact prefix_tokens")
    p.add_argument("--workflow", default="chain3", help="built-in workflow name or YAML path")
    p.add_argument("--tasks", type=int, default=2, help="concurrent tasks")
    p.add_argument("--max-tokens", type=int, default=32, help="cap on each call's output tokens")
    p.add_argument("--scale", type=float, default=0.25,
                   help="prompt sizes as a fraction of the workflow's token counts (0 < s <= 1)")
    p.add_argument("--timeout", type=float, default=300.0, help="whole-run limit in seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the per-task results as JSON here")
    args = p.parse_args(argv)
    if args.tasks < 1:
        p.error("--tasks must be >= 1")
    if args.max_tokens < 1:
        p.error("--max-tokens must be >= 1")
    if not 0 < args.scale <= 1:
        p.error("--scale must be in (0, 1]")
    if not args.timeout > 0:
        p.error("--timeout must be > 0")
    if not args.base_url.startswith(("http://", "https://")):
        p.error("--base-url must be an http(s) URL")
    return args


def words(n: int, rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, n)))


def agent_prompt(wf: Workflow, agent: str, scale: float) -> str:
    """The agent's static system prompt: identical across tasks (its shared prefix)."""
    rng = random.Random(f"{wf.name}/{agent}")
    return f"You are agent {agent} of workflow {wf.name}. " + words(int(wf.prefix_tokens(agent) * scale), rng)


def prefix_tokens(tokenizer: Any, system: str) -> int | None:
    if tokenizer is None:
        return None
    ids = tokenizer.apply_chat_template([{"role": "system", "content": system}], tokenize=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5 returns a BatchEncoding


def plan_calls(wf: Workflow, task_id: str, args: argparse.Namespace, tokenizer: Any = None) -> dict[str, list[Call]]:
    """stage -> its calls (rounds), all labelled; sizes scaled, outputs capped."""
    rng = random.Random(f"{args.seed}/{task_id}")
    plan: dict[str, list[Call]] = {}
    for name in wf.topo_order:
        st = wf.stage(name)
        system = agent_prompt(wf, st.agent, args.scale)
        label = Label(task_id, name, st.agent, wf.name, prefix_tokens(tokenizer, system))
        plan[name] = [
            Call(task_id, name, st.agent, i,
                 ({"role": "system", "content": system},
                  {"role": "user", "content": f"Task {task_id}, stage {name}, round {i}: "
                                              + words(int(st.input_tokens.lo * args.scale), rng)}),
                 label, min(st.output_tokens.lo, args.max_tokens))
            for i in range(st.requests.lo)
        ]
    return plan


async def run_task(client: Any, model: str, wf: Workflow, plan: dict[str, list[Call]]) -> dict[str, Any]:
    start = time.monotonic()
    calls: list[dict[str, Any]] = []
    done: dict[str, asyncio.Event] = {name: asyncio.Event() for name in plan}

    async def stage(name: str) -> None:
        for dep in wf.stage(name).after:
            await done[dep].wait()
        for call in plan[name]:
            t0 = time.monotonic()
            resp = await client.chat.completions.create(
                model=model, messages=list(call.messages), max_tokens=call.max_tokens, temperature=0.0,
                extra_body={"topas": call.label.to_body(), "ignore_eos": True})
            calls.append({"stage": name, "round": call.round, "latency_s": time.monotonic() - t0,
                          "completion_tokens": resp.usage.completion_tokens if resp.usage else None})
        done[name].set()

    await asyncio.gather(*(stage(name) for name in plan))
    task_id = next(iter(plan.values()))[0].task_id
    return {"task_id": task_id, "jct_s": time.monotonic() - start, "calls": calls}


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import openai

    wf = load_workflow(args.workflow)
    tokenizer = None
    if args.model_dir:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key="EMPTY", timeout=args.timeout, max_retries=0)
    model = args.model or (await client.models.list()).data[0].id
    plans = [plan_calls(wf, f"task{i}", args, tokenizer) for i in range(args.tasks)]
    return list(await asyncio.wait_for(asyncio.gather(*(run_task(client, model, wf, p) for p in plans)),
                                       args.timeout))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        results = asyncio.run(run(args))
    except Exception as exc:  # one line for the smoke log, non-zero exit
        print(f"smoke_client: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    for r in results:
        print(f"task {r['task_id']}: JCT {r['jct_s']:.3f} s over {len(r['calls'])} calls")
    print(f"mean JCT {sum(r['jct_s'] for r in results) / len(results):.3f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
