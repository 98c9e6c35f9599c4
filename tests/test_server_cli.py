"""`topas serve` as a user runs it: a real process, a real port, Ctrl-C to stop."""

from __future__ import annotations

import importlib
import importlib.util
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from topas_agents.cli import main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(port: int, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "topas_agents.server", "--port", str(port), "--policy", "fcfs",
         "--workflow", "chain3", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server did not come up"
        time.sleep(0.1)


def test_topas_serve_sim_serves_and_stops_on_sigint() -> None:
    port = _free_port()
    proc = _serve(port, "--time-scale", "100", "--model-name", "sim-x", "--log-level", "warning")
    try:
        base = f"http://127.0.0.1:{port}"
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=10)
        assert client.models.list().data[0].id == "sim-x"
        r = client.chat.completions.create(model="sim-x", messages=[{"role": "user", "content": "hi"}],
                                           extra_body={"topas": {"task_id": "t", "stage": "s1", "agent": "a",
                                                                 "workflow": "chain3"}})
        assert r.choices[0].message.content == "Echo: hi" and r.usage.completion_tokens == 256
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out
        assert f"http://127.0.0.1:{port}/v1" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_second_ctrl_c_ends_the_drain_at_once_without_a_traceback() -> None:
    """uvicorn's forced exit (a second SIGINT) used to wait out the whole drain, then skip the
    app's shutdown: the cancelled lifespan logged a CancelledError traceback."""
    port = _free_port()
    proc = _serve(port, "--time-scale", "1", "--drain-timeout", "60")
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "topas": {"task_id": "t", "stage": "s1", "agent": "a", "workflow": "chain3"}}
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data:"))  # the call is in flight
            proc.send_signal(signal.SIGINT)
            time.sleep(0.5)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGINT)
            rest = [line for line in lines if line]
            out, _ = proc.communicate(timeout=20)
            waited = time.monotonic() - t0
        assert waited < 10, f"the forced exit still drained for {waited:.1f} s"
        assert "shut down before the request finished" in "".join(rest) and rest[-1] == "data: [DONE]"
        assert "Traceback" not in out and "CancelledError" not in out, out
        assert "Application shutdown complete" in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--time-scale", "0"], "--time-scale"),
        (["serve", "--workflow", "no-such-workflow"], "unknown workflow"),
        (["serve", "--policy", "no-such-policy"], "unknown policy"),
        (["serve", "--policy-opt", "novalue"], "key=value"),
        (["serve", "--policy", "fcfs", "--policy-opt", "x=1", "--port", "0"], "policy 'fcfs' has no option 'x'"),
        (["serve", "--kv-budget", "10", "--workflow", "chain3", "--port", "0"], "KV budget 10 tokens cannot hold stage"),
        (["serve", "--responder", "replay"], "--replay-file"),
        (["serve", "--responder", "replay", "--replay-file", "/nonexistent.jsonl"], "not found"),
        (["serve", "stray"], "unexpected arguments"),
        # 0 or fewer replicas took the one-server path and served one engine without a word
        (["serve", "--replicas", "0"], "argument --replicas"),
        (["serve", "--replicas", "-2"], "argument --replicas"),
        (["serve", "--replicas", "65"], "argument --replicas"),
        # a negative restart count was read as 0 (never restart) without a word
        (["serve", "--replicas", "2", "--replica-restarts", "-1"], "argument --replica-restarts"),
        # replica-only options with one server did nothing, without a word
        (["serve", "--router-policy", "agent"], "--router-policy applies to --replicas N (N > 1) only"),
        (["serve", "--log-dir", "logs"], "--log-dir applies to --replicas N (N > 1) only"),
    ],
)
def test_user_errors_are_one_line_exit_2(argv, message, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [
    ["serve", "--engine", "sglang", "--port", "18433"],
    ["bench", "--engine", "sglang", "--policies", "lpm,topas", "--tasks", "2"],
    ["serve", "--replicas", "2", "--engine", "sglang", "--port", "18533"],
], ids=["serve", "bench", "replicas"])
def test_engine_sglang_without_sglang_is_a_one_line_exit_2(argv, tmp_path, monkeypatch, capsys) -> None:
    """The plugin's entry point ships with topas-agents, so it says nothing about SGLang being
    installed: without SGLang every --engine sglang path stops before starting anything, with
    the install command, instead of a bare exit 1 from `python -m sglang.launch_server` or a
    traceback from the tokenizer import."""
    from topas_agents.server.sglang import config as sglang_config

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(sglang_config.importlib.util, "find_spec",
                        lambda name, *a: None if name == "sglang" else real_find_spec(name, *a))
    model = ["--model-path", str(tmp_path)]
    assert main(argv + (["--", *model] if "--replicas" in argv else model)) == 2
    err = capsys.readouterr().err
    expected = "error: --engine sglang needs sglang"
    if "--replicas" in argv and real_find_spec("smg") is None:  # a venv without the gateway: checked first
        expected = "error: --replicas needs SGLang's gateway"
    assert err.startswith(expected) and '.[sglang]' in err and err.count("\n") == 1


