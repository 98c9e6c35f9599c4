"""Every example in examples/ runs (in-process, small limits) and prints what it promises."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from topas_agents.integrations.metagpt.environment import metagpt_available

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
needs_metagpt = pytest.mark.skipif(not metagpt_available(), reason="metagpt is not installed")


def _run(monkeypatch, name: str, *argv: str) -> None:
    """Run an example as `python examples/NAME ARGV...`; returns when it exits 0."""
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / name), *argv])
    try:
        runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    except SystemExit as exc:  # examples exit through run_module: always SystemExit
        if exc.code not in (0, None):
            raise


def _fails(monkeypatch, capsys, code: int, name: str, *argv: str) -> str:
    """Run an example that must stop with exit status `code` (2: bad input, 1: the run failed,
    as `topas`); its stderr."""
    with pytest.raises(SystemExit) as exc:
        _run(monkeypatch, name, *argv)
    err = capsys.readouterr().err
    assert exc.value.code == code, err
    return err


def test_every_example_is_tested():
    assert {p.name for p in EXAMPLES.glob("*.py")} == {"labelled_pipeline.py", "metagpt_config_swap.py",
                                                      "metagpt_stock.py", "softwaredev_eval.py",
                                                      "autogen_tool_agent.py", "crewai_tool_crew.py",
                                                      "my_policy.py"}


def test_my_policy_runs_alone_and_by_its_path_in_the_bench(monkeypatch, capsys, tmp_path):
    _run(monkeypatch, "my_policy.py")
    assert "sif on dag4: mean JCT" in capsys.readouterr().out
    from topas_agents.cli import main

    monkeypatch.chdir(EXAMPLES)  # as the docs run it: from examples/
    out = tmp_path / "sif.json"
    assert main(["bench", "--workload", "dag4", "--policies", "lpm,my_policy:ShortestInputFirst",
                 "--policy-opt", "my_policy:ShortestInputFirst.max_batch=8", "--tasks", "12", "--load", "0.5",
                 "--no-progress", "--json", str(out)]) == 0
    import json

    doc = json.loads(out.read_text())
    assert doc["policy_options"] == {"my_policy:ShortestInputFirst": {"max_batch": "8"}}
    assert set(doc["points"][0]["results"]) == {"lpm", "my_policy:ShortestInputFirst"}


@pytest.mark.parametrize(("name", "module", "hint"), [
    ("autogen_tool_agent.py", "autogen_agentchat", "pip install autogen-agentchat"),
    ("crewai_tool_crew.py", "crewai", "pip install crewai"),
])
def test_tool_examples_say_what_to_install(monkeypatch, name, module, hint):
    """The frameworks live in their own venvs (MetaGPT's pins): here the examples must stop with
    the install hint and a failing exit code. With the framework installed they run for real in
    tests/test_framework_recipes.py."""
    import importlib.util

    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed: tests/test_framework_recipes.py runs the recipe")
    with pytest.raises(SystemExit) as exc:
        _run(monkeypatch, name, "--base-url", "http://127.0.0.1:9/v1")
    assert isinstance(exc.value.code, str) and hint in exc.value.code  # sys.exit(msg): exit status 1


def test_labelled_pipeline(monkeypatch, capsys):
    _run(monkeypatch, "labelled_pipeline.py", "--tasks", "2", "--time-scale", "400")
    out = capsys.readouterr().out
    assert out.count("JCT") == 2 and out.count("label from body") == 6
    for stage, agent in (("plan", "planner"), ("code", "coder"), ("review", "reviewer")):
        assert out.count(f"{stage:<7} {agent:<9}") == 2


@pytest.mark.metagpt
@needs_metagpt
def test_metagpt_config_swap(monkeypatch, capsys, tmp_path):
    """Against a running server A (as `topas serve` would be): the config file it leaves points
    at A, which still answers, and a second run against the same A works too."""
    from topas_agents.integrations.metagpt.config_file import read_config
    from topas_agents.integrations.metagpt.server_api import embedded_server, probe_server

    root = tmp_path / "mg"
    with embedded_server(policy="fcfs", time_scale=400) as a:
        for _ in range(2):
            _run(monkeypatch, "metagpt_config_swap.py", "--base-url", a.url, "--root", str(root),
                 "--time-scale", "400")
            out = capsys.readouterr().out
            assert f"llm.base_url = {a.url}" in out and out.count("success=True calls=7") == 2
            assert "server A (fcfs) saw this run's tasks ['swap-a-" in out
            assert "server B (topas) saw this run's tasks ['swap-b-" in out
            assert out.count("(templates from the simulated engine's echo responder, not real code)") == 2
        assert read_config(root)["llm"]["base_url"] == a.url
        probe_server(read_config(root)["llm"]["base_url"])  # the written endpoint is alive


def test_metagpt_config_swap_without_a_server_says_how_to_start_one(monkeypatch, capsys, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    err = _fails(monkeypatch, capsys, 2, "metagpt_config_swap.py", "--base-url", dead, "--root", str(tmp_path / "mg"))
    assert "cannot reach the server" in err and "start server A first: topas serve --port 8000" in err
    assert not (tmp_path / "mg").exists()  # nothing written for a dead endpoint


@pytest.fixture
def keyed_server():
    """A server started with an API key (`topas serve --api-key KEY`): the key, the handle."""
    from topas_agents.server import ServerConfig, start_server_in_thread

    key = "example-key"
    handle = start_server_in_thread(ServerConfig(time_scale=400.0, api_keys=(key,), port=0,
                                                 task_idle_timeout_s=0.0))
    try:
        yield key, handle
    finally:
        handle.stop()


def test_metagpt_config_swap_without_the_servers_key_says_so(monkeypatch, capsys, tmp_path, keyed_server):
    """A refused key is not a missing server: the error names the flag the example takes, and
    not the command that starts server A."""
    monkeypatch.delenv("TOPAS_API_KEY", raising=False)
    _, server = keyed_server
    err = _fails(monkeypatch, capsys, 2, "metagpt_config_swap.py", "--base-url", server.url,
                 "--root", str(tmp_path / "mg"))
    assert "refused a call without an API key (give --api-key KEY or set TOPAS_API_KEY)" in err
    assert "start server A first" not in err and not (tmp_path / "mg").exists()


@pytest.mark.metagpt
@needs_metagpt
@pytest.mark.parametrize("how", ["--api-key", "TOPAS_API_KEY"])
def test_metagpt_config_swap_with_a_keyed_server(monkeypatch, capsys, tmp_path, keyed_server, how):
    """The key, given either way, reaches every call to A: the probe, the workflow upload, the
    MetaGPT calls, the stats; and the config file left for MetaGPT scripts carries it."""
    from topas_agents.integrations.metagpt.config_file import read_config

    key, server = keyed_server
    argv = ["--base-url", server.url, "--root", str(tmp_path / "mg"), "--time-scale", "400"]
    if how == "--api-key":
        monkeypatch.delenv("TOPAS_API_KEY", raising=False)
        argv += ["--api-key", key]
    else:
        monkeypatch.setenv("TOPAS_API_KEY", key)
    _run(monkeypatch, "metagpt_config_swap.py", *argv)
    out = capsys.readouterr().out
    assert out.count("success=True calls=7") == 2 and "server A (topas) saw this run's tasks ['swap-a-" in out
    assert read_config(tmp_path / "mg")["llm"]["api_key"] == key


@needs_metagpt
@pytest.mark.parametrize(("argv", "why"), [
    (["--limit", "0"], "--limit must be >= 1"),
    (["--limit", "1", "--policies", "nope"], "unknown policy 'nope'"),
    (["--limit", "1", "--rate", "0"], "--rate must be a positive number"),
])
def test_softwaredev_eval_bad_input_is_one_line(monkeypatch, capsys, tmp_path, argv, why):
    err = _fails(monkeypatch, capsys, 2, "softwaredev_eval.py", *argv, "--root", str(tmp_path))
    assert err.startswith("error: ") and why in err and err.count("\n") == 1  # one line, no traceback


@pytest.mark.parametrize(("argv", "why"), [
    (["--time-scale", "0"], "error: --time-scale must be a positive number"),
    (["--tasks", "0"], "argument --tasks: expected a positive integer"),  # ran nothing and exited 0
    (["--tasks", "-1"], "argument --tasks: expected a positive integer"),
])
def test_labelled_pipeline_bad_input_is_an_error(monkeypatch, capsys, argv, why):
    err = _fails(monkeypatch, capsys, 2, "labelled_pipeline.py", *argv)
    assert why in err and "Traceback" not in err


def _fake_framework(monkeypatch, modules: dict[str, dict]) -> None:
    """Stand-ins for a framework this venv lacks: each module with the names the example imports
    (constructors that do nothing), so the example reaches its first call to the server."""
    import types

    for name, attrs in modules.items():
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # parents too: `from a.b import X` imports `a` first
            monkeypatch.setitem(sys.modules, ".".join(parts[:i]),
                                sys.modules.get(".".join(parts[:i]), types.ModuleType(".".join(parts[:i]))))
        for attr, value in attrs.items():
            monkeypatch.setattr(sys.modules[name], attr, value, raising=False)


def _crewai_stand_ins() -> dict[str, dict]:
    from typing import Generic, TypeVar

    req, rsp = TypeVar("req"), TypeVar("rsp")

    class BaseInterceptor(Generic[req, rsp]):
        pass

    nothing = lambda *a, **k: None  # noqa: E731
    return {"crewai": {"LLM": nothing, "Agent": nothing, "Crew": nothing, "Task": nothing},
            "crewai.llms.hooks.base": {"BaseInterceptor": BaseInterceptor},
            "crewai.tools": {"tool": lambda name: (lambda f: f)}}


def _autogen_stand_ins() -> dict[str, dict]:
    nothing = lambda *a, **k: None  # noqa: E731
    return {"autogen_agentchat.agents": {"AssistantAgent": nothing},
            "autogen_ext.models.openai": {"OpenAIChatCompletionClient": nothing}}


@pytest.mark.parametrize(("name", "stand_ins"), [("autogen_tool_agent.py", _autogen_stand_ins),
                                                 ("crewai_tool_crew.py", _crewai_stand_ins)])
def test_tool_examples_without_a_server_fail_in_one_line(monkeypatch, capsys, name, stand_ins):
    """Nothing listening at --base-url: `error: ...` and exit 1 (the run failed), not a traceback."""
    import socket

    _fake_framework(monkeypatch, stand_ins())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    err = _fails(monkeypatch, capsys, 1, name, "--base-url", dead)
    assert err.startswith("error: ConnectError") and err.count("\n") == 1


@pytest.mark.metagpt
@needs_metagpt
def test_softwaredev_eval(monkeypatch, capsys, tmp_path):
    # its status says whether every task succeeded (it was always 0): _run returns only on 0
    _run(monkeypatch, "softwaredev_eval.py", "--workflow", "tl", "--limit", "1", "--policies", "fcfs,topas",
         "--time-scale", "400", "--root", str(tmp_path))
    out = capsys.readouterr().out
    assert out.startswith("policy") and out.count(" ok") >= 2 and "FAILED" not in out


@pytest.mark.metagpt
@needs_metagpt
def test_metagpt_stock(monkeypatch, capsys, tmp_path):
    _run(monkeypatch, "metagpt_stock.py", "--root", str(tmp_path / "mg"), "--time-scale", "400")
    out = capsys.readouterr().out
    assert out.count("done=True (explicit)") == 1
    for stage, agent in (("write_prd", "product_manager"), ("write_design", "architect"),
                         ("write_tasks", "project_manager"), ("write_code", "engineer")):
        assert f"call {stage:<12} {agent:<16} label from body" in out
    assert "label from none" not in out
