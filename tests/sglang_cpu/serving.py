"""Start a real SGLang server with the Topas plugin for the tests, on CPU or a GPU.

`start_server(...)` runs the product's launcher (`topas serve --engine sglang`, i.e.
`launch.build_config` / `build_command` / `build_env`) exactly as a user would, with:
- the tiny random-weight model (`make_tiny_model`, `--load-format dummy`);
- on a machine without CUDA: `--device cpu`, `SGLANG_USE_CPU_ENGINE=1` and the `sgl_kernel`
  stand-in first on PYTHONPATH (kernel_stand_in/, see its docstring for why). Nothing of
  this is in the product; with CUDA the same helper serves on the GPU;
- the entry-point shim on PYTHONPATH (the editable install may predate the entry point);
- the plugin's JSONL decision log, which the tests read (`Server.records`).
Every wait is bounded; `stop()` kills the whole process group.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topas_agents.server.sglang import launch, make_tiny_model
from topas_agents.workflow import load_workflow

STAND_IN = Path(__file__).parent / "kernel_stand_in"
STARTUP_TIMEOUT_S = 300.0  # measured 27-80 s to healthy on 2 shared cores


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log: Path
    output: Path
    model_dir: Path
    started_s: float  # seconds from spawn to healthy

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def records(self, event: str | None = None) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        out = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [r for r in out if event is None or r.get("event") == event]

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)  # the launcher forwards it to SGLang
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # SGLang's children, whatever is left
        self.proc.wait(timeout=10)


def serve_namespace(policy: str, workflows: list[str], port: int, decision_log: str,
                    kv_budget: int | None = None) -> argparse.Namespace:
    return argparse.Namespace(policy=policy, policy_opt=[], profile=None, workflow=workflows,
                              kv_budget=kv_budget, decision_log=decision_log, task_idle_timeout=300.0,
                              host="127.0.0.1", port=port, log_level=None, model_path=None)


def engine_args(model: Path, kv_tokens: int, extra_args: Sequence[str] = ()) -> list[str]:
    """SGLang's own arguments for the tiny model (`--device cpu` where there is no CUDA)."""
    device = [] if has_cuda() else ["--device", "cpu"]
    return ["--model-path", str(model), "--load-format", "dummy", "--max-total-tokens", str(kv_tokens),
            "--enable-cache-report", *device, *extra_args]


def serving_env(shim: Path) -> dict[str, str]:
    """What an SGLang server process needs on top of the caller's environment: offline
    Hugging Face, the entry-point shim, and on CPU the engine switch and the stand-in."""
    paths = [str(shim)] + ([] if has_cuda() else [str(STAND_IN)])
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH", "")] if p]),
            **({} if has_cuda() else {"SGLANG_USE_CPU_ENGINE": "1"})}


def start_server(tmp: Path, policy: str, *, workflows: list[str], kv_tokens: int,
                 extra_args: list[str] = (), kv_budget: int | None = None,
                 env_extra: dict[str, str] | None = None) -> Server:
    tmp.mkdir(parents=True, exist_ok=True)
    model = tmp / "model"
    if not (model / "config.json").exists():
        make_tiny_model.build(model)
    shim = launch.write_entry_point_shim(tmp / "shim")
    port = free_port()
    log = tmp / f"decisions-{policy}.jsonl"
    log.unlink(missing_ok=True)
    args = serve_namespace(policy, workflows, port, str(log), kv_budget)
    config = launch.build_config(args, {})
    cmd = launch.build_command(args, ["--", *engine_args(model, kv_tokens, extra_args)])
    env = launch.build_env(config, {**os.environ, **serving_env(shim), **(env_extra or {})})
    output = tmp / f"server-{policy}.log"
    t0 = time.monotonic()
    with open(output, "w") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = Server(proc, port, log, output, model, 0.0)
    try:
        wait_healthy(server, STARTUP_TIMEOUT_S)
    except BaseException:
        server.stop()
        raise
    server.started_s = time.monotonic() - t0
    return server


@contextlib.contextmanager
def module_server(tmp: Path, policy: str, **start: Any) -> Iterator[Server]:
    """One server per test module: the test workflow registered, its loaded Workflow and the
    model's tokenizer attached (`.workflow`, `.tokens`), stopped when the module is done."""
    wf = write_workflow(tmp)
    srv = start_server(tmp, policy, workflows=[str(wf)], **start)
    print(f"\nSGLang ({policy}) healthy after {srv.started_s:.1f} s")
    srv.workflow, srv.tokens = load_workflow(wf), Tokens(srv.model_dir)
    try:
        yield srv
    finally:
        srv.stop()


def wait_healthy(server: Server, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"SGLang exited during startup (rc {server.proc.returncode}):\n"
                               + server.text()[-4000:])
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"SGLang not healthy after {limit_s:.0f} s:\n" + server.text()[-4000:])


# ---------------------------------------------------------------------------- workload