def test_a_busy_port_is_a_one_line_error_and_nothing_claims_to_serve(capsys) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc = main(["serve", "--engine", "sim", "--port", str(port)])
    captured = capsys.readouterr()
    assert rc == 2 and f"cannot listen on 127.0.0.1:{port}" in captured.err
    assert "serving" not in captured.out


def test_sglang_launcher_checks_the_decision_log_before_starting(tmp_path) -> None:
    # SGLang needs minutes to load a model before the plugin opens the log: refuse a path that
    # cannot be written at once (no SGLang is needed to check this)
    import argparse

    from topas_agents.errors import ConfigError
    from topas_agents.server.sglang import launch

    args = argparse.Namespace(policy="lpm", policy_opt=[], profile=None, workflow=[], kv_budget=None,
                              task_idle_timeout=300.0, decision_log=str(tmp_path))
    with pytest.raises(ConfigError, match="--decision-log .*is a directory"):
        launch.build_config(args, {})
    args.decision_log = str(tmp_path / "logs" / "d.jsonl")
    assert launch.build_config(args, {}).decision_log == args.decision_log


@pytest.mark.parametrize(("kv_budget", "extra"), [(4000, ()), (None, ("--max-total-tokens", "4000")),
                                                   (None, ("--max-total-tokens=4000",))])
def test_sglang_launcher_refuses_a_workflow_that_cannot_fit_its_known_budget(kv_budget, extra) -> None:
    # --engine sim refuses it at start; SGLang served it, and every forecast of the guard was NaN
    import argparse

    from topas_agents.errors import ConfigError
    from topas_agents.server.sglang import launch

    args = argparse.Namespace(policy="topas", policy_opt=[], profile=None, workflow=["chain3"], kv_budget=kv_budget,
                              task_idle_timeout=300.0, decision_log=None)
    config = launch.build_config(args, {})
    with pytest.raises(ConfigError, match="cannot hold stage 's1' of workflow 'chain3'"):
        launch.check_workflows_fit(config, ["--model-path", "m", *extra])
    # a pool big enough passes, and one sized from GPU memory at start-up is unknown here
    args.kv_budget = None
    launch.check_workflows_fit(launch.build_config(args, {}), ["--model-path", "m", "--max-total-tokens", "16000"])
    launch.check_workflows_fit(launch.build_config(args, {}), ["--model-path", "m"])


def test_sglang_launcher_errors_name_the_flag_the_user_typed() -> None:
    # they named only the environment variable SGLang's processes read (TOPAS_SGLANG_KV_BUDGET)
    import argparse

    from topas_agents.errors import ConfigError
    from topas_agents.server.sglang import launch

    base = dict(policy="lpm", policy_opt=[], profile=None, workflow=[], kv_budget=None, task_idle_timeout=300.0,
                decision_log=None)
    for change, flag in (({"kv_budget": 0}, "--kv-budget"), ({"task_idle_timeout": float("nan")}, "--task-idle-timeout"),
                         ({"policy": ""}, "--policy")):
        with pytest.raises(ConfigError, match=f"^{flag} \\(TOPAS_SGLANG_"):
            launch.build_config(argparse.Namespace(**{**base, **change}), {})
