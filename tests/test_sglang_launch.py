"""`topas serve --engine sglang` end to end up to where a CPU can go: the launcher starts the
real `sglang.launch_server`, whose main, scheduler and detokenizer processes each discover
the plugin entry point and register it from the environment. (The scheduler then fails to
load a model on CPU -- no vllm / CUDA kernels -- so serving itself needs the GPU smoke.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from typing import Any

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
pytest.importorskip("sglang")

from test_sglang_plugin import serve_args  # noqa: E402

from topas_agents.server.sglang import launch, make_tiny_model  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_sglang_processes_load_the_plugin(tmp_path: Any) -> None:
    shim = launch.write_entry_point_shim(tmp_path / "shim")
    model = make_tiny_model.build(tmp_path / "model")
    log = tmp_path / "decisions.jsonl"
    args = serve_args(policy="fcfs", workflow=["chain3"], port=free_port(), decision_log=str(log))
    config = launch.build_config(args, {})
    cmd = launch.build_command(args, ["--", "--model-path", str(model), "--load-format", "dummy",
                                      "--device", "cpu"])
    path = os.pathsep.join(p for p in (str(shim), os.environ.get("PYTHONPATH", "")) if p)
    env = launch.build_env(config, {**os.environ, "PYTHONPATH": path})
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=240)  # on CPU the scheduler dies at model load
    except subprocess.TimeoutExpired:  # a machine that can serve: stop it
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    loaded = [json.loads(line) for line in log.read_text().splitlines()]
    processes = {r["process"] for r in loaded}
    assert all(r["event"] == "loaded" and r["policy"] == "fcfs" and r["hooks"] == 9 for r in loaded)
    assert "MainProcess" in processes and len(processes) >= 2, output[-3000:]  # HTTP + scheduler (+ detok.)
    assert "Failed to apply hooks" not in output and "topas plugin:" not in output, output[-3000:]
