"""Labelled workflow tasks against any OpenAI-compatible chat endpoint (SGLang, vLLM, ...).

A task walks its workflow DAG: a stage starts when its predecessors are done and issues its
rounds one after another. Every call is a chat completion whose system message is the
agent's static prompt (the shared prefix) and whose body carries the Topas label plus
`ignore_eos` with a fixed `max_tokens`, so output lengths are exact even with random
weights. Job completion time (JCT) is measured at the client, from the task's first call
to its last answer. Only httpx is used, so the OpenAI SDK version does not matter.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ..errors import ConfigError
from ..integrations.task import NO_WORKFLOW_UPLOADS, auth_headers, post_workflow, refused_key_message
from ..labels import Label
from ..workflow import Workflow

WORDS = ("plan", "design", "code", "review", "test", "module", "interface", "data", "user", "system",
         "agent", "task", "stage", "value", "error", "result", "function", "class", "queue", "cache")


def first_model_id(base_url: str, api_key: str | None = None, timeout_s: float = 30.0) -> str:
    """The server's first `/models` id; ConfigError (one line, exit 2) when the server cannot
    be reached, refuses the key, or does not list a model the OpenAI way (a URL that is not
    the OpenAI base), before any measuring or task starts. `topas bench --server` and `topas
    calibrate` use it, and `topas run`/`eval` before MetaGPT's first call."""
    base_url = base_url.rstrip("/")
    try:
        r = httpx.get(f"{base_url}/models", headers=auth_headers(api_key), timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot reach the server at {base_url}: {type(exc).__name__}: {exc}") from None
    if r.status_code in (401, 403):
        raise ConfigError(refused_key_message(base_url, api_key, r.status_code))
    try:
        return str(r.json()["data"][0]["id"])
    except (ValueError, LookupError, TypeError):
        raise ConfigError(f"{base_url}/models (HTTP {r.status_code}) lists no model: give the server's OpenAI "
                          "base URL (it ends in /v1), or --model") from None


class CallFailed(RuntimeError):
    """A bench call the server answered with an error: which call (`task/stage#round`), and why."""

    def __init__(self, call: str, reason: str) -> None:
        super().__init__(f"{call}: {reason}")
        self.call = call
        self.reason = reason


def register_workload(base_url: str, definition: dict[str, Any], api_key: str | None = None) -> str | None:
    """Register the bench's workflow (`definition`, a workflow mapping) with the server first: a
    Topas server that holds any workflow checks every label against them, so the bench's calls
    were all 400 "unknown workflow" after another client (`topas run`, say) had registered one.
    None when registered or when the server has no workflow endpoint (plain SGLang/vLLM: it does
    not check labels; SGLang with the plugin, alone or behind `topas serve --replicas`, takes
    workflows at start only); a note for stderr
    when it holds another definition under the name; ConfigError for any other refusal."""
    name = definition.get("name")
    try:
        r = post_workflow(base_url, definition, api_key, 30.0)
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot reach the server at {base_url}: {type(exc).__name__}: {exc}") from None
    if r.status_code in (200, 201) or r.status_code in NO_WORKFLOW_UPLOADS:
        return None
    if r.status_code == 409:
        return (f"the server holds another definition of workflow '{name}': the bench's calls are labelled "
                f"with that name and scheduled by its definition")
    raise ConfigError(f"the server refused the bench's workflow '{name}' (HTTP {r.status_code}): {r.text[:300]}")


@dataclass(frozen=True, slots=True)
class Call:
    task_id: str
    stage: str
    agent: str
    round: int
    system: str
    user: str
    label: Label
    max_tokens: int
    # Exact output length either way. ignore_eos: SGLang reserves the full output at admission;
    # min_tokens (= max_tokens): it estimates, as for real traffic, and may run out of KV in decode.
    ignore_eos: bool = True


@dataclass(frozen=True, slots=True)
class CallResult:
    task_id: str
    stage: str
    round: int
    start_s: float
    end_s: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens (--enable-cache-report)
    expected_tokens: int


@dataclass(frozen=True, slots=True)
class TaskResult:
    task_id: str
    arrival_s: float  # when the task's first call was sent (client clock)
    jct_s: float
    calls: tuple[CallResult, ...]


def words(n: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n)))


