"""`topas bench --suite random ... --recheck S,...`: losing cells rerun at extra seeds and
judged over every seed, by the suite's own per-load rule."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from topas_agents import policies
from topas_agents.errors import ConfigError
from topas_agents.snapshot import Decision
from topas_agents.suite import run_suite_cli
from topas_agents.suite.cli import config_from_args
from topas_agents.suite.ratios import per_load
from topas_agents.suite.runner import run_suite


class _OneAtATime:
    """Serves one request at a time, oldest first: slower than LPM on any workflow and load
    where LPM batches, so every cell of the tiny suite below loses."""

    name = "one-at-a-time"

    def decide(self, snap):
        if snap.running or not snap.waiting:
            return Decision()
        first = min(snap.waiting, key=lambda r: (r.task_arrival_s, r.arrival_s, r.rid))
        idle = tuple(p.agent for p in snap.prefixes if p.on_gpu and p.agent != first.agent)
        return Decision(admit=(first.rid,), prefix_out=idle)  # room for its prefix


def make_one_at_a_time(**_options):
    return _OneAtATime()


@pytest.fixture
def slow_policy(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(policies, "_REGISTRY", dict(policies._REGISTRY))  # registered in this test only
    policies.register_policy("one-at-a-time", f"{__name__}:make_one_at_a_time")
    return "one-at-a-time"


def _args(tmp: Path, **over) -> argparse.Namespace:
    base = dict(suite="random", workflows=1, worst_dir=None, seeds=(0,), seed=0, load=(0.5,), tasks=10,
                profile="a100-80g-qwen2.5-32b", kv_budget=None, policies=("lpm", "one-at-a-time"),
                json=str(tmp / "out.json"), no_progress=True, recheck=(1, 2))
    return argparse.Namespace(**{**base, **over})


def test_recheck_judges_losing_cells_over_every_seed(tmp_path: Path, slow_policy: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    args = _args(tmp_path)
    assert run_suite_cli(args) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    (cell,) = doc["recheck"]
    assert (cell["load"], cell["policy"], cell["seeds"]) == (0.5, slow_policy, [0, 1, 2])
    (workflow,) = doc["workflows"]
    assert cell["workflow"] == workflow["name"]
    for m in ("mean_jct", "p99_jct"):
        assert cell[m]["suite_ratio"] == workflow["per_load"][slow_policy][m][0]["ratio"]
    # The same cell judged by a suite run at all three seeds gives the same ratios.
    (whole,) = run_suite(replace(config_from_args(args), seeds=(0, 1, 2)))
    for m in ("mean_jct", "p99_jct"):
        (expected,) = per_load(whole.runs, slow_policy, m, ("lpm",))
        assert cell[m]["ratio"] == pytest.approx(expected.ratio, rel=1e-12)
        assert cell[m]["winner"] == "lpm"
        low, high = cell[m]["ci95"]
        assert low <= high
    assert cell["holds"] is True and cell["mean_jct"]["ratio"] > 1.02
    out = capsys.readouterr().out
    assert "losing cells rechecked at 2 more seeds (1,2)" in out
    assert "1 of 1 losing cells still lose over every seed" in out


def test_no_losing_cell_runs_nothing_more(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_suite_cli(_args(tmp_path, policies=("lpm", "lpm-gated"), load=(0.1,))) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    losing = [r for p in doc["workflows"][0]["per_load"].values() for m in p.values() for r in m
              if r["ratio"] > 1.02]
    assert doc["recheck"] == [] and not losing
    assert "no losing cell to recheck" in capsys.readouterr().out


def test_recheck_seeds_must_be_new_and_fail_before_the_suite(tmp_path: Path, slow_policy: str) -> None:
    with pytest.raises(ConfigError, match="--recheck seeds must differ from --seeds"):
        run_suite_cli(_args(tmp_path, seeds=(0, 1), recheck=(1, 3)))
    assert not (tmp_path / "out.json").exists()  # nothing ran
