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
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / name), *argv])
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")


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


def test_metagpt_config_swap_without_a_server_says_how_to_start_one(monkeypatch, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    with pytest.raises(SystemExit) as exc:
        _run(monkeypatch, "metagpt_config_swap.py", "--base-url", dead, "--root", str(tmp_path / "mg"))
    assert "cannot reach the server" in str(exc.value) and "topas serve --port 8000" in str(exc.value)
    assert not (tmp_path / "mg").exists()  # nothing written for a dead endpoint


@pytest.mark.metagpt
@needs_metagpt
def test_softwaredev_eval(monkeypatch, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:  # its status says whether every task succeeded (it was always 0)
        _run(monkeypatch, "softwaredev_eval.py", "--workflow", "tl", "--limit", "1", "--policies", "fcfs,topas",
             "--time-scale", "400", "--root", str(tmp_path))
    assert exc.value.code == 0
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
