"""A fresh SGLang server per benchmarked policy, through the product launcher.

`start_sglang(policy, model_path, workload, kv_tokens, engine_args, scale)` writes the
workload scaled to the run's sizes (so the plugin's declared prefix sizes match the prompts),
starts `python -m sglang.launch_server` exactly as `topas serve --engine sglang` would, with
the decision log on, and waits for /health. Nothing here is CPU-specific: serving on CPU
needs `--engine-arg=--device --engine-arg=cpu` and the environment in docs/sglang.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..workflow import Workflow, workflow_mapping

STARTUP_TIMEOUT_S = 600.0  # 25-120 s measured on 2 shared CPU cores; a GPU start includes graphs


@dataclass
class LaunchedServer:
    proc: subprocess.Popen
    port: int
    decision_log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def log_counts(self) -> dict[str, int]:
        """decisions, preemptions (policy preempts + SGLang retractions) and plugin errors."""
        counts = {"decisions": 0, "preemptions": 0, "errors": 0}
        if self.decision_log.exists():
            for line in self.decision_log.read_text().splitlines():
                event = json.loads(line).get("event")
                key = {"decision": "decisions", "retracted": "preemptions", "error": "errors"}.get(event)
                if key:
                    counts[key] += 1
        return counts

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def scaled_workflow(wf: Workflow, scale: float) -> dict:
    """`wf`'s mapping with prefix, input and output sizes times `scale` (at least 1 token each;
    prefixes at least 0). Unscaled it is `wf`'s own definition, so a server that already holds
    the workflow takes the bench's registration as a repeat."""
    def scaled(value: int | list[int]) -> list[int]:
        lo, hi = (value, value) if isinstance(value, int) else value
        return [max(1, round(lo * scale)), max(1, round(hi * scale))]

    data = workflow_mapping(wf)
    if scale == 1:
        return data
    return {**data, "description": f"{wf.name} scaled by {scale}",
            "agents": [{**a, "prefix_tokens": max(0, round(a["prefix_tokens"] * scale))} for a in data["agents"]],
            "stages": [{**st, "input_tokens": scaled(st["input_tokens"]), "output_tokens": scaled(st["output_tokens"])}
                       for st in data["stages"]]}


def start_sglang(policy: str, model_path: str, wf: Workflow, kv_tokens: int, engine_args: Sequence[str],
                 scale: float) -> LaunchedServer:
    from ..server.sglang import launch

    work = Path(tempfile.mkdtemp(prefix=f"realbench-{policy}-"))
    wf_path = work / f"{wf.name}.yaml"
    wf_path.write_text(yaml.safe_dump(scaled_workflow(wf, scale), sort_keys=False))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = argparse.Namespace(policy=policy, policy_opt=[], profile=None, workflow=[str(wf_path)], kv_budget=None,
                              decision_log=str(work / "decisions.jsonl"), task_idle_timeout=300.0,
                              host="127.0.0.1", port=port, log_level=None,
                              model_path=str(Path(model_path).resolve()))  # the server runs in `work`
    config = launch.build_config(args, {})
    launch.check_workflows_fit(config, ["--max-total-tokens", str(kv_tokens)])  # as `topas serve` does
    cmd = launch.build_command(args, ["--", "--max-total-tokens", str(kv_tokens), *engine_args])
    with open(work / "server.log", "w") as out:
        proc = subprocess.Popen(cmd, env=launch.build_env(config), cwd=work, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = LaunchedServer(proc, port, work / "decisions.jsonl")
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"realbench: SGLang ({policy}) exited during startup; see {work / 'server.log'}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/health",
                                                                  timeout=5) as r:
            if r.status == 200:
                return server
        time.sleep(1.0)
    server.stop()
    raise SystemExit(f"realbench: SGLang ({policy}) not healthy after {STARTUP_TIMEOUT_S:.0f} s")
