"""The shipped MetaGPT traces (datasets/traces) load and replay in `topas bench --trace`;
trace naming keeps traces of failed or partial tasks loadable."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from topas_agents.bench.trace import load_trace
from topas_agents.cli import main
from topas_agents.integrations.metagpt.recorder import CallRecord, trace_workflow_name, write_trace
from topas_agents.workflow import load_workflow

TRACES = Path(__file__).resolve().parent.parent / "datasets" / "traces"
SOP_STAGES = ("write_prd", "write_design", "write_tasks", "write_code")


def test_sop_trace_replays_as_the_observed_chain():
    plans = load_trace(TRACES / "metagpt-sop-echo.jsonl")
    assert len(plans) == 3
    for p in plans:
        assert p.workflow.name == "metagpt-sop-noqa" and p.workflow.topo_order == SOP_STAGES
        assert [len(p.rounds[s]) for s in SOP_STAGES] == [1, 1, 1, 4]
        assert {a.name for a in p.workflow.agents} == {"product_manager", "architect", "project_manager",
                                                       "engineer"}


def test_tl_trace_replays_on_the_builtin_tl_workflow():
    plans = load_trace(TRACES / "metagpt-tl-echo.jsonl")
    builtin = load_workflow("metagpt-tl")
    assert len(plans) == 3
    for p in plans:
        assert p.workflow.name == "metagpt-tl" and p.workflow.topo_order == builtin.topo_order
        assert sum(len(r) for r in p.rounds.values()) == 12
        # recorded prefix sizes replace the workflow's estimates
        assert p.workflow.prefix_tokens("team_leader") != builtin.prefix_tokens("team_leader")


@pytest.mark.parametrize("name", ["metagpt-sop-echo.jsonl", "metagpt-tl-echo.jsonl"])
def test_topas_bench_replays_the_shipped_traces(name, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--trace", str(TRACES / name), "--policies", "fcfs,topas", "--rate", "0.02",
                 "--no-progress", "--json", str(out)]) == 0
    assert "fcfs" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["tasks"] == 3 and doc["workload"] == name
    (point,) = doc["points"]
    assert set(point["results"]) == {"fcfs", "topas"}
    for res in point["results"].values():  # every replayed task finished, no faster than the bound
        assert res["mean_jct"] >= point["lower_bound"]["mean_jct"] * (1 - 1e-9) > 0


def _rec(task: str, stage: str, agent: str, rnd: int = 0) -> CallRecord:
    return CallRecord(task, "metagpt-tl", stage, agent, rnd, 100, 50, 20, float(rnd), float(rnd) + 1.0, None)


def test_partial_tasks_of_a_builtin_workflow_get_a_partial_name_and_still_load(tmp_path):
    assert trace_workflow_name("metagpt-tl", ["tl1", "write_prd"]) == "metagpt-tl-partial"
    assert trace_workflow_name("metagpt-sop-noqa", ["write_prd"]) == "metagpt-sop-noqa"
    assert trace_workflow_name(None, ["x"]) is None
    buf = io.StringIO()
    assert write_trace(buf, [_rec("t1", "tl1", "team_leader"), _rec("t1", "write_prd", "product_manager")]) == 2
    path = tmp_path / "partial.jsonl"
    path.write_text(buf.getvalue())
    (plan,) = load_trace(path)
    assert plan.workflow.name == "metagpt-tl-partial" and plan.workflow.topo_order == ("tl1", "write_prd")
