"""The selector bounds of `suite.selectors`, on hand-built suite documents."""

import gzip
import json

import pytest

from topas_agents.policies.forecast import switch_target
from topas_agents.suite.selectors import contract_scores, main, score_cells, summary

BASE = ("fcfs", "lpm", "parrot", "las", "spf")


def _point(core: tuple[float, float], lpm: tuple[float, float], parrot: tuple[float, float],
           core_name: str = "topas-core") -> dict:
    worse = {"mean_jct": 1000.0, "p99_jct": 1000.0}
    point = {b: dict(worse) for b in BASE}
    point["lpm"] = {"mean_jct": lpm[0], "p99_jct": lpm[1]}
    point["parrot"] = {"mean_jct": parrot[0], "p99_jct": parrot[1]}
    point[core_name] = {"mean_jct": core[0], "p99_jct": core[1]}
    return point


def _doc(seeds: dict[str, dict], core_name: str = "topas-core") -> dict:
    return {"policies": [*BASE, core_name], "loads": [0.5],
            "workflows": [{"name": "w", "runs": {s: {"0.5": p} for s, p in seeds.items()}}]}


def test_contract_score_is_the_larger_ratio_of_seed_averages():
    cell = {"1": _point((110, 90), (100, 100), (105, 95)), "2": _point((130, 110), (100, 100), (95, 105))}
    scores = contract_scores(cell, [*BASE, "topas-core"], BASE)
    # seed averages: core 120 / 100, lpm 100 / 100, parrot 100 / 100 -> core max(1.2, 1.0)
    assert scores["topas-core"] == pytest.approx(1.2)
    assert scores["lpm"] == pytest.approx(1.0) and scores["parrot"] == pytest.approx(1.0)


def test_the_margin_keeps_the_core_on_a_small_predicted_loss():
    scores = {"topas-core": 1.02, "lpm": 1.0, "parrot": 1.05}
    assert switch_target(scores, "topas-core", "topas-core", 0.03) == "topas-core"  # 1.0 >= 1.02 x 0.97
    assert switch_target(scores, "topas-core", "topas-core", 0.01) == "lpm"  # 1.0 < 1.02 x 0.99
    assert switch_target({"topas-core": 0.9, "lpm": 1.0}, "topas-core", "topas-core", 0.0) == "topas-core"


def test_expectation_pick_is_made_on_other_seeds_and_judged_on_these():
    # other seeds: the core 10% behind LPM in mean JCT; judged seeds: LPM 5% behind Parrot
    expected = _doc({"201": _point((110, 100), (100, 100), (104, 104)),
                     "202": _point((110, 100), (100, 100), (104, 104))})
    judged = _doc({"101": _point((108, 99), (105, 100), (100, 100), "topas"),
                   "102": _point((108, 99), (105, 100), (100, 100), "topas")}, core_name="topas")
    guard = {"workflows": [{"name": "w", "runs": {s: {"0.5": {"topas": {"mean_jct": 106.0, "p99_jct": 99.0}}}
                                                  for s in ("101", "102")}}]}
    [cell] = score_cells(judged, expected, guard, margin=0.03)
    assert cell.cell == "w@0.5" and cell.pick == "lpm"
    assert cell.pick_expected == pytest.approx(1.0)
    assert cell.pick_judged == pytest.approx(1.05) and cell.core == pytest.approx(1.08)
    assert cell.hindsight == pytest.approx(1.0) and cell.guard == pytest.approx(1.06)
    table = summary([cell])
    assert table["guard"] == {"losing": 1, "cells": 1, "max": pytest.approx(1.06)}
    assert table["hindsight"]["losing"] == 0


def test_cli_writes_json_and_fails_cleanly(tmp_path, capsys):
    doc = _doc({"1": _point((100, 100), (100, 100), (100, 100))})
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out.json"
    assert main([str(path), str(path), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["summary"]["core"]["losing"] == 0
    packed = tmp_path / "s.json.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert main([str(path), str(packed)]) == 0  # the committed many-seed documents are gzipped
    assert main([str(path), str(tmp_path / "missing.json")]) == 2
    assert "error:" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"policies": ["lpm"], "loads": [], "workflows": []}))
    assert main([str(bad), str(bad)]) == 2  # no core policy: a clear error, not a traceback