def agent_prompt(workflow: str, agent: str, n_words: int) -> str:
    """The agent's static system prompt: identical across tasks (its shared prefix)."""
    rng = random.Random(f"{workflow}/{agent}")
    return f"You are agent {agent} of workflow {workflow}. " + words(n_words, rng)


def plan_task(wf: Workflow, task_id: str, *, prefix_words: Callable[[str], int], input_words: int,
              output_tokens: Callable[[str], int], prefix_tokens: Callable[[str], int | None],
              seed: int = 0, ignore_eos: bool = True) -> dict[str, list[Call]]:
    """stage -> its calls (`requests` lower bound rounds), all labelled."""
    rng = random.Random(f"{seed}/{task_id}")
    plan: dict[str, list[Call]] = {}
    for name in wf.topo_order:
        st = wf.stage(name)
        system = agent_prompt(wf.name, st.agent, prefix_words(st.agent))
        label = Label(task_id, name, st.agent, wf.name, prefix_tokens(system))
        plan[name] = [Call(task_id, name, st.agent, i, system,
                           f"Task {task_id}, stage {name}, round {i}: " + words(input_words, rng),
                           label, output_tokens(name), ignore_eos)
                      for i in range(st.requests.lo)]
    return plan


def chat_body(model: str, call: Call) -> dict[str, Any]:
    length = {"ignore_eos": True} if call.ignore_eos else {"min_tokens": call.max_tokens}
    return {"model": model, "max_tokens": call.max_tokens, "temperature": 0.0, **length,
            "messages": [{"role": "system", "content": call.system}, {"role": "user", "content": call.user}],
            "topas": call.label.to_body()}


async def chat(client: httpx.AsyncClient, base_url: str, model: str, call: Call, t0: float) -> CallResult:
    start = time.monotonic() - t0
    resp = await client.post(f"{base_url}/chat/completions", json=chat_body(model, call))
    if resp.status_code != 200:
        raise CallFailed(f"{call.task_id}/{call.stage}#{call.round}", f"HTTP {resp.status_code}: {resp.text[:300]}")
    usage = resp.json().get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return CallResult(call.task_id, call.stage, call.round, start, time.monotonic() - t0,
                      int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)),
                      details.get("cached_tokens"), call.max_tokens)


async def run_task(client: httpx.AsyncClient, base_url: str, model: str, wf: Workflow,
                   plan: dict[str, list[Call]], t0: float, delay_s: float = 0.0) -> TaskResult:
    if delay_s > 0:
        await asyncio.sleep(delay_s)
    start = time.monotonic() - t0
    done = {name: asyncio.Event() for name in plan}
    results: list[CallResult] = []

    async def stage(name: str) -> None:
        for dep in wf.stage(name).after:
            await done[dep].wait()
        for call in plan[name]:
            results.append(await chat(client, base_url, model, call, t0))
        done[name].set()

    await asyncio.gather(*(stage(name) for name in plan))
    end = max(r.end_s for r in results)
    task_id = next(iter(plan.values()))[0].task_id
    return TaskResult(task_id, start, end - start, tuple(sorted(results, key=lambda r: r.start_s)))


async def run_tasks(base_url: str, model: str, wf: Workflow, plans: Sequence[dict[str, list[Call]]],
                    delays: Sequence[float] | None = None, timeout_s: float = 600.0,
                    return_exceptions: bool = False, api_key: str | None = None) -> list[Any]:
    """Run the tasks concurrently (task i starts after delays[i] seconds); with
    `return_exceptions` a failed task is its exception instead of failing the run."""
    delays = list(delays) if delays is not None else [0.0] * len(plans)
    limits = httpx.Limits(max_connections=max(16, 4 * len(plans)))
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, headers=auth_headers(api_key)) as client:
        t0 = time.monotonic()
        coros = (run_task(client, base_url, model, wf, p, t0, d) for p, d in zip(plans, delays, strict=True))
        return list(await asyncio.wait_for(asyncio.gather(*coros, return_exceptions=return_exceptions),
                                           timeout_s))