# Three agents in a chain with small prefixes, sized for a KV pool of a few thousand tokens
# (the tiny model's tokenizer gives ~4.6 tokens per prompt word).
TINY_WORKFLOW = """\
name: tiny3
description: three agents in a chain, prefixes shrunk for the tiny CPU model
agents:
  - {name: a, prefix_tokens: 160}
  - {name: b, prefix_tokens: 160}
  - {name: c, prefix_tokens: 160}
stages:
  - {name: s1, agent: a, after: [], requests: 1, input_tokens: 60, output_tokens: 16}
  - {name: s2, agent: b, after: [s1], requests: 1, input_tokens: 60, output_tokens: 16}
  - {name: s3, agent: c, after: [s2], requests: 1, input_tokens: 60, output_tokens: 16}
"""
PREFIX_WORDS = 30  # ~160 tokens with the chat template
INPUT_WORDS = 12


def write_workflow(tmp: Path) -> Path:
    path = tmp / "tiny3.yaml"
    path.write_text(TINY_WORKFLOW)
    return path


class Tokens:
    """Exact prompt token counts with the served model's own tokenizer and chat template."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(model_dir))

    def chat(self, messages: list[dict[str, str]]) -> int:
        ids = self.tok.apply_chat_template(messages, tokenize=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def system(self, text: str) -> int:
        return self.chat([{"role": "system", "content": text}])


def plans(wf: Any, tokens: Tokens, n_tasks: int, output_tokens: int | dict[str, int],
          prefix: str = "t", ignore_eos: bool = True) -> list[dict]:
    """Labelled call plans for `n_tasks` tasks; `output_tokens` per call, or per stage."""
    from topas_agents.realbench.client import plan_task

    per_stage = output_tokens if isinstance(output_tokens, dict) else {}
    default = output_tokens if isinstance(output_tokens, int) else 8
    return [plan_task(wf, f"{prefix}{i}", prefix_words=lambda _a: PREFIX_WORDS, input_words=INPUT_WORDS,
                      output_tokens=lambda s: per_stage.get(s, default), prefix_tokens=tokens.system, seed=i,
                      ignore_eos=ignore_eos)
            for i in range(n_tasks)]


def check_decisions(records: list[dict[str, Any]]) -> tuple[int, int]:
    """Every admitted request of every logged decision ran in SGLang's prefill step or was
    deferred by it with a reason. Returns (#admitted that ran, #deferred)."""
    from topas_agents.server.sglang.apply import DEFER_REASONS

    known = set(DEFER_REASONS.values()) | {"batch_full", "not_attempted", "head_of_line"}
    ran = deferred = 0
    for d in records:
        if d.get("event") != "decision":
            continue
        admit = [a["rid"] for a in d["admit"]]
        went, left = set(d["sglang_admitted"]), d["deferred"]
        assert went <= set(admit), d  # SGLang never runs anything the policy did not admit
        assert set(admit) == went | set(left), d
        assert set(left.values()) <= known, d
        ran, deferred = ran + len(went), deferred + len(left)
    return ran, deferred


# ---------------------------------------------------------------------------- radix-tree probes


def probe_cached(server: Server, agent: str) -> int:
    """Cached prompt tokens of a fresh unlabelled call starting with `agent`'s prefix
    (SGLang's `--enable-cache-report`: what the radix tree held at admission)."""
    import httpx

    from topas_agents.realbench.client import agent_prompt

    body = {"model": "model", "max_tokens": 1, "messages": [
        {"role": "system", "content": agent_prompt("tiny3", agent, PREFIX_WORDS)},
        {"role": "user", "content": f"probe {time.monotonic()}"}]}
    resp = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)
    resp.raise_for_status()
    return int(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def prefix_len(tokens: Tokens, agent: str) -> int:
    """Prompt tokens of `agent`'s system prompt (its shared prefix) with the chat template."""
    from topas_agents.realbench.client import agent_prompt

    return tokens.system(agent_prompt("tiny3", agent, PREFIX_WORDS))


def flood_messages(tokens: Tokens, target: int) -> list[dict[str, str]]:
    """An unlabelled user message of `target` prompt tokens, or the fewest words above it."""
    def msg(n: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": "flood " + "cache " * n}]

    hi = 1
    while tokens.chat(msg(hi)) < target:
        hi *= 2
    lo = hi // 2  # tokens(lo) < target <= tokens(hi): smallest n with tokens(n) >= target
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if tokens.chat(msg(mid)) >= target else (mid, hi)
    return msg(hi)


def pins_after_flood(server: Server, tokens: Tokens, kv_tokens: int, prefix: int) -> tuple[set, set, dict]:
    """Send one unlabelled call that does not fit beside the three pinned prefixes (the
    policy must prefix_out one at least, SGLang must evict to fit it); returns (agents
    still pinned, agents the policy evicted, the last decision record)."""
    import httpx

    messages = flood_messages(tokens, kv_tokens - 3 * prefix + prefix // 2 - 4)  # + 4 output tokens
    before = len(server.records())
    resp = httpx.post(f"{server.base_url}/chat/completions", timeout=300,
                      json={"model": "model", "max_tokens": 4, "ignore_eos": True, "messages": messages})
    assert resp.status_code == 200, resp.text
    time.sleep(1.0)
    decisions = [d for d in server.records()[before:] if d["event"] == "decision"]
    out = {a for d in decisions for a in d["prefix_out"]}
    last = decisions[-1]
    pinned = {a for a, where in last["resident"].items() if where == "gpu" and a in ("a", "b", "c")}
    return pinned, out - pinned, last
