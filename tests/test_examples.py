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
                                                      "metagpt_stock.py", "softwaredev_eval.py"}


def test_labelled_pipeline(monkeypatch, capsys):
    _run(monkeypatch, "labelled_pipeline.py", "--tasks", "2", "--time-scale", "400")
    out = capsys.readouterr().out
    assert out.count("JCT") == 2 and out.count("label from body") == 6
    for stage, agent in (("plan", "planner"), ("code", "coder"), ("review", "reviewer")):
        assert out.count(f"{stage:<7} {agent:<9}") == 2


@pytest.mark.metagpt
@needs_metagpt
def test_metagpt_config_swap(monkeypatch, capsys, tmp_path):
    _run(monkeypatch, "metagpt_config_swap.py", "--root", str(tmp_path / "mg"), "--time-scale", "400")
    out = capsys.readouterr().out
    assert "config file" in out and out.count("success=True calls=7") == 2
    assert "server A (fcfs) saw tasks ['swap-a']" in out and "server B (topas) saw tasks ['swap-b']" in out


@pytest.mark.metagpt
@needs_metagpt
def test_softwaredev_eval(monkeypatch, capsys, tmp_path):
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
